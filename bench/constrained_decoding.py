"""Constrained vs unconstrained decoding on the same model, in one run.

Prints decode tokens/s with and without a JSON Schema at batch 1 and 8, the slowdown, the grammar
mask time per token (p50, p99) and the schema compile time (cold and cached).

    python bench/constrained_decoding.py                 # bundled model if present, else random 125M
    python bench/constrained_decoding.py --model DIR
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import now, parse_checked, write_checkpoint

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "maxLength": 32},
        "city": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "city", "tags", "active"],
}
PROMPT = "Extract the person as JSON: Ada Lovelace, 36, ada@example.com, lives in London, tags math and poetry."


def timed_generate(llm, prompts, params) -> tuple[float, list, int]:
    """(seconds, outputs, forward passes) of one generate call."""
    runner = llm.engine.runner
    passes = 0
    forward, forward_greedy = runner.forward, runner.forward_greedy

    def counting(batch):
        nonlocal passes
        passes += 1
        return forward(batch)

    def counting_greedy(batch, columns):  # greedy rows on raw logits: the kernels pick the token
        nonlocal passes
        passes += 1
        return forward_greedy(batch, columns)

    runner.forward, runner.forward_greedy = counting, counting_greedy
    try:
        start = now(llm.engine.device)
        outs = llm.generate(prompts, params)
        return now(llm.engine.device) - start, outs, passes
    finally:
        del runner.forward, runner.forward_greedy


def mask_times(llm, outputs) -> list[float]:
    """Replay each output through a fresh matcher, timing every bitmask fill (one row)."""
    from brisklm.constrained import JsonSchema, allocate_token_bitmask

    compiled = llm.engine.structured.compiler.compile(JsonSchema(SCHEMA))
    bitmask = allocate_token_bitmask(1, llm.tokenizer.vocab_size)
    times = []
    for out in outputs:
        matcher = compiled.matcher()
        for token in out.token_ids:
            start = time.perf_counter()
            matcher.fill_bitmask(bitmask, 0)
            times.append(time.perf_counter() - start)
            if not matcher.accept_token(token):
                break
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=120)
    args = parse_checked(parser)

    from brisklm import LLM, SamplingParams, default_model_path
    from brisklm.constrained import GrammarCompiler, JsonSchema

    tmp = None
    if args.model:
        model_dir = Path(args.model)
    else:
        try:
            model_dir = default_model_path()
        except FileNotFoundError:
            tmp = tempfile.TemporaryDirectory()
            model_dir = Path(tmp.name)
            write_checkpoint(model_dir, "125m", torch.float32)
    llm = LLM.from_pretrained(
        model_dir,
        max_batch_size=8,
        max_seq_len=512,
        show_progress=False,
        prefix_caching=False,  # repeated prompts: time their compute
    )

    start = time.perf_counter()
    GrammarCompiler(llm.tokenizer).compile(JsonSchema(SCHEMA))
    cold_compile = time.perf_counter() - start
    compiler = llm.engine.structured.compiler
    compiler.compile(JsonSchema(SCHEMA))
    start = time.perf_counter()
    compiler.compile(JsonSchema(SCHEMA))
    cached_compile = time.perf_counter() - start

    constrained = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, json_schema=SCHEMA)
    results = {}
    all_outputs = []
    for batch in (1, 8):
        prompts = [PROMPT] * batch
        llm.generate(prompts, constrained)  # warm-up
        best_c, outs, passes_c = min(
            (timed_generate(llm, prompts, constrained) for _ in range(args.repeats)),
            key=lambda r: r[0],
        )
        all_outputs += outs
        num_tokens = max(len(o.token_ids) for o in outs)
        free = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        best_f, _, passes_f = min(
            (timed_generate(llm, prompts, free) for _ in range(args.repeats)), key=lambda r: r[0]
        )
        tokens = sum(len(o.token_ids) for o in outs)
        results[batch] = (
            tokens / best_c,
            batch * num_tokens / best_f,
            num_tokens,
            best_c / passes_c,
            best_f / passes_f,
        )
    times = sorted(mask_times(llm, all_outputs))
    llm.close()

    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads {torch.get_num_threads()}"
    )
    print(f"model: {model_dir.name if args.model or tmp is None else 'random 125M Llama'}")
    print(f"compile: cold {cold_compile * 1e3:.1f} ms, cached {cached_compile * 1e6:.1f} us")
    print(
        f"mask per token: p50 {statistics.median(times) * 1e6:.0f} us, "
        f"p99 {times[int(0.99 * (len(times) - 1))] * 1e6:.0f} us over {len(times)} tokens"
    )
    print("tok/s counts forced tokens (fed without sampling); ms/pass isolates the mask overhead")
    print(
        f"{'batch':<7}{'tokens':>8}{'constrained tok/s':>19}{'free tok/s':>12}{'ratio':>8}"
        f"{'constrained ms/pass':>21}{'free ms/pass':>14}{'ratio':>8}"
    )
    for batch, (c_rate, f_rate, n, c_pass, f_pass) in results.items():
        print(
            f"{batch:<7}{n:>8}{c_rate:>19.1f}{f_rate:>12.1f}{c_rate / f_rate:>7.2f}x"
            f"{c_pass * 1e3:>21.1f}{f_pass * 1e3:>14.1f}{f_pass / c_pass:>7.2f}x"
        )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
