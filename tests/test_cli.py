"""The brisklm command: streaming generate, chat over stdin, one-line errors."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import brisklm
from brisklm import LLM, SamplingParams
from brisklm.cli import main
from tests.tiny import make_tiny_checkpoint

CLI = [sys.executable, "-m", "brisklm.cli"]


def cli_env(*, buffered: bool = False) -> dict[str, str]:
    """The environment for the CLI in a subprocess, running this checkout's code; ``buffered``
    drops PYTHONUNBUFFERED (set on some machines), so stdout is block-buffered on a pipe."""
    src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "src")
    env = {k: v for k, v in os.environ.items() if not (buffered and k == "PYTHONUNBUFFERED")}
    env["PYTHONPATH"] = src + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


def cli_process(argv: list[str], *, buffered: bool = False) -> subprocess.Popen[bytes]:
    """The CLI running ``argv`` in a subprocess, its stdout and stderr piped."""
    return subprocess.Popen(
        [*CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(buffered=buffered),
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("cli-model"))


def test_generate_streams_the_completion(model_dir, capsys):
    code = main(
        [
            "generate",
            "--model",
            str(model_dir),
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--usage",
            "The quick brown fox",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    with LLM.from_pretrained(model_dir, show_progress=False) as llm:
        expected = llm.generate(
            "The quick brown fox", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        )
    assert captured.out == expected.text + "\n"
    assert '"completion_tokens": 12' in captured.err


@pytest.mark.parametrize(
    ("stdin", "prompt"),
    [
        ("The quick brown fox\n", "The quick brown fox"),  # echo's newline is not the prompt's
        ("The quick\nbrown fox\r\n", "The quick\nbrown fox"),
        ("The quick brown fox\n\n", "The quick brown fox\n"),  # only the last one goes
        ("The quick brown fox", "The quick brown fox"),
    ],
)
def test_generate_reads_the_prompt_from_stdin(model_dir, capsys, monkeypatch, stdin, prompt):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    argv = ["generate", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "6"]
    assert main([*argv, "--ignore-eos", "--usage", "-"]) == 0
    captured = capsys.readouterr()
    with LLM.from_pretrained(model_dir, show_progress=False) as llm:
        expected = llm.generate(
            prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        )
    assert captured.out == expected.text + "\n"
    assert f'"prompt_tokens": {len(expected.prompt_token_ids)}' in captured.err


def test_generate_reads_a_piped_prompt_without_dash_and_asks_for_one_at_a_terminal(
    model_dir, capsys, monkeypatch
):
    argv = ["generate", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "4"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("The quick brown fox\n"))
    assert main(argv) == 0
    piped = capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO("The quick brown fox\n"))
    assert main([*argv, "-"]) == 0 and capsys.readouterr().out == piped

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # /dev/null: cron, nohup, a subprocess
    assert main(argv) == 1  # (it generated from an empty prompt)
    assert "stdin, read for want of one, was empty" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", Terminal(""))
    assert main(argv) == 1  # (it said "the following arguments are required: prompt")
    assert capsys.readouterr().err == (
        "brisklm: error: give a prompt: brisklm generate \"Once upon a time\" (or '-' to read it "
        "from stdin, which a pipe does without it)\n"
    )


def test_chat_reads_turns_from_stdin(model_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n/reset\nHi there\n"))
    code = main(
        [
            "chat",
            "--model",
            str(model_dir),
            "--temperature",
            "0",
            "--max-tokens",
            "5",
            "--system",
            "Be brief.",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    with LLM.from_pretrained(model_dir, show_progress=False) as llm:
        params = SamplingParams(temperature=0, max_tokens=5)
        first = llm.chat(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
            params,
        )
        second = llm.chat(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
            params,
        )
    assert captured.out == first.content + "\n" + second.content + "\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--model", "/nonexistent/model", "hi"], "does not exist"),
        (  # a hub id: what to do instead (it said only "does not exist")
            ["generate", "--model", "meta-llama/Llama-3.2-1B", "hi"],
            "for the hub's meta-llama/Llama-3.2-1B, download it first, e.g. `huggingface-cli "
            "download meta-llama/Llama-3.2-1B --local-dir DIR`, and pass DIR)",
        ),
        # Options named by their flags, as typed (it said "SamplingParams.temperature=-1.0").
        (
            ["generate", "--temperature", "-1", "--model", "/nonexistent", "hi"],
            "error: --temperature -1.0: must be a finite float >= 0",
        ),
        (["generate", "--top-p", "0", "hi"], "error: --top-p 0.0: must be a float in (0, 1]"),
        # "None" is the Python option's unset value, which no flag takes
        (["generate", "--stop", "", "hi"], "error: --stop '': must be a non-empty str or a seq"),
        (["generate", "--threads", "0", "hi"], "error: --threads must be an int >= 1, got 0"),
        # It said "or None (the model's)".
        (
            ["generate", "--max-seq-len", "1", "hi"],
            "error: --max-seq-len must be an int >= 2 (default: the model's), got 1",
        ),
        (
            ["generate", "--draft-length", "fixed", "hi"],
            "error: --draft-length 'fixed' needs speculative decoding: pass --draft (a draft",
        ),
        # The subcommand's help lists its flags ("see: brisklm --help" lists the subcommands).
        (
            ["generate", "hi", "--bogus", "x"],
            "error: unrecognized arguments: --bogus x (see: brisklm generate --help)",
        ),
        (["chat", "--temprature", "0"], "(see: brisklm chat --help)"),
        # An option typed before the subcommand is no subcommand's: brisklm's own help.
        (["--bogus", "generate", "hi"], "arguments: --bogus (see: brisklm --help)"),
        (["--bogus", "generate", "hi", "--more"], "(see: brisklm generate --help)"),
        # The subcommand's own option typed before it: where it goes.
        (
            ["--usage", "generate", "hi"],
            "--usage (--usage goes after the subcommand: brisklm generate --usage ...) (see: "
            "brisklm generate --help)",
        ),
    ],
)
def test_errors_are_one_line_without_traceback(argv, message):
    result = subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, timeout=120, env=cli_env()
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("brisklm: error:") and message in lines[0]
    assert "Traceback" not in result.stderr


def test_prompt_too_long_is_an_error(model_dir, capsys):
    code = main(["generate", "--model", str(model_dir), "--max-seq-len", "8", "word " * 50])
    assert code == 1
    err = capsys.readouterr().err
    assert "context holds 8" in err and err.count("\n") == 1
    assert "raise --max-seq-len" in err  # the flag, not the Python keyword


def test_generate_says_when_the_context_ended_the_output(model_dir, capsys):
    # It stopped at the context with exit 0 and no word, --max-tokens far from reached.
    argv = ["generate", "--model", str(model_dir), "--temperature", "0", "--ignore-eos"]
    assert main([*argv, "--max-seq-len", "24", "--max-tokens", "100", "word " * 10]) == 0
    err = capsys.readouterr().err
    assert "brisklm: the context of 24 tokens ended the output after " in err
    assert "of --max-tokens 100 (raise --max-seq-len for more)" in err
    assert main([*argv, "--max-seq-len", "24", "--max-tokens", "3", "word"]) == 0
    assert capsys.readouterr().err == ""  # --max-tokens reached: no notice
    # With --usage stderr stays one JSON line (its finish_reason says it).
    assert main([*argv, "--max-seq-len", "24", "--max-tokens", "100", "--usage", "word"]) == 0
    assert json.loads(capsys.readouterr().err)["finish_reason"] == "length"


def test_generate_with_constraints_and_draft(model_dir, capsys, tmp_path):
    code = main(
        [
            "generate",
            "--model",
            str(model_dir),
            "--temperature",
            "0",
            "--choice",
            "yes",
            "--choice",
            "no",
            "Answer:",
        ]
    )
    assert code == 0 and capsys.readouterr().out.strip() in ("yes", "no")
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"n": {"type": "integer", "maximum": 9}},
                "required": ["n"],
            }
        )
    )
    code = main(
        [
            "generate",
            "--model",
            str(model_dir),
            "--temperature",
            "0",
            "--json-schema",
            str(schema),
            "JSON:",
        ]
    )
    assert code == 0 and json.loads(capsys.readouterr().out)["n"] <= 9
    code = main(
        [
            "generate",
            "--model",
            str(model_dir),
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--draft",
            "ngram",
            "--draft-length",
            "adaptive",
            "--usage",
            "The quick brown fox",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    with LLM.from_pretrained(model_dir, show_progress=False) as llm:
        expected = llm.generate(
            "The quick brown fox", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        )
    assert captured.out == expected.text + "\n"
    assert "acceptance_rate" in json.loads(captured.err.strip().splitlines()[-1])


def test_bad_constraint_is_one_line(model_dir, capsys):
    code = main(["generate", "--model", str(model_dir), "--json-schema", "{not json", "x"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("brisklm: error: --json-schema") and err.count("\n") == 1
    code = main(["generate", "--model", str(model_dir), "--regex", "a", "--choice", "b", "x"])
    assert code == 1 and capsys.readouterr().err == (
        "brisklm: error: give at most one of --json-schema, --json, --regex, --choice and "
        "--grammar, got --regex, --choice\n"  # (it named json_object, regex: the API's words)
    )


def test_engine_limits_are_named_by_the_flags(model_dir, capsys):
    """The KV cache's fit and the thread limit named the API's options (max_batch_size=,
    "None: one per CPU") and a --max-seq-len the user never gave."""
    huge = "100000000"
    assert main(["bench", "--model", str(model_dir), "--batch-sizes", f"1,{huge}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"brisklm: error: --max-seq-len 512 (the default) with the largest of --batch-sizes {huge} "
        "needs a KV cache of"
    )
    assert "max_batch_size" not in err and "at this --max-seq-len" in err
    assert main(["generate", "--model", str(model_dir), "--threads", "100000", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("brisklm: error: --threads 100000 is more than 8 threads for each")
    assert err.endswith("(more threads than CPUs take turns on them; by default one per CPU)\n")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["generate", "--max-tokens", "abc", "x"],
            "argument --max-tokens: invalid int value: 'abc'",
        ),
        (["generate", "--dtype", "int8", "x"], "argument --dtype: invalid choice: 'int8'"),
        (
            ["generate", "--kv-cache-dtype", "int8", "x"],
            "argument --kv-cache-dtype: invalid choice: 'int8'",
        ),
        (
            ["generate", "--draft-length", "sometimes", "x"],
            "argument --draft-length: invalid choice",
        ),
        (
            ["generate", "-hello"],  # (-h with the argument "ello")
            "'ello' (a prompt that begins with '-' goes after '--': brisklm generate -- '-hello') "
            "(see: brisklm generate --help)",
        ),
        (["bogus"], "argument command: invalid choice: 'bogus'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_1(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("brisklm: error: ") and message in err and err.count("\n") == 1
    assert "--help)" in err  # points at the usage instead of printing it


def test_empty_constraint_flags_are_not_ignored(model_dir, capsys, tmp_path):
    code = main(["generate", "--model", str(model_dir), "--json-schema", "", "x"])
    assert code == 1 and "--json-schema is neither a file nor valid JSON" in capsys.readouterr().err
    # An empty regex allows only the empty output, as in the API.
    code = main(["generate", "--model", str(model_dir), "--regex", "", "--max-tokens", "5", "x"])
    assert code == 0 and capsys.readouterr().out == "\n"
    code = main(["generate", "--model", str(model_dir), "--grammar", str(tmp_path), "x"])
    assert code == 1 and "is a directory" in capsys.readouterr().err
    latin1 = tmp_path / "g.lark"
    latin1.write_bytes(b'start: "\xff"')
    code = main(["generate", "--model", str(model_dir), "--grammar", str(latin1), "x"])
    err = capsys.readouterr().err
    assert code == 1 and f"--grammar file {str(latin1)!r} is not UTF-8 text" in err


def test_a_gbnf_grammar_file_is_known_by_its_suffix_in_any_case(model_dir, capsys, tmp_path):
    # `.GBNF` was read as Lark: "root ::= ..." is not a Lark rule.
    argv = ["generate", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "3"]
    for name in ("g.gbnf", "G.GBNF"):
        (tmp_path / name).write_text('root ::= "ok"\n')
        assert main([*argv, "--grammar", str(tmp_path / name), "x"]) == 0
        assert capsys.readouterr().out == "ok\n"
    # --grammar-syntax over the suffix, and only with --grammar.
    (tmp_path / "lark.gbnf").write_text('start: "ok"\n')
    lark = ["--grammar-syntax", "lark", "--grammar", str(tmp_path / "lark.gbnf")]
    assert main([*argv, *lark, "x"]) == 0
    assert capsys.readouterr().out == "ok\n"
    assert main([*argv, "--grammar-syntax", "gbnf", "x"]) == 1
    assert "--grammar-syntax needs --grammar" in capsys.readouterr().err
    # GBNF in a file not named .gbnf failed as Lark with no word of the flag.
    (tmp_path / "g.txt").write_text('root ::= "ok"\n')
    assert main([*argv, "--grammar", str(tmp_path / "g.txt"), "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("brisklm: error: invalid Lark grammar") and err.count("\n") == 1
    assert err.rstrip().endswith(
        "(it looks like GBNF: name the file *.gbnf or pass --grammar-syntax gbnf)"
    )


def test_chat_drops_old_turns_when_the_history_outgrows_the_context(model_dir, capsys, monkeypatch):
    turns = "".join(f"Tell me about the number {n} please\n" for n in range(6))
    monkeypatch.setattr(sys, "stdin", io.StringIO(turns + "word " * 80 + "\nHi\n"))
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "8"]
    code = main([*argv, "--max-seq-len", "64", "--system", "Be brief."])
    captured = capsys.readouterr()
    # The session goes on (it used to end at the first turn that did not fit), and read from a
    # pipe it ends with 1, so that a script learns that a reply is missing (it ended with 0).
    assert code == 1
    assert "dropped" in captured.err
    assert "this message alone does not fit the context of 64 tokens" in captured.err
    assert captured.err.endswith("1 message(s) got no reply\n")
    assert captured.out.count("\n") == 7  # a reply to every turn but the oversized one


ALTERNATING_TEMPLATE = (  # as Mistral's and Llama 2's templates: roles must alternate
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chat_drops_whole_turns_for_templates_that_need_alternating_roles(
    model_dir, tmp_path, capsys, monkeypatch
):
    # Dropping one message at a time left a history starting with the assistant's reply, which
    # such templates refuse: the session ended with the template's error.
    strict = tmp_path / "strict"
    shutil.copytree(model_dir, strict)
    config = json.loads((strict / "tokenizer_config.json").read_text())
    config["chat_template"] = ALTERNATING_TEMPLATE
    (strict / "tokenizer_config.json").write_text(json.dumps(config))
    turns = "".join(f"Tell me about the number {n} please\n" for n in range(6))
    monkeypatch.setattr(sys, "stdin", io.StringIO(turns))
    argv = ["chat", "--model", str(strict), "--temperature", "0", "--max-tokens", "8"]
    code = main([*argv, "--max-seq-len", "64"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "dropped 2 oldest message(s)" in captured.err  # a user message and its reply
    assert captured.out.count("\n") == 6  # a reply to every turn


def test_chat_leaves_room_for_the_reply_and_reads_crlf_and_bad_lines(
    model_dir, capsys, monkeypatch
):
    # Old turns were dropped only once the prompt filled the context, so replies near the limit
    # were cut off mid-sentence by it; "\r\n" kept the "\r" in the message; a line that was not
    # UTF-8 ended the session with an error about a position in the rendered prompt.
    from brisklm import cli

    calls = []
    reply_request = cli._reply_request

    def recording(llm, messages, params, template_vars):
        calls.append((len(llm.chat_prompt_ids(messages)), params.max_tokens, messages[-1]))
        return reply_request(llm, messages, params, template_vars)

    monkeypatch.setattr(cli, "_reply_request", recording)
    turns = "".join(f"Tell me about the number {n} please\r\n" for n in range(6))
    monkeypatch.setattr(sys, "stdin", io.StringIO(turns + "Hi \udcff there\nBye\n"))
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "12"]
    code = main([*argv, "--max-seq-len", "64"])
    captured = capsys.readouterr()
    assert code == 1 and len(calls) == 7
    assert all(length + 12 <= 64 for length, _, _ in calls), calls
    assert all("\r" not in message["content"] for _, _, message in calls)
    assert "brisklm: error: this line is not UTF-8 text (column 4); it got no reply" in captured.err
    assert calls[-1][2]["content"] == "Bye"


def test_a_refused_line_leaves_the_history_as_it_was(model_dir, capsys, monkeypatch):
    # The turns before a message too long for the context were dropped while trying to fit it.
    from brisklm import cli

    histories = []
    reply_request = cli._reply_request

    def recording(llm, messages, params, template_vars):
        histories.append([m["content"] for m in messages if m["role"] == "user"])
        return reply_request(llm, messages, params, template_vars)

    monkeypatch.setattr(cli, "_reply_request", recording)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n" + "word " * 80 + "\nBye\n"))
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "4"]
    assert main([*argv, "--max-seq-len", "64"]) == 1
    assert histories == [["Hi"], ["Hi", "Bye"]]
    assert "dropped" not in capsys.readouterr().err


def test_chat_at_a_terminal_ends_with_0_after_refusing_a_line(model_dir, capsys, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal("word " * 80 + "\nHi\n"))
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "4"]
    code = main([*argv, "--max-seq-len", "64"])
    captured = capsys.readouterr()
    assert code == 0 and "does not fit the context of 64 tokens" in captured.err
    assert "got no reply" not in captured.err


def test_kv_cache_dtype_flag_reaches_the_engine(model_dir, capsys, monkeypatch):
    from brisklm.llm import LLM

    seen = {}
    original = LLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        llm = original(cls, *args, **kwargs)
        seen["cache"] = llm.engine.runner.kv_cache.keys.dtype
        return llm

    monkeypatch.setattr(LLM, "from_pretrained", classmethod(spy))
    argv = ["generate", "--model", str(model_dir), "--kv-cache-dtype", "bfloat16"]
    code = main([*argv, "--temperature", "0", "--max-tokens", "3", "--ignore-eos", "hi"])
    assert code == 0 and seen["cache"] == torch.bfloat16
    assert capsys.readouterr().out  # the completion streamed


@pytest.mark.parametrize(
    "option, flags, expected",
    [
        ("cuda_graphs", [], True),
        ("cuda_graphs", ["--no-cuda-graphs"], False),
        ("prefix_caching", [], True),
        ("prefix_caching", ["--no-prefix-caching"], False),
        ("max_decode_steps", [], 8),
        ("max_decode_steps", ["--max-decode-steps", "1"], 1),
    ],
)
def test_engine_switches_reach_the_engine(model_dir, capsys, monkeypatch, option, flags, expected):
    from brisklm.llm import LLM

    seen = {}
    original = LLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen["argument"] = kwargs[option]
        llm = original(cls, *args, **kwargs)
        seen["config"] = getattr(llm.engine.config, option)
        return llm

    monkeypatch.setattr(LLM, "from_pretrained", classmethod(spy))
    argv = ["generate", "--model", str(model_dir), *flags, "--max-tokens", "2", "hi"]
    assert main(argv) == 0
    assert seen == {"argument": expected, "config": expected}
    assert capsys.readouterr().out


def test_a_bad_max_decode_steps_is_one_line(model_dir, capsys):
    code = main(["generate", "--model", str(model_dir), "--max-decode-steps", "0", "hi"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert "--max-decode-steps must be an int >= 1" in err


def test_a_json_schema_file_with_bad_json_is_named_as_such(model_dir, capsys, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object",\n}', encoding="utf-8")
    code = main(["generate", "--model", str(model_dir), "--json-schema", str(schema), "x"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert f"--json-schema file {str(schema)!r} is not valid JSON: " in err
    assert "at line 2, column 1" in err  # it used to say "neither a file nor valid JSON"


def _pipe_holding(text: str) -> str:
    """A /dev/fd path to a pipe holding ``text``, as a shell's <(...) gives: no regular file."""
    read, write = os.pipe()
    os.write(write, text.encode("utf-8"))
    os.close(write)
    return f"/dev/fd/{read}"


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_schemas_grammars_and_calibration_text_may_come_from_pipes(model_dir, capsys):
    # <(...) and /dev/stdin were "file ... does not exist" (grammar, calibration) or "neither a
    # file nor valid JSON text" (schema): only regular files were read.
    from brisklm.quant.calibration import read_calibration_samples

    argv = ["generate", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "3"]
    schema = _pipe_holding('{"type": "string", "enum": ["yes", "no"]}')
    assert main([*argv, "--json-schema", schema, "x"]) == 0
    out = capsys.readouterr().out.strip()
    assert '"yes"'.startswith(out) or '"no"'.startswith(out), out
    grammar = _pipe_holding('start: "ok"\n')
    assert main([*argv, "--grammar", grammar, "x"]) == 0
    assert capsys.readouterr().out.startswith("ok")
    # A pipe's name has no suffix: GBNF from one was read as Lark ("root ::= ..." is no rule).
    gbnf = ["--grammar-syntax", "gbnf", "--grammar", _pipe_holding('root ::= "ok"\n')]
    assert main([*argv, *gbnf, "x"]) == 0
    assert capsys.readouterr().out.startswith("ok")
    assert read_calibration_samples(_pipe_holding("one\n\ntwo\n")) == ["one", "two"]


def _broken_copy(model_dir, directory, file: str, text: str):
    shutil.copytree(model_dir, directory)
    (directory / file).write_text(text)
    return directory


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        # Tracebacks: the tokenizers library's bare Exception, a template's ZeroDivisionError,
        # jinja's OverflowError for range() past 100,000.
        ("tokenizer.json", "{}", "tokenizer.json: not a tokenizer the tokenizers library can load"),
        ("chat_template.jinja", "{{ 1 // 0 }}", "the chat template failed on these messages (Zero"),
        ("chat_template.jinja", "{% for i in range(10**6) %}{% endfor %}", "(OverflowError: "),
        # Reported as "unsupported quantization: .../config.json: not valid JSON".
        ("config.json", "[]", "config.json: expected a JSON object"),
    ],
)
def test_broken_checkpoint_files_are_one_line_errors(
    model_dir, tmp_path, capsys, monkeypatch, file, text, message
):
    broken = _broken_copy(model_dir, tmp_path / "broken", file, text)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    assert main(["chat", "--model", str(broken), "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("brisklm: error: ") and err.count("\n") == 1
    assert message in err and "unsupported quantization" not in err


def test_closed_standard_streams_and_text_flags_that_are_not_utf8(model_dir, capsys, monkeypatch):
    # A closed stdin/stdout (`<&-`, `>&-`) was an AttributeError traceback; a --choice with bytes
    # that are not UTF-8 an llguidance message about lone surrogates.
    argv = ["--model", str(model_dir), "--max-tokens", "2"]
    monkeypatch.setattr(sys, "stdin", None)
    assert main(["chat", *argv]) == 1
    assert "stdin is closed: chat reads the messages from it" in capsys.readouterr().err
    assert main(["generate", *argv, "-"]) == 1
    assert "stdin is closed: `generate -` reads the prompt from it" in capsys.readouterr().err
    assert main(["generate", *argv, "--choice", "yes", "--choice", "n\udcffo", "x"]) == 1
    assert "--choice 'n\\udcffo' is not UTF-8 text (column 2)" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["generate", *argv, "x"]) == 1
    assert "stdout is closed" in capsys.readouterr().err


def test_chat_says_when_the_context_ended_a_reply(model_dir, capsys, monkeypatch):
    # The newest message alone may leave less than --max-tokens of room: the reply was cut
    # there with no word (generate says so).
    monkeypatch.setattr(sys, "stdin", io.StringIO("word " * 10 + "\nHi\n"))
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--ignore-eos"]
    assert main([*argv, "--max-tokens", "100", "--max-seq-len", "64"]) == 0
    err = capsys.readouterr().err
    assert err.count("brisklm: the context of 64 tokens ended the output after ") == 2, err
    assert "of --max-tokens 100 (raise --max-seq-len for more)" in err


def test_a_closed_stderr_keeps_stdout_to_the_output(model_dir, capsys, monkeypatch):
    # print(..., file=None) writes to stdout: --usage's JSON and errors landed in the output.
    monkeypatch.setattr(sys, "stderr", None)
    argv = ["generate", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "3"]
    assert main([*argv, "--usage", "x"]) == 0
    out = capsys.readouterr().out
    assert "prompt_tokens" not in out and out.endswith("\n") and out.count("\n") == 1
    assert main([*argv, "--top-p", "0", "x"]) == 1
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(sys, "stderr", None)  # (main made it devnull)
    with pytest.raises(SystemExit):  # argparse's own errors too (they came before the swap)
        main(["generate", "--bogus", "x"])
    assert capsys.readouterr().out == ""


def test_prompts_that_are_not_utf8_are_named_in_the_clis_terms(model_dir, capsys, monkeypatch):
    # It said "surrogates not allowed at position 2 ('\udce9')", a 0-based Python position.
    argv = ["generate", "--model", str(model_dir), "--max-tokens", "2"]
    assert main([*argv, "ab\udce9c"]) == 1
    assert "brisklm: error: the prompt is not UTF-8 text (column 3)\n" == capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO("caf\udce9\n"))
    assert main([*argv, "-"]) == 1
    err = capsys.readouterr().err
    assert (
        err == "brisklm: error: the prompt read from stdin is not UTF-8 text (line 1, column 4)\n"
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("first line\nsecond \udce9\n"))
    assert main([*argv, "-"]) == 1
    assert "is not UTF-8 text (line 2, column 8)" in capsys.readouterr().err
    # A strict decoder (a UTF-8 locale's) raised "'utf-8' codec can't decode byte 0xff" first.
    env = {**cli_env(), "PYTHONIOENCODING": "utf-8:strict"}
    result = subprocess.run(
        [*CLI, *argv, "-"], input=b"ab\xffc", capture_output=True, timeout=120, env=env
    )
    assert result.returncode == 1
    assert result.stderr.decode() == (
        "brisklm: error: the prompt read from stdin is not UTF-8 text (line 1, column 3)\n"
    )


def test_empty_paths_and_speculative_flags_without_a_draft_are_refused(model_dir, capsys):
    # Path("") is the current directory: `--model ""` loaded a checkpoint from there.
    argv = ["generate", "--max-tokens", "2"]
    for flags, message in [
        (["--model", ""], "--model is empty: give a directory"),
        (["--model", str(model_dir), "--draft", ""], "--draft is empty: give a directory"),
        # It was ignored (no speculation, exit 0) where --draft-length was refused.
        (
            ["--model", str(model_dir), "--num-speculative-tokens", "3"],
            "--num-speculative-tokens needs speculative decoding: pass --draft",
        ),
    ]:
        assert main([*argv, *flags, "x"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"brisklm: error: {message}") and err.count("\n") == 1
    assert main([*argv, "--model", str(model_dir), "--grammar", "", "x"]) == 1
    assert "--grammar is empty: give a grammar file" in capsys.readouterr().err
    quantize = ["quantize", "--model", str(model_dir), "--out", ""]
    assert main(quantize) == 1
    assert "--out is empty: give a directory" in capsys.readouterr().err
    ngram = ["--model", str(model_dir), "--draft", "ngram"]
    assert main([*argv, *ngram, "x"]) == 0
    assert main([*argv, *ngram, "--num-speculative-tokens", "2", "x"]) == 0


def test_python_m_brisklm_runs_the_cli():
    result = subprocess.run(
        [sys.executable, "-m", "brisklm", "generate", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert result.returncode == 0 and "--max-tokens" in result.stdout


def test_a_model_without_a_chat_template_names_what_the_cli_can_do(
    model_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    plain = tmp_path / "plain"
    shutil.copytree(model_dir, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["chat", "--model", str(plain)]) == 1
    err = capsys.readouterr().err
    assert "has no chat template" in err and "use `brisklm generate` instead" in err
    assert "chat_template=" not in err  # the API's keyword, which the CLI has no flag for


def test_a_json_schema_directory_is_named_as_such(model_dir, capsys, tmp_path):
    code = main(["generate", "--model", str(model_dir), "--json-schema", str(tmp_path), "x"])
    err = capsys.readouterr().err
    # It said "--json-schema is neither a file nor valid JSON text (Expecting value: ...)".
    assert code == 1 and err.count("\n") == 1
    assert f"--json-schema {str(tmp_path)!r} is a directory: give a schema file or" in err


def test_a_json_schema_text_longer_than_a_file_name_can_be_is_the_schema(model_dir, capsys):
    properties = {f"field_number_{i}": {"type": "integer"} for i in range(12)}
    schema = json.dumps({"type": "object", "properties": properties})
    assert len(schema) > 255  # NAME_MAX: asked whether it is a file, the system says "too long"
    argv = ["generate", "--model", str(model_dir), "--json-schema", schema, "--max-tokens", "2"]
    code = main([*argv, "x"])
    # It said "--json-schema file '{...}' cannot be read ([Errno 36] File name too long ...)".
    assert code == 0 and "--json-schema" not in capsys.readouterr().err


def test_a_system_message_that_fills_the_context_is_refused_at_start(
    model_dir, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nHello\n"))
    argv = ["chat", "--model", str(model_dir), "--max-seq-len", "32", "--system", "word " * 40]
    code = main(argv)
    captured = capsys.readouterr()
    # It refused every line and exited 0.
    assert code == 1 and captured.out == ""
    assert (
        captured.err.startswith("brisklm: error: --system takes ") and captured.err.count("\n") == 1
    )
    assert "context holds 32" in captured.err


def test_a_system_message_that_leaves_no_room_for_a_turn_is_refused_at_start(
    model_dir, capsys, monkeypatch
):
    from brisklm.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(model_dir)

    def length(system, *turns):
        messages = [{"role": "system", "content": system}]
        messages += [{"role": "user", "content": turn} for turn in turns]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return len(tokenizer.encode(text, add_special_tokens=False))

    # A system message that fits the context alone, but not with even an empty user turn.
    system = next(
        "word " * n for n in range(1, 32) if length("word " * n) < 32 <= length("word " * n, "")
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nHello\n"))
    code = main(["chat", "--model", str(model_dir), "--max-seq-len", "32", "--system", system])
    captured = capsys.readouterr()
    # It refused each line ("this message alone does not fit") and exited 0.
    assert code == 1 and captured.out == ""
    assert captured.err.startswith("brisklm: error: --system takes ")
    assert captured.err.count("\n") == 1 and "context holds 32" in captured.err


def test_a_max_seq_len_whose_kv_cache_cannot_fit_is_one_clear_line(model_dir):
    # A subprocess: stderr as the user sees it, logging's warnings included.
    argv = ["generate", "--model", str(model_dir), "--max-seq-len", "1000000000", "hi"]
    result = subprocess.run([*CLI, *argv], capture_output=True, text=True, env=cli_env())
    # It printed a warning that 1000000000 is past max_position_embeddings, then the allocator's
    # message ("DefaultCPUAllocator: can't allocate memory: you tried to allocate ...").
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    # Its advice named max_batch_size (no flag: the CLI runs one sequence) and max_seq_len.
    assert result.stderr.startswith("brisklm: error: --max-seq-len 1000000000 needs a KV cache of ")
    assert "--max-seq-len can be at most " in result.stderr
    assert "the model's max_position_embeddings is " in result.stderr
    assert "max_batch_size" not in result.stderr and "max_seq_len" not in result.stderr


def test_warnings_are_lines_of_the_cli_in_its_terms(model_dir, capsys):
    """It printed logging's bare message, in the API's terms: "max_seq_len=512 is past ..."."""
    import logging

    limit = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    argv = ["generate", "--model", str(model_dir), "--max-seq-len", str(2 * limit), "hi"]
    logger = logging.getLogger("brisklm")
    handlers, propagate = list(logger.handlers), logger.propagate
    assert main([*argv, "--max-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"brisklm: warning: --max-seq-len {2 * limit} is past the model's ")
    assert err.count("\n") == 1
    assert logger.handlers == handlers and logger.propagate == propagate  # as they were


def test_logged_errors_are_error_lines_with_their_traceback(capsys):
    """A served request's failure (logger.error with exc_info) came out as the bare line
    "brisklm: warning: request failed": no cause, no traceback."""
    import argparse
    import logging

    from brisklm.cli import _warnings_as_lines

    logger = logging.getLogger("brisklm.server.app")
    with _warnings_as_lines(argparse.Namespace()):
        try:
            raise RuntimeError("the engine broke")
        except RuntimeError as error:
            logger.error("request failed", exc_info=error)
        logger.info("not shown")
    err = capsys.readouterr().err
    assert err.startswith("brisklm: error: request failed\nTraceback (most recent call last):")
    assert "RuntimeError: the engine broke" in err and "not shown" not in err


def test_version():
    result = subprocess.run(
        [*CLI, "--version"], capture_output=True, text=True, timeout=120, env=cli_env()
    )
    assert result.returncode == 0 and result.stdout == f"brisklm {brisklm.__version__}\n"


def test_a_closed_pipe_ends_generation_quietly():
    argv = ["generate", "--max-tokens", "200", "--ignore-eos", "--temperature", "0", "Once"]
    process = cli_process(argv)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(1)  # the reader takes one byte and goes, as `head -c 1` does
    process.stdout.close()
    err = process.stderr.read().decode()
    # It printed "brisklm: error: [Errno 32] Broken pipe" and exited 1.
    assert process.wait(timeout=120) == 141
    assert err == ""


def test_a_pipe_closed_before_the_last_newline_ends_quietly(model_dir):
    # --regex "" allows only the empty output: the one thing written is the final newline, which
    # sat in stdout's buffer (a pipe's is not line-buffered) until the interpreter's exit.
    process = cli_process(
        ["generate", "--model", str(model_dir), "--regex", "", "hi"], buffered=True
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the model has loaded
    err = process.stderr.read().decode()
    # It printed "Exception ignored in: ... BrokenPipeError" and exited 120.
    assert process.wait(timeout=120) == 141
    assert err == ""


def _fresh_interpreter(script: str) -> str:
    """What ``script`` prints in a new Python process (this one has imported torch already)."""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_help_and_import_do_not_load_torch():
    # `import brisklm` imported torch (1.5 of `brisklm --help`'s 2 s here); its names now load on
    # first use. In a fresh interpreter, since this one has torch.
    script = (
        "import sys, brisklm, brisklm.speculative\n"
        "from brisklm.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print('torch' in sys.modules)\n"
        "from brisklm import LLM, SamplingParams\n"
        "print('torch' in sys.modules, LLM.__name__, SamplingParams.__name__)\n"
        "print(all(getattr(brisklm, n) is not None for n in brisklm.__all__),"
        " set(brisklm.__all__) <= set(dir(brisklm)))\n"
        "print(brisklm.speculative.DEFAULT_NUM_SPECULATIVE_TOKENS)\n"
        "try:\n    brisklm.nope\nexcept AttributeError as e:\n    print(e)\n"
    )
    stdout = _fresh_interpreter(script)
    from brisklm.speculative import DEFAULT_NUM_SPECULATIVE_TOKENS

    assert stdout.splitlines() == [
        "False",
        "True LLM SamplingParams",
        "True True",
        str(DEFAULT_NUM_SPECULATIVE_TOKENS),
        "module 'brisklm' has no attribute 'nope'",
    ]


def test_ctrl_c_while_torch_loads_is_held_until_the_import_is_done():
    # An interrupt inside numpy's or torch's extension modules left them half-initialised ("cannot
    # load module more than once per process", or the interrupt lost). Here SIGINT arrives as the
    # import starts: it must wait for the import, then end the run with 130. Fresh interpreter.
    script = (
        "import builtins, os, signal, sys\n"
        "from brisklm import cli\n"
        "real_import = builtins.__import__\n"
        "def importing(name, *args, **kwargs):\n"
        "    if name == 'brisklm.llm':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real_import(name, *args, **kwargs)\n"
        "builtins.__import__ = importing\n"
        "code = cli.main(['generate', '--model', '/nonexistent', 'Hello'])\n"
        "print(code, 'brisklm.llm' in sys.modules, signal.getsignal(signal.SIGINT).__name__)\n"
    )
    stdout = _fresh_interpreter(script)
    assert stdout.split() == ["130", "True", "default_int_handler"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--port", "70000"], "--port must be in"),
        (["--max-batch-size", "0"], "at least 1"),
        (["--port", "0", "--prefix-cache-slots", "-1"], "--prefix-cache-slots must be an int >= 0"),
        (
            ["--port", "0", "--prefill-chunk-size", "0"],
            "--prefill-chunk-size must be an int >= 1 (",
        ),
        (
            ["--port", "0", "--prefix-cache-slots", "2", "--no-prefix-caching"],
            "--prefix-cache-slots 2 needs prefix caching (no --no-prefix-caching)",
        ),
    ],
)
def test_serve_refuses_bad_flags_before_loading(flags, words, capsys) -> None:
    assert main(["serve", *flags]) == 1
    assert words in capsys.readouterr().err


def test_serve_passes_its_engine_flags_to_the_llm(capsys, monkeypatch) -> None:
    # --prefill-chunk-size: the README's advice for prefix reuse on CUDA had no flag.
    from brisklm.llm import LLM

    given = {}

    def loading(model, **kwargs):
        given.update(kwargs)
        raise ValueError("stopped before loading")

    monkeypatch.setattr(LLM, "from_pretrained", staticmethod(loading))
    flags = ["--prefill-chunk-size", "64", "--max-batch-size", "3", "--prefix-cache-slots", "2"]
    assert main(["serve", "--port", "0", *flags]) == 1
    assert "stopped before loading" in capsys.readouterr().err
    assert (given["prefill_chunk_size"], given["max_batch_size"]) == (64, 3)
    assert given["prefix_cache_slots"] == 2


@pytest.fixture
def qwen3_chat(tmp_path, capsys, monkeypatch):
    """A tiny Qwen3 checkpoint's directory, and the (llm, request) of each reply that
    ``brisklm chat`` makes, as it makes them."""
    from brisklm import cli
    from tests.engine.test_qwen3 import make_qwen3_checkpoint

    directory, _ = make_qwen3_checkpoint(tmp_path / "qwen3")
    capsys.readouterr()  # (the checkpoint's writing)
    made = []
    reply_request = cli._reply_request

    def recording(llm, messages, params, template_vars):
        request = reply_request(llm, messages, params, template_vars)
        made.append((llm, request))
        return request

    monkeypatch.setattr(cli, "_reply_request", recording)
    return directory, made


def test_chat_decodes_a_constraint_after_the_thinking_as_llm_chat_does(qwen3_chat, monkeypatch):
    # brisklm chat made its requests without LLM.chat_decoding: a --regex applied from the first
    # token of a reasoning model's reply, which could then not think.
    from brisklm import AfterThinking, Regex

    directory, made = qwen3_chat
    argv = ["chat", "--model", str(directory), "--regex", "[a-z]+", "--max-tokens", "3"]
    for variables in ([], ["--template-var", "enable_thinking=false"]):
        monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
        assert main([*argv, *variables]) == 0
    constraints = [request.params.constraint for _, request in made]
    assert constraints == [AfterThinking(Regex("[a-z]+")), Regex("[a-z]+")]


def test_chat_template_vars_reach_the_template(qwen3_chat, capsys, monkeypatch):
    # Qwen3's enable_thinking=false: the prompt of each reply closes an empty thinking block.
    directory, made = qwen3_chat
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nAgain\n"))
    argv = ["chat", "--model", str(directory), "--temperature", "0", "--max-tokens", "3"]
    assert main([*argv, "--template-var", "enable_thinking=false"]) == 0
    decode = [
        llm.tokenizer.decode(r.prompt_token_ids, skip_special_tokens=False) for llm, r in made
    ]
    assert len(decode) == 2 and all(p.endswith("<think>\n\n</think>\n\n") for p in decode)
    for bad, message in [
        ("enable_thinking", "is not NAME=VALUE"),
        ("temperature=0", "not a chat template variable: use --temperature"),
        # the flags, not the Python API's params=SamplingParams(...)
        (
            "max_tokens=5",
            "max_tokens is a request option, not a chat template variable: use --max-tokens",
        ),
        ("response_format={}", "use --json-schema or --json"),
        ("tool_choice=1", "brisklm chat has no flag for it"),
        ("json_object=true", "use --json"),
        ("add_generation_prompt=false", "add_generation_prompt is not a chat option"),
        # chat's own arguments (they collided with a Python error, or took the tools silently)
        ("messages=1", "brisklm chat sets messages itself"),
        ("tools=[]", "brisklm chat sets tools itself"),
        ("self=1", "brisklm chat sets self itself"),
    ]:
        assert main([*argv, "--template-var", bad]) == 1
        err = capsys.readouterr().err
        assert err.startswith("brisklm: error: --template-var") and message in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_ctrl_c_at_a_terminal_stops_the_reply_and_the_chat_goes_on(model_dir, capsys, monkeypatch):
    """It ended the whole session (exit 130), the history lost; piped, it still ends it."""
    import contextlib

    original = LLM.stream_request
    interrupted: list[str] = []

    def stream_request(self, request):
        with contextlib.closing(original(self, request)) as chunks:
            for chunk in chunks:
                yield chunk
                if chunk.text and not interrupted:
                    interrupted.append(chunk.text)
                    raise KeyboardInterrupt

    monkeypatch.setattr(LLM, "stream_request", stream_request)
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "6"]
    monkeypatch.setattr(sys, "stdin", _Terminal("Hello\nHi\n"))
    assert main([*argv, "--ignore-eos"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "brisklm: reply stopped (Ctrl-C at the prompt quits)\n"
    with LLM.from_pretrained(model_dir, show_progress=False) as llm:
        history = [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": interrupted[0]},  # what was shown of it
            {"role": "user", "content": "Hi"},
        ]
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        second = llm.chat(history, params).content
    assert captured.out.endswith(f"> {interrupted[0]}\n> {second}\n> \n")
    interrupted.clear()
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\nHi\n"))
    assert main(argv) == 130
    assert capsys.readouterr().out == interrupted[0]


def test_chat_commands_are_listed_and_unknown_ones_refused(model_dir, capsys, monkeypatch):
    # "/help" went to the model as a message.
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "3"]
    monkeypatch.setattr(
        sys, "stdin", io.StringIO("/help\n/bogus\n/etc/hosts is a file\n/QUIT\nHi\n")
    )
    assert main(argv) == 1  # piped: a line that got no reply
    captured = capsys.readouterr()
    with LLM.from_pretrained(model_dir, show_progress=False) as llm:
        reply = llm.chat(
            [{"role": "user", "content": "/etc/hosts is a file"}],
            SamplingParams(temperature=0, max_tokens=3),
        )
    assert captured.out == reply.content + "\n"  # a path is a message; "Hi" came after /QUIT
    # piped, the list goes to stderr: stdout holds the replies alone
    assert captured.err.startswith("commands:\n  /reset") and "Ctrl-C stops a reply" in captured.err
    assert "brisklm: error: no command /bogus\ncommands:" in captured.err
    monkeypatch.setattr(sys, "stdin", _Terminal("/help\n"))
    assert main(argv) == 0 and "commands:\n  /reset" in capsys.readouterr().out


def test_a_constrained_output_cut_short_is_named(model_dir, capsys):
    argv = ["generate", "--model", str(model_dir), "--json", "--temperature", "0"]
    assert main([*argv, "--max-tokens", "3", "x"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "brisklm: --max-tokens ended the output before its constraint was met: the output does "
        "not match it\n"
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(captured.out)
    assert main([*argv, "--max-tokens", "20", "--max-seq-len", "6", "x"]) == 0
    err = capsys.readouterr().err
    assert "brisklm: the context of 6 tokens ended the output after" in err
    assert "brisklm: the context ended the output before its constraint was met" in err
    assert main([*argv, "--regex", "[ab]", "--max-tokens", "3", "x"]) == 1  # (two constraints)
    capsys.readouterr()
    regex = ["generate", "--model", str(model_dir), "--regex", "ab", "--temperature", "0", "x"]
    assert main(regex) == 0 and capsys.readouterr() == ("ab\n", "")  # met: nothing said
    # An open-ended constraint that --max-tokens ends where it is complete matches: it said
    # that it did not (found by a review).
    regex = ["generate", "--model", str(model_dir), "--regex", "[a-z]+", "--temperature", "0"]
    assert main([*regex, "--max-tokens", "4", "x"]) == 0
    out, err = capsys.readouterr()
    assert re.fullmatch("[a-z]+\n", out) and err == ""


def test_sampling_flags_under_greedy_decoding_are_named(model_dir, capsys, tmp_path):
    """The bundled models' generation_config.json asks for greedy decoding: --top-p and --seed
    alone changed nothing, and nothing said so."""
    greedy = tmp_path / "greedy"
    shutil.copytree(model_dir, greedy)
    (greedy / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    argv = ["generate", "--model", str(greedy), "--max-tokens", "2"]
    assert main([*argv, "--top-p", "0.5", "--seed", "3", "x"]) == 0
    assert capsys.readouterr().err == (
        "brisklm: --top-p and --seed change nothing: the model's generation_config.json asks for "
        "greedy decoding (give --temperature above 0 to sample)\n"
    )
    assert main([*argv, "--top-k", "5", "--temperature", "0", "x"]) == 0
    assert "--top-k change nothing: --temperature 0 asks for greedy" in capsys.readouterr().err
    assert main([*argv, "--top-p", "0.5", "--temperature", "1", "x"]) == 0
    assert capsys.readouterr().err == ""


def test_ctrl_c_as_a_line_is_refused_leaves_the_history_as_it_was(model_dir, capsys, monkeypatch):
    """A review found the refusal's pop and the interrupt's pop both taking a message: the
    history lost the reply before (two user turns in a row) or, empty, raised IndexError."""
    seen: list[list[str]] = []
    original = LLM.chat_prompt_ids

    def chat_prompt_ids(self, messages, *args, **kwargs):
        seen.append([m["role"] for m in messages])
        return original(self, messages, *args, **kwargs)

    class InterruptedErr(io.StringIO):
        def write(self, text: str) -> int:
            if "does not fit" in text:
                raise KeyboardInterrupt
            return super().write(text)

    monkeypatch.setattr(LLM, "chat_prompt_ids", chat_prompt_ids)
    argv = ["chat", "--model", str(model_dir), "--temperature", "0", "--max-tokens", "4"]
    for lines, roles in [
        (["Hello", "word " * 80, "Again"], ["user", "assistant", "user"]),
        (["word " * 80, "Again"], ["user"]),
    ]:
        seen.clear()
        monkeypatch.setattr(sys, "stdin", _Terminal("\n".join(lines) + "\n"))
        monkeypatch.setattr(sys, "stderr", InterruptedErr())
        assert main([*argv, "--max-seq-len", "64"]) == 0
        assert seen[-1] == roles
