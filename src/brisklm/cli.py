"""The ``brisklm`` command: generate and chat from the terminal, serve OpenAI's API, quantize
checkpoints."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import io
import json
import logging
import os
import re
import shlex
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from brisklm import __version__
from brisklm.command import (
    REPORTED_ERRORS,
    CommandParser,
    Terminated,
    run_command,
)
from brisklm.speculative.draft_length import DEFAULT_NUM_SPECULATIVE_TOKENS
from brisklm.speed import DECODE_PROMPT_TOKENS


class CliError(Exception):
    """A user-facing error: printed as one line, no traceback."""


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="model directory (default: the bundled brisk-chat model)")
    group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    group.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="default: float32 arithmetic on CPU (a bfloat16/float16 checkpoint keeps its weights, "
        "widened exactly as read), bfloat16 on CUDA",
    )
    group.add_argument(
        "--kv-cache-dtype",
        default=None,
        choices=["auto", "float32", "bfloat16", "float16"],
        help=(
            "KV cache dtype (default, auto: the --dtype asked for; without it float32 on CPU, "
            "even for a bfloat16 checkpoint, bfloat16 on CUDA)"
        ),
    )
    group.add_argument("--max-seq-len", type=int, default=None, help="context length to allocate")
    group.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        help="on CUDA, run decode steps eagerly instead of replaying CUDA graphs",
    )
    group.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="reuse no earlier prompt's keys and values (by default chat reuses the earlier "
        "turns')",
    )
    group.add_argument(
        "--max-decode-steps",
        type=int,
        default=8,
        help="decode steps a call of the native CPU kernels, greedy or sampled (default 8; 1: the "
        "text a token at a time)",
    )
    group.add_argument(
        "--threads",
        type=int,
        default=None,
        help=(
            "CPU threads at most (default: one per core; the engine runs fewer while other "
            "processes keep cores busy)"
        ),
    )
    group.add_argument(
        "--draft",
        default=None,
        help="speculative decoding: a draft model directory, 'default' (the bundled draft) or 'ngram'",
    )
    group.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help=f"with --draft: most tokens proposed per step (default {DEFAULT_NUM_SPECULATIVE_TOKENS})",
    )
    group.add_argument(
        "--draft-length",
        default=None,
        choices=["adaptive", "fixed"],
        help="adaptive (default with a draft model): propose more tokens while they are accepted, "
        "fewer while most are rejected; fixed (default with ngram): always --num-speculative-tokens",
    )


# Sampling flags left unset take the model's generation_config.json value, else these.
_MODEL_DEFAULTED = {
    "max_tokens": 256,
    "temperature": 0.7,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}
_FROM_MODEL = "(default: the model's generation_config.json, else {})"


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    defaults = {name: _FROM_MODEL.format(value) for name, value in _MODEL_DEFAULTED.items()}
    group.add_argument("--max-tokens", type=int, default=None, help=defaults["max_tokens"])
    group.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy " + defaults["temperature"]
    )
    group.add_argument("--top-k", type=int, default=None, help="0 = off " + defaults["top_k"])
    group.add_argument("--top-p", type=float, default=None, help=defaults["top_p"])
    group.add_argument("--min-p", type=float, default=None, help=defaults["min_p"])
    group.add_argument(
        "--repetition-penalty", type=float, default=None, help=defaults["repetition_penalty"]
    )
    group.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        help="subtracted from the logit of every token already out, in [-2, 2] (0)",
    )
    group.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="subtracted per time a token is already out, in [-2, 2] (0)",
    )
    group.add_argument(
        "--seed", type=int, default=None, help="makes sampling reproducible (default: none)"
    )
    group.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    group.add_argument("--ignore-eos", action="store_true")
    group.add_argument(
        "--thinking-token-budget",
        type=int,
        default=None,
        metavar="N",
        help="a reasoning model's thinking block holds at most N tokens, then its closing tag "
        "is forced (default: unbounded)",
    )
    constraint = parser.add_argument_group("constrained output (at most one)")
    constraint.add_argument(
        "--json-schema", help="JSON Schema: a file path or the JSON text itself"
    )
    constraint.add_argument("--json", action="store_true", help="any JSON object")
    constraint.add_argument("--regex", help="the output must match this regex")
    constraint.add_argument("--choice", action="append", help="one allowed output (repeatable)")
    constraint.add_argument("--grammar", help="a grammar file: Lark, or GBNF if it ends in .gbnf")
    constraint.add_argument(
        "--grammar-syntax",
        choices=["lark", "gbnf"],
        help="the --grammar file's syntax, whatever its name (a pipe's has no suffix)",
    )


class _Parser(CommandParser):
    """The CLI's parser (its usage errors one line, exit status 1: ``CommandParser``).
    Subcommand parsers are of this class too."""

    commands: argparse._SubParsersAction[_Parser]  # the subcommands (build_parser)

    def hint(self, message: str) -> str:
        if self.prog.endswith(" generate") and "ignored explicit argument" in message:
            # `brisklm generate -hello` read -h (help) with the argument "ello"
            return " (a prompt that begins with '-' goes after '--': brisklm generate -- '-hello')"
        return ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="brisklm", description="Fast local LLM inference.")
    parser.add_argument("--version", action="version", version=f"brisklm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    parser.commands = commands

    generate = commands.add_parser("generate", help="complete a prompt, streaming to stdout")
    generate.add_argument(
        "prompt",
        nargs="?",
        help="the prompt text ('-', or none with stdin a pipe or file, reads it from stdin, less "
        "the one newline that ends a file or echo's output)",
    )
    _add_model_args(generate)
    _add_sampling_args(generate)
    generate.add_argument(
        "--usage", action="store_true", help="print token usage to stderr at the end"
    )

    chat = commands.add_parser("chat", help="interactive chat using the model's chat template")
    _add_model_args(chat)
    _add_sampling_args(chat)
    chat.add_argument("--system", default=None, help="system message")
    chat.add_argument(
        "--template-var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a chat template variable (repeatable), VALUE read as JSON where it is JSON, else "
        "as text: --template-var enable_thinking=false (Qwen3)",
    )

    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (needs: pip install 'brisklm[server]')",
        description="Serve the model over OpenAI's API: /v1/chat/completions (tools, "
        "tool_choice, response_format, logprobs, streaming), /v1/completions, /v1/models, "
        "/v1/models/{id}, vLLM's /tokenize and /detokenize, /health and /metrics "
        "(Prometheus). Requests are batched together, up to --max-batch-size at once.",
    )
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")
    serve.add_argument(
        "--max-batch-size", type=int, default=8, help="requests decoded together at most (8)"
    )
    serve.add_argument(
        "--prefix-cache-slots",
        type=int,
        default=0,
        help="KV cache slots beyond --max-batch-size that only keep finished requests' "
        "prefixes, so more conversations than run at once keep their history's keys (0)",
    )
    serve.add_argument(
        "--prefill-chunk-size",
        type=int,
        default=None,
        help="the most prompt tokens a request feeds per forward pass (default: 512 on CPU, "
        "2048 on CUDA; off the native CPU pass prefixes are reused in whole chunks, so a smaller "
        "one reuses more of shorter prompts)",
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get("BRISKLM_API_KEY"),
        help="the key every route but /health wants (Authorization: Bearer KEY; default: "
        "$BRISKLM_API_KEY, else none checked)",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the model's name in the API (default: the model directory's name, or brisk-chat)",
    )

    bench = commands.add_parser(
        "bench",
        help="measure the model's prefill and decode speed on this machine",
        description="Measure how fast the model prefills a prompt and decodes at each batch size "
        "here (greedy, eos ignored, prefix caching off; the best of --repeats runs).",
    )
    _add_model_args(bench)
    bench.add_argument(
        "--prompt-tokens", type=int, default=512, help="the prefilled prompt's tokens (512)"
    )
    bench.add_argument(
        "--new-tokens",
        type=int,
        default=64,
        help=f"tokens decoded a row, after a prompt of {DECODE_PROMPT_TOKENS} tokens (64)",
    )
    bench.add_argument(
        "--batch-sizes", default="1,8", help="decode batch sizes, comma-separated (1,8)"
    )
    bench.add_argument("--repeats", type=int, default=3, help="runs of each, the best kept (3)")
    bench.add_argument(
        "--json", dest="as_json", action="store_true", help="print the figures as one JSON object"
    )

    quantize = commands.add_parser(
        "quantize",
        help="quantize a float checkpoint to GPTQ int4",
        description="Quantize a float checkpoint to GPTQ int4 (4-bit, v1 format) and write a "
        "checkpoint in the layout auto-gptq, GPTQModel and transformers read.",
    )
    quantize.add_argument("--model", required=True, help="float checkpoint directory")
    quantize.add_argument(
        "--out", required=True, help="output directory (must not exist or be empty)"
    )
    quantize.add_argument(
        "--method",
        default="gptq",
        choices=["gptq", "rtn"],
        help="gptq (default) or round-to-nearest",
    )
    quantize.add_argument(
        "--group-size",
        type=int,
        default=128,
        help="columns per scale: -1 (one group a row) or a multiple of 32 (128)",
    )
    quantize.add_argument(
        "--act-order",
        action="store_true",
        help="quantize columns in order of decreasing activation",
    )
    sym = quantize.add_mutually_exclusive_group()
    sym.add_argument(
        "--sym", dest="sym", action="store_true", default=True, help="symmetric (default)"
    )
    sym.add_argument("--asym", dest="sym", action="store_false", help="asymmetric zero points")
    quantize.add_argument(
        "--calibration",
        default=None,
        help="text file, one sample per paragraph or line (default: built-in text)",
    )
    quantize.add_argument(
        "--num-samples", type=int, default=128, help="calibration sequences (128)"
    )
    quantize.add_argument(
        "--seq-len", type=int, default=512, help="tokens per calibration sequence (512)"
    )
    quantize.add_argument(
        "--batch-size", type=int, default=4, help="sequences per forward pass (4)"
    )
    quantize.add_argument(
        "--damp",
        type=float,
        default=0.01,
        help="Hessian dampening, a fraction of its mean diagonal (0.01)",
    )
    quantize.add_argument(
        "--quantize-lm-head",
        action="store_true",
        help="quantize the output layer too (brisklm and GPTQModel read such a head; auto-gptq "
        "and transformers do not: they expect a float lm_head)",
    )
    quantize.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    return parser


def _json_schema(value: str) -> Any:
    """--json-schema's value: a file holding JSON, or the JSON text itself."""
    path = Path(value)
    try:  # "" is no path (Path("") is the current directory)
        is_dir = bool(value) and path.is_dir()
        is_file = bool(value) and not is_dir and path.exists()  # a pipe (<(...)) is read too
    except OSError:  # not a name the system takes: JSON text longer than a file name can be
        is_file = is_dir = False
    if is_dir:
        raise CliError(
            f"--json-schema {value!r} is a directory: give a schema file or the schema's JSON text"
        )
    try:
        text = path.read_text(encoding="utf-8") if is_file else None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--json-schema file {value!r} cannot be read ({exc})") from None
    try:
        return json.loads(value if text is None else text)
    except json.JSONDecodeError as exc:
        if text is not None:
            raise CliError(
                f"--json-schema file {value!r} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                f"column {exc.colno}"
            ) from None
        raise CliError(
            f"--json-schema is neither a file nor valid JSON text ({exc}); give a path to a "
            "schema file or the schema itself"
        ) from None


# The constraint options of SamplingParams and their flags.
_CONSTRAINT_FLAGS = {
    "json_schema": "--json-schema",
    "json_object": "--json",
    "regex": "--regex",
    "choice": "--choice",
    "grammar": "--grammar",
}


def _constraint_options(args: argparse.Namespace) -> dict[str, Any]:
    """The constraint flags' SamplingParams options, their files read once (a pipe reads once)."""
    if hasattr(args, "constraint_options"):
        return args.constraint_options
    options: dict[str, Any] = {}
    if args.json_schema is not None:  # an empty value is an error below, not "no schema"
        options["json_schema"] = _json_schema(args.json_schema)
    if args.json:
        options["json_object"] = True
    if args.regex is not None:  # "" allows only the empty output, as in the API
        options["regex"] = args.regex
    if args.choice:
        options["choice"] = args.choice
    if args.grammar is not None:
        path = Path(args.grammar)
        if path.is_dir() or not path.exists():  # a pipe (<(...), /dev/stdin) is read too
            what = "is a directory" if path.is_dir() else "does not exist"
            raise CliError(f"--grammar file {args.grammar!r} {what}")
        try:
            options["grammar"] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CliError(
                f"--grammar file {args.grammar!r} is not UTF-8 text ({exc.reason})"
            ) from None
        by_suffix = "gbnf" if path.suffix.lower() == ".gbnf" else "lark"
        options["grammar_syntax"] = args.grammar_syntax or by_suffix
    elif args.grammar_syntax is not None:
        raise CliError("--grammar-syntax needs --grammar (the grammar file it describes)")
    given = [flag for option, flag in _CONSTRAINT_FLAGS.items() if option in options]
    if len(given) > 1:
        *others, last = _CONSTRAINT_FLAGS.values()
        raise CliError(
            f"give at most one of {', '.join(others)} and {last}, got {', '.join(given)}"
        )
    args.constraint_options = options
    return options


def _sampling_params(args: argparse.Namespace, model_defaults: dict[str, Any] | None = None) -> Any:
    """The flags' SamplingParams; unset flags take ``model_defaults`` (the checkpoint's
    generation_config.json), then the CLI's own defaults. Called once before loading the model
    (to refuse bad flags early) and once after."""
    from brisklm.sampling import SamplingParams

    given = {name: getattr(args, name) for name in _MODEL_DEFAULTED}
    chosen = {**_MODEL_DEFAULTED, **(model_defaults or {})}
    chosen.update({name: value for name, value in given.items() if value is not None})
    sampling_only = [
        f"--{name.replace('_', '-')}"
        for name in ("top_k", "top_p", "min_p", "seed")
        if getattr(args, name) is not None
    ]
    if model_defaults is not None and chosen["temperature"] == 0 and sampling_only:
        # (the model's generation_config.json says greedy, or --temperature 0 was given)
        said = (
            "--temperature 0 asks"
            if args.temperature is not None
            else "the model's generation_config.json asks"
        )
        print(
            f"brisklm: {' and '.join(sampling_only)} change nothing: {said} for greedy "
            "decoding (give --temperature above 0 to sample)",
            file=sys.stderr,
        )
    return SamplingParams(
        **chosen,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
        thinking_token_budget=args.thinking_token_budget,
        **_constraint_options(args),
    )


def _load(
    args: argparse.Namespace,
    max_batch_size: int = 1,
    prefix_cache_slots: int = 0,
    prefill_chunk_size: int | None = None,
) -> Any:
    from brisklm.llm import LLM

    if args.num_speculative_tokens is not None and args.draft is None:
        raise CliError(
            "--num-speculative-tokens needs speculative decoding: pass --draft (a draft model "
            "directory, 'default' or 'ngram')"
        )
    return LLM.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        max_batch_size=max_batch_size,
        max_seq_len=args.max_seq_len,
        draft=args.draft,
        num_speculative_tokens=args.num_speculative_tokens,
        draft_length=args.draft_length,
        num_threads=args.threads,
        cuda_graphs=args.cuda_graphs,
        prefix_caching=args.prefix_caching,
        max_decode_steps=args.max_decode_steps,
        prefix_cache_slots=prefix_cache_slots,
        prefill_chunk_size=prefill_chunk_size,
    )


def _read_stdin_prompt() -> str:
    """stdin's text without its final line break: `echo "Once upon a time" | brisklm generate -`
    continues the sentence, not a new line after it."""
    if sys.stdin is None:  # `brisklm generate - <&-`
        raise CliError("stdin is closed: `generate -` reads the prompt from it")
    if isinstance(sys.stdin, io.TextIOWrapper):
        # Bytes that are not UTF-8 are named by _run_generate (a strict locale's decoder raised
        # its own "'utf-8' codec can't decode byte ..." first).
        sys.stdin.reconfigure(errors="surrogateescape")
    text = sys.stdin.read()
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[: -len(ending)]
    return text


def _run_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt
    ask = 'give a prompt: brisklm generate "Once upon a time"'
    if prompt is None and sys.stdin is None:
        raise CliError(ask)
    if prompt is None and sys.stdin.isatty():
        raise CliError(f"{ask} (or '-' to read it from stdin, which a pipe does without it)")
    if prompt is None or prompt == "-":
        implicit = prompt is None
        prompt = _read_stdin_prompt()
        if implicit and not prompt:  # (stdin at /dev/null: cron, nohup, a subprocess)
            raise CliError(f"{ask} (stdin, read for want of one, was empty)")
        if column := _undecodable_column(prompt):
            line = prompt.count("\n", 0, column - 1) + 1
            column -= prompt.rfind("\n", 0, column - 1) + 1
            raise CliError(
                f"the prompt read from stdin is not UTF-8 text (line {line}, column {column})"
            )
    _sampling_params(args)
    llm = _load(args)
    params = _sampling_params(args, llm.sampling_defaults)
    request = llm.make_request(prompt, params)
    for chunk in llm.stream_request(request):
        if chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    if not args.usage:  # --usage: JSON, with the finish reason
        _say_how_it_ended(llm, request, params)
    else:
        usage = request.usage
        report: dict[str, Any] = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "finish_reason": request.finish_reason,
        }
        if request.speculative is not None:
            report["acceptance_rate"] = round(request.speculative.acceptance_rate, 3)
            report["mean_accepted_per_step"] = round(request.speculative.mean_accepted_per_step, 3)
        print(json.dumps(report), file=sys.stderr)
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from brisklm.server.app import build_app
    except ImportError as exc:
        raise CliError(
            f"brisklm serve needs the server extra ({exc.name} is not installed): "
            "pip install 'brisklm[server]'"
        ) from None
    if args.max_batch_size < 1:
        raise CliError(f"--max-batch-size must be at least 1, got {args.max_batch_size}")
    name = args.served_model_name or _model_name(args)
    # The socket first: a port in use or a host that does not resolve fails in one line before
    # the model loads, and --port 0 says which port the system gave.
    sockets = _listen(args.host, args.port)
    try:
        llm = _load(
            args,
            max_batch_size=args.max_batch_size,
            prefix_cache_slots=args.prefix_cache_slots,
            prefill_chunk_size=args.prefill_chunk_size,
        )
        try:
            app = build_app(llm, name, api_key=args.api_key or None)
            server = _stopping_server(uvicorn)(uvicorn.Config(app, log_level="warning"), llm)
            bound, port = sockets[0].getsockname()[:2]
            host = args.host or bound
            shown = f"[{host}]" if ":" in host else host
            print(
                f"brisklm: serving {name} at http://{shown}:{port}/v1 (Ctrl-C stops)",
                file=sys.stderr,
                flush=True,
            )
            try:
                _serve_until_terminated(server, sockets)
            except SystemExit as exc:  # uvicorn's startup failed; it logged why
                if exc.code:
                    raise CliError("the server could not start (see the line above)") from None
        finally:
            llm.close()
    finally:
        for listening in sockets:
            listening.close()
    return 0


def _serve_until_terminated(server: Any, sockets: list[socket.socket]) -> None:
    """Run uvicorn's ``server`` on ``sockets``; after a SIGTERM, raise ``Terminated`` once it has
    stopped. uvicorn stops the server on one and then raises each signal it caught again, under
    the handler it found: this one, which asks the server to exit (a no-op by then) and remembers
    it. A SIGTERM that lands as the server starts, before uvicorn's own handlers are in, asks it
    to exit the same way: raised there, inside ``asyncio.run`` before the server's coroutine had
    begun, it left that coroutine never awaited (a RuntimeWarning on stderr).

    SIGINT the same where the process ignores it (a background job of a non-interactive shell),
    then ``KeyboardInterrupt``: uvicorn stops on it all the same, and raised again under "ignore"
    the process exited 0. (Otherwise Python's own handler raises ``KeyboardInterrupt``.)"""
    if threading.current_thread() is not threading.main_thread():
        server.run(sockets=sockets)
        return
    received: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        server.should_exit = True

    handled = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        handled.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, stop) for signum in handled}
    try:
        server.run(sockets=sockets)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if signal.SIGTERM in received:
        raise Terminated
    if received:
        raise KeyboardInterrupt


def _stopping_server(uvicorn: Any) -> type:
    """uvicorn's Server, stopping as a server of long replies should: the first Ctrl-C (or
    SIGTERM) stops taking requests and lets the replies in flight end, saying so; the second ends
    them now, and those that start later while the server stops (finish reason ``abort``: streams
    close, each with its text so far), and it stops once they have closed, with no traceback; a
    third Ctrl-C forces uvicorn's exit."""

    class StoppingServer(uvicorn.Server):  # type: ignore[misc, name-defined]
        def __init__(self, config: Any, llm: Any) -> None:
            super().__init__(config)
            self._llm = llm
            self._ending = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                super().handle_exit(sig, frame)
                if self.server_state.connections:
                    _say("stopping once the replies in flight end (Ctrl-C again ends them now)")
            elif not self._ending:
                self._ending = True
                self._captured_signals.append(sig)
                _say("ending the replies in flight")
                # Not from the signal handler itself: the engine's wake-up event takes a lock the
                # interrupted thread may hold. The event loop runs it, and again while the server
                # stops (requests whose prompts were being prepared submit after the first).
                try:
                    asyncio.get_running_loop().call_soon_threadsafe(self._end_replies)
                except RuntimeError:  # (no loop running yet: no reply either)
                    pass
            else:
                super().handle_exit(sig, frame)

        def _end_replies(self) -> None:
            self._llm.abort_all()
            asyncio.get_running_loop().call_later(0.1, self._end_replies)

    return StoppingServer


def _say(message: str) -> None:
    """A line of the server's own on stderr (what it does, not an error)."""
    with contextlib.suppress(OSError, ValueError):
        print(f"brisklm: {message}", file=sys.stderr, flush=True)


def _listen(host: str, port: int) -> list[socket.socket]:
    """TCP sockets listening on every address ``host`` resolves to (all interfaces for ""), at
    ``port`` (0: one the system picks, the same for all), as uvicorn's own server binds them; or
    CliError naming the flags and the system's reason."""
    if not 0 <= port <= 65535:  # (getaddrinfo takes 70000 as 4464)
        raise CliError(f"--port must be in [0, 65535], got {port}")
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise CliError(f"--host {host!r} cannot be resolved: {exc}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            try:
                listening = socket.socket(family, kind, proto)
            except OSError:  # a family this machine lacks (IPv6), as asyncio skips it
                continue
            sockets.append(listening)
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # its IPv4 twin, if any, has a socket of its own
                listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            try:
                listening.bind(address)
            except OSError as exc:
                # An address of a family the kernel has off (IPv6 disabled: "::" is not
                # available) is left out where another one binds; a port in use is not.
                if exc.errno != errno.EADDRNOTAVAIL or len(found) == 1:
                    raise
                sockets.pop().close()
                continue
            listening.listen()  # (a second bind of a port with SO_REUSEADDR succeeds; this fails)
    except OSError as exc:
        for listening in sockets:
            listening.close()
        raise CliError(
            f"cannot listen on {host}:{port} (--host, --port): {exc.strerror or exc}"
        ) from None
    if not sockets:
        raise CliError(
            f"cannot listen on {host}:{port} (--host): no address family it resolves "
            "to is available here"
        )
    return sockets


def _run_bench(args: argparse.Namespace) -> int:
    from brisklm.speed import check_speed_options, measure_speed

    try:
        batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    except ValueError:
        raise CliError(
            f"--batch-sizes must be integers separated by commas, got {args.batch_sizes!r}"
        ) from None
    check_speed_options(args.prompt_tokens, args.new_tokens, batch_sizes, args.repeats)
    args.prefix_caching = False  # a repeated prompt would be reused, not computed
    llm = _load(args, max_batch_size=max(batch_sizes))
    try:
        report = measure_speed(llm, args.prompt_tokens, args.new_tokens, batch_sizes, args.repeats)
    finally:
        llm.close()
    name = _model_name(args)
    if args.as_json:
        print(json.dumps({"model": name, "threads": _torch_threads(), **report.as_dict()}))
        return 0
    print(f"{name}, {llm.engine.device}, {_torch_threads()} threads (best of {args.repeats})")
    print(
        f"prefill {report.prompt_tokens} tokens: {report.prefill_tokens_per_second:10,.1f} "
        f"tokens/s ({1000 * report.prefill_seconds:.1f} ms)"
    )
    for row in report.decode:
        print(
            f"decode batch {row.batch_size}: {row.tokens_per_second:10,.1f} tokens/s "
            f"({1000 * row.seconds_per_step:.2f} ms a step)"
        )
    return 0


def _model_name(args: argparse.Namespace) -> str:
    """The model's name for people: its directory's, or the bundled model's."""
    return Path(args.model).name if args.model else "brisk-chat"


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _say_how_it_ended(llm: Any, request: Any, params: Any) -> None:
    """On stderr: an output the context ended before --max-tokens, and a constrained one (--json,
    --json-schema, --regex, --choice, --grammar) cut short of its constraint: --max-tokens or the
    context ended it where its grammar was not complete (an open-ended one, --regex '[a-z]+',
    may be complete there: then nothing is said), or a --stop string or stop token did."""
    ended_by_context = (
        request.finish_reason == "length" and request.usage.completion_tokens < params.max_tokens
    )
    if ended_by_context:
        print(
            f"brisklm: the context of {llm.max_seq_len} tokens ended the output after "
            f"{request.usage.completion_tokens} of --max-tokens {params.max_tokens} "
            "(raise --max-seq-len for more)",
            file=sys.stderr,
        )
    matcher, stop = request.matcher, request.stop_reason
    if params.constraint is None or matcher is None:
        return
    if request.finish_reason == "length" and not matcher.is_accepting():
        ended = "the context" if ended_by_context else "--max-tokens"
        told = "does not match it"
    elif stop is not None:  # (the text leaves the stop string out)
        ended = f"the --stop string {stop!r}" if isinstance(stop, str) else f"stop token id {stop}"
        told = "may not match it"
    else:
        return
    print(
        f"brisklm: {ended} ended the output before its constraint was met: the output {told}",
        file=sys.stderr,
    )


def _reply_request(
    llm: Any, messages: list[dict[str, str]], params: Any, template_vars: dict[str, Any]
) -> Any:
    """The request for the assistant's reply to ``messages`` (streamed with its finish reason,
    which ``stream_chat`` does not give), decoded as ``chat`` decodes it: a constraint flag's
    (--json, --regex, ...) after a reasoning model's thinking (``LLM.chat_decoding``)."""
    ids = llm.chat_prompt_ids(messages, **template_vars)
    return llm.make_request(ids, llm.chat_decoding(ids, params, None)[0])


# chat_prompt_ids' own arguments, which a template variable of the same name would collide with.
_SET_BY_CHAT = frozenset({"self", "messages", "tools"})

# Request options the chat template's variables are mistaken for, and the flags that set them.
_FLAGS_FOR = {
    "response_format": "--json-schema or --json",
    "json_object": "--json",
    "sampling_params": "the sampling flags (--temperature, --max-tokens, ...)",
}


def _template_vars(settings: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """``--template-var NAME=VALUE`` flags as the chat template's variables (VALUE as JSON where
    it parses, else the text); a sampling option among them is named with its flag (``args``
    holds one for each)."""
    from brisklm.llm import NOT_TEMPLATE_VARIABLES, check_template_kwargs

    variables: dict[str, Any] = {}
    for setting in settings:
        name, equals, text = setting.partition("=")
        if not equals or not name.isidentifier():
            raise CliError(
                f"--template-var {setting!r} is not NAME=VALUE with NAME a template variable's "
                "name (enable_thinking=false)"
            )
        if name in _SET_BY_CHAT:
            raise CliError(
                f"--template-var {name}: brisklm chat sets {name} itself (the conversation; it "
                "offers no tools), not a variable to give"
            )
        if name in NOT_TEMPLATE_VARIABLES:
            flags = _FLAGS_FOR.get(name) or (
                f"--{name.replace('_', '-')}" if hasattr(args, name) else None
            )
            raise CliError(
                f"--template-var {name}: {name} is a request option, not a chat template "
                f"variable: {f'use {flags}' if flags else 'brisklm chat has no flag for it'}"
            )
        try:
            variables[name] = json.loads(text)
        except ValueError:
            variables[name] = text
    try:
        check_template_kwargs(variables)
    except (TypeError, ValueError) as error:
        raise CliError(f"--template-var: {error}") from None
    return variables


def _run_chat(args: argparse.Namespace) -> int:
    if sys.stdin is None:  # `brisklm chat <&-`
        raise CliError("stdin is closed: chat reads the messages from it")
    _sampling_params(args)
    template_vars = _template_vars(args.template_var, args)
    llm = _load(args)
    if isinstance(sys.stdin, io.TextIOWrapper):
        # A line that is not UTF-8 is refused alone; strict decoding would end the session.
        sys.stdin.reconfigure(errors="surrogateescape")
    params = _sampling_params(args, llm.sampling_defaults)
    interactive = sys.stdin.isatty()
    messages: list[dict[str, str]] = []
    refused = 0  # lines that did not fit: read from a pipe, the command then exits 1
    if args.system:
        messages.append({"role": "system", "content": args.system})
        # The shortest chat there can be: the system message and an empty user turn. If that
        # leaves no room for a reply, every line would be refused.
        empty_turn = [*messages, {"role": "user", "content": ""}]
        least = len(llm.chat_prompt_ids(empty_turn, **template_vars))
        if least >= llm.max_seq_len:
            raise CliError(
                f"--system takes {least} tokens with the chat template and an empty user turn, "
                f"but the context holds {llm.max_seq_len} (the system message, each turn and the "
                "reply); shorten it or raise --max-seq-len"
            )
    if interactive:
        print(
            "Chatting with",
            llm.model_path.resolve().name,  # `--model .` has no name of its own
            "- /reset clears the history, /exit or Ctrl-D quits, Ctrl-C stops a reply, /help "
            "lists the commands.",
        )
    while True:
        if interactive:
            sys.stdout.write("> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            if interactive:  # Ctrl-D: the shell's prompt on a line of its own
                sys.stdout.write("\n")
            break
        user = line.removesuffix("\n").removesuffix("\r")  # "\r\n" from Windows tools too
        if not user.strip():
            continue
        bad = _undecodable_column(user)
        if bad:
            refused += 1
            print(
                f"brisklm: error: this line is not UTF-8 text (column {bad}); it got no reply",
                file=sys.stderr,
            )
            continue
        command = user.strip().lower()
        if command in ("/exit", "/quit"):
            break
        if command == "/reset":
            messages = messages[:1] if args.system else []
            continue
        if _CHAT_COMMAND.fullmatch(command):  # /help, or a command that does not exist
            if command != "/help":
                refused += 1
                print(f"brisklm: error: no command {user.strip()}", file=sys.stderr)
            # (piped, on stderr: stdout holds the replies alone)
            help_shown = command == "/help" and interactive
            print(_CHAT_HELP, file=sys.stdout if help_shown else sys.stderr)
            continue
        before = list(messages)  # (a turn refused or stopped before any text leaves it as it was)
        messages.append({"role": "user", "content": user})
        keep = 1 if args.system else 0
        reply = []
        try:
            if not _fit_history(llm, messages, keep, params.max_tokens, template_vars):
                messages[:] = before
                refused += 1
                print(
                    f"brisklm: error: this message alone does not fit the context of "
                    f"{llm.max_seq_len} tokens",
                    file=sys.stderr,
                )
                continue
            request = _reply_request(llm, messages, params, template_vars)
            for chunk in llm.stream_request(request):  # (an interrupt closes it: aborted)
                if chunk.text:
                    reply.append(chunk.text)
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            if not interactive:  # a script's interrupt ends the command (exit status 130)
                raise
            # At a terminal Ctrl-C stops the reply, as in other chat programs: the history
            # keeps what was shown of it (none shown: the turn goes).
            sys.stdout.write("\n")
            print("brisklm: reply stopped (Ctrl-C at the prompt quits)", file=sys.stderr)
            if not reply:
                messages[:] = before
                continue
        else:
            sys.stdout.write("\n")
            _say_how_it_ended(llm, request, params)
        messages.append({"role": "assistant", "content": "".join(reply)})
    if refused and not interactive:
        # A script reading the replies must learn that some are missing; typed at a terminal,
        # each refusal was seen as it happened.
        print(f"brisklm: error: {refused} message(s) got no reply", file=sys.stderr)
        return 1
    return 0


def _check_text_flags(args: argparse.Namespace) -> None:
    """Refuse flags of text (not paths: file names need not be UTF-8) holding bytes that are not
    UTF-8, naming the flag (llguidance's message for a --choice spoke of lone surrogates), and
    empty paths (``Path("")`` is the current directory)."""
    for name, what in (
        ("model", "directory"),
        ("draft", "directory"),
        ("out", "directory"),
        ("calibration", "text file"),
        ("grammar", "grammar file"),
    ):
        if getattr(args, name, None) == "":
            raise CliError(f"--{name} is empty: give a {what}")
    if getattr(args, "prompt", None) not in (None, "-") and (
        column := _undecodable_column(args.prompt)
    ):
        raise CliError(f"the prompt is not UTF-8 text (column {column})")
    for name in ("stop", "choice", "regex", "system"):
        value = getattr(args, name, None)
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and (column := _undecodable_column(text)):
                raise CliError(f"--{name} {text!r} is not UTF-8 text (column {column})")


def _undecodable_column(line: str) -> int:
    """The 1-based column of the first byte in ``line`` that was not UTF-8 (stdin reads such
    bytes as surrogates), or 0."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start + 1
    return 0


# A line that is a chat command: "/" and a word (a message may begin with a path: "/etc/hosts").
_CHAT_COMMAND = re.compile(r"/[A-Za-z]+")
_CHAT_HELP = """commands:
  /reset  clear the history (the --system message stays)
  /exit   quit (/quit and Ctrl-D too)
  /help   this list
Ctrl-C stops a reply; at the prompt it quits."""


def _fit_history(
    llm: Any,
    messages: list[dict[str, str]],
    keep: int,
    reply_room: int,
    template_vars: dict[str, Any] | None = None,
) -> bool:
    """Drop the oldest turns (after the first ``keep`` messages) until the chat leaves room for
    a reply of ``reply_room`` tokens, at most half the context (replies were cut off
    mid-sentence by the context otherwise); the newest message alone may leave less. False,
    with the history as it was, if it leaves none. ``template_vars``: the template's variables
    (``--template-var``)."""
    reply_room = min(reply_room, llm.max_seq_len // 2)
    fitted = list(messages)
    dropped = 0
    variables = template_vars or {}
    while (length := len(llm.chat_prompt_ids(fitted, **variables))) + reply_room > llm.max_seq_len:
        # The oldest turn whole: its user message and the reply, up to the next user message
        # (templates that need alternating roles refuse a history starting with a reply).
        end = next((i for i in range(keep + 1, len(fitted)) if fitted[i]["role"] == "user"), 0)
        if not end:  # only the newest message is left
            if length < llm.max_seq_len:
                break
            return False
        del fitted[keep:end]
        dropped += end - keep
    messages[:] = fitted
    if dropped:
        print(
            f"brisklm: the history outgrew the context: dropped {dropped} oldest message(s)",
            file=sys.stderr,
        )
    return True


def _run_quantize(args: argparse.Namespace) -> int:
    from brisklm.quant.quantize_model import QuantizeOptions, quantize_model

    options = QuantizeOptions(
        method=args.method,
        group_size=args.group_size,
        sym=args.sym,
        act_order=args.act_order,
        quantize_lm_head=args.quantize_lm_head,
        damp_percent=args.damp,
        num_samples=args.num_samples,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
    )
    result = quantize_model(
        args.model, args.out, options, calibration=args.calibration, device=args.device
    )
    calibration = (
        f", calibrated on {result.num_sequences} x {result.seq_len} tokens"
        if result.method == "gptq"
        else ""
    )
    print(f"wrote {result.out_dir} ({result.method}{calibration}) in {result.seconds:.1f}s")
    return 0


def _import_engine() -> None:
    """Import torch (through the engine's modules) with Ctrl-C held until it is done.

    An interrupt inside numpy's or torch's extension modules leaves them half-initialised: the
    import then failed with "cannot load module more than once per process", or went on as if
    nothing was pressed. Held, it is raised here, and ``main`` exits 130.
    """
    if "torch" in sys.modules:
        return
    pressed: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    except ValueError:  # not the main thread: signals go elsewhere anyway
        previous = None
    try:
        import brisklm.llm  # noqa: F401 - loads torch
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


def unknown_arguments_error(
    parser: _Parser, command: str, argv: Sequence[str] | None, unknown: list[str]
) -> NoReturn:
    """Name the unknown arguments with the help that lists the flags they stood among: the
    subcommand's for those typed after it (its --help lists its flags, brisklm's only the
    subcommands), brisklm's for options typed before the subcommand (`brisklm --bogus generate`),
    and where such an option is the subcommand's own (`brisklm --usage generate`), where it goes."""
    words = list(sys.argv[1:] if argv is None else argv)
    at = words.index(command) if command in words else 0
    subcommand = parser.commands.choices[command]
    message = f"unrecognized arguments: {' '.join(unknown)}"
    if at and len(unknown) <= at and words[: len(unknown)] == unknown:  # all typed before it
        misplaced = [w for w in unknown if w.split("=")[0] in subcommand._option_string_actions]
        if misplaced:
            subcommand.error(
                f"{message} ({misplaced[0]} goes after the subcommand: brisklm "
                f"{command} {misplaced[0]} ...)"
            )
        parser.error(message)
    subcommand.error(message)


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:  # `brisklm ... 2>&-`: messages and progress bars go nowhere
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open for the process's life)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        unknown_arguments_error(parser, args.command, argv, unknown)
    handlers = {
        "generate": _run_generate,
        "chat": _run_chat,
        "serve": _run_serve,
        "quantize": _run_quantize,
        "bench": _run_bench,
    }

    def run() -> int:
        _check_text_flags(args)
        _import_engine()
        with _warnings_as_lines(args):
            return handlers[args.command](args)

    def describe(error: BaseException) -> str:
        message = _in_flag_terms(str(error) or type(error).__name__, args)
        first = message.splitlines()[0] if message else message
        return first + _syntax_hint(error, args)

    return run_command(run, "brisklm", describe, (CliError, *REPORTED_ERRORS))


def _syntax_hint(error: BaseException, args: argparse.Namespace) -> str:
    """For a --grammar read as Lark that fails as Lark and holds GBNF's rule sign: what to do."""
    options = getattr(args, "constraint_options", {})
    if (
        str(error).startswith("invalid Lark grammar")
        and getattr(args, "grammar_syntax", None) is None
        and "::=" in options.get("grammar", "")
    ):
        return " (it looks like GBNF: name the file *.gbnf or pass --grammar-syntax gbnf)"
    return ""


class _WarningLines(logging.Handler):
    """brisklm's logged warnings as the CLI's own lines, "brisklm: warning: ...", the options
    they name as the flags that set them (logging's last-resort handler printed the bare message,
    in the API's terms: "max_seq_len=2048 is past ..."); errors as "brisklm: error: ...", with
    the traceback of their exception (a served request's failure: it printed the bare "request
    failed" as a warning)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(logging.WARNING)
        self.args = args

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = _in_flag_terms(record.getMessage(), self.args)
            kind = "error" if record.levelno >= logging.ERROR else "warning"
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            print(f"brisklm: {kind}: {message}", file=sys.stderr, flush=True)
        except Exception:  # as logging's handlers do: a failed warning is not the command's
            self.handleError(record)


@contextlib.contextmanager
def _warnings_as_lines(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """For the command's run: brisklm's warnings through ``_WarningLines`` only (not also through
    a handler the caller of ``main`` may have set up)."""
    logger = logging.getLogger("brisklm")
    handler = _WarningLines(args)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


_SAMPLING_ERROR = re.compile(r"SamplingParams\.(\w+)=(.*?) is invalid: (.*)", re.DOTALL)
# Python keywords an error from LLM.from_pretrained may start with, and the flag that set each.
_ENGINE_FLAGS = {
    "max_seq_len": "--max-seq-len",
    "num_speculative_tokens": "--num-speculative-tokens",
    "draft_length": "--draft-length",
    "num_threads": "--threads",
    "max_decode_steps": "--max-decode-steps",
    "prefix_cache_slots": "--prefix-cache-slots",
    "prefill_chunk_size": "--prefill-chunk-size",
    "prompt_tokens": "--prompt-tokens",
    "new_tokens": "--new-tokens",
    "batch_sizes": "--batch-sizes",
    "repeats": "--repeats",
}
# The same for QuantizeOptions' fields, in `brisklm quantize`.
_QUANTIZE_FLAGS = {
    "damp_percent": "--damp",
    "num_samples": "--num-samples",
    "seq_len": "--seq-len",
    "batch_size": "--batch-size",
    "group_size": "--group-size",
    "act_order": "--act-order",
}


# Advice in the API's terms an error may end with, in the CLI's.
_API_WORDS = (
    ("raise max_seq_len", "raise --max-seq-len"),
    ("pass chat_template=... or use plain text prompts", "use `brisklm generate` instead"),
    ("; pass chat_template=<name>", " (the CLI renders with 'default')"),
    ("use method 'gptq'", "use --method gptq"),
    ("pass draft=", "pass --draft"),
    # None is the Python option's unset value: no flag takes it
    ("must be None or ", "must be "),
    (" or None (the model's)", " (default: the model's)"),
    # The CLI runs one sequence at a time (its KV cache holds one), and has no flag for it.
    (" with max_batch_size=1 needs", " needs"),
    (" with max_batch_size=", " with --max-batch-size "),
    (
        "max_batch_size + prefix_cache_slots at most",
        "--max-batch-size + --prefix-cache-slots at most",
    ),
    ("max_batch_size at most", "--max-batch-size at most"),
    ("at this max_seq_len", "at this --max-seq-len"),
    ("; None: one per CPU)", "; by default one per CPU)"),
    ("max_seq_len can be at most", "--max-seq-len can be at most"),
    ("needs prefix_caching=True", "needs prefix caching (no --no-prefix-caching)"),
    (" and prefix_cache_slots=", " and --prefix-cache-slots "),
    (" and new_tokens=", " and --new-tokens "),
    ("(the default max_seq_len,", "(the default --max-seq-len,"),
    ("must be None, ", "must be "),
    (" or None (by device)", " (default: by device)"),
)


def _in_flag_terms(message: str, args: argparse.Namespace) -> str:
    """An error of the Python API, its option named by the flag the user gave (--max-tokens 0,
    not SamplingParams.max_tokens=0); messages about anything else unchanged."""
    match = _SAMPLING_ERROR.match(message)
    if match:
        name, _, reason = match.groups()
        given = getattr(args, name, None)
        if given is None or given == []:  # not a flag, or a value from the model's defaults
            return message
        values = given if isinstance(given, list) else [given]
        shown = " ".join(shlex.quote(str(value)) for value in values)
        return _in_cli_words(f"--{name.replace('_', '-')} {shown}: {reason}")
    name, _, rest = message.partition(" ")
    name, equals, value = name.partition("=")
    flags = _QUANTIZE_FLAGS if getattr(args, "command", None) == "quantize" else _ENGINE_FLAGS
    flag = flags.get(name)
    if flag is not None:
        # A value the user did not give is the flag's default (the model's context, ...).
        default = " (the default)" if equals and getattr(args, name, 0) is None else ""
        message = f"{flag}{' ' if equals else ''}{value}{default} {rest}"
    return _in_cli_words(message, getattr(args, "command", None))


# `brisklm bench` sizes its engine's batch by its largest batch size.
_BENCH_WORDS = (
    (" with max_batch_size=", " with the largest of --batch-sizes "),
    ("max_batch_size at most", "the largest of --batch-sizes at most"),
)


def _in_cli_words(message: str, command: str | None = None) -> str:
    for api, cli in (*(_BENCH_WORDS if command == "bench" else ()), *_API_WORDS):
        message = message.replace(api, cli)
    return message


if __name__ == "__main__":
    raise SystemExit(main())
