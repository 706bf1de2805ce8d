"""Time to a first reply from a fresh process: brisklm against transformers, in one run.

Each round starts one Python process per library, alternating, that imports it, loads the
checkpoint (brisklm: ``LLM.from_pretrained`` with its defaults, the KV cache included;
transformers: ``AutoModelForCausalLM.from_pretrained`` in the checkpoint's dtype) and greedily
generates ``--new-tokens`` tokens from a short prompt; the process reports the seconds of each
phase. Prints the medians over ``--rounds`` rounds and brisklm's speed-up (transformers' time
over brisklm's). transformers maps the safetensors file and reads the weights as its first pass
touches them, brisklm reads and packs them at load: the sum is the time a user waits.

    python bench/load_time.py                           # a random Qwen3-0.6B shape in bfloat16
    python bench/load_time.py --preset 125m --dtype float32
    python bench/load_time.py --model DIR
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import OTHER_FAMILY_PRESETS, PRESETS, parse_checked, write_checkpoint

# What each process runs: argv[1] the checkpoint, argv[2] the tokens to generate.
BRISKLM = """
import json, sys, time
start = time.perf_counter()
from brisklm import LLM, SamplingParams
imported = time.perf_counter()
llm = LLM.from_pretrained(sys.argv[1], show_progress=False)
loaded = time.perf_counter()
out = llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=int(sys.argv[2]),
                                                  ignore_eos=True))
done = time.perf_counter()
assert len(out.token_ids) == int(sys.argv[2])
print(json.dumps([imported - start, loaded - imported, done - loaded]))
"""
TRANSFORMERS = """
import json, sys, time
start = time.perf_counter()
import torch, transformers
imported = time.perf_counter()
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="auto")
loaded = time.perf_counter()
ids = tok("Hello there", return_tensors="pt").input_ids
with torch.inference_mode():
    out = model.generate(ids, max_new_tokens=int(sys.argv[2]), min_new_tokens=int(sys.argv[2]),
                         do_sample=False)
done = time.perf_counter()
assert out.shape[1] - ids.shape[1] == int(sys.argv[2])
print(json.dumps([imported - start, loaded - imported, done - loaded]))
"""
PHASES = ("import", "load", "first reply", "total")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--model", default=None, help="checkpoint directory")
    group.add_argument(
        "--preset",
        default="qwen3-0.6b",
        choices=sorted({*PRESETS, *OTHER_FAMILY_PRESETS}),
        help="a random model of bench/common.py (default: qwen3-0.6b)",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parse_checked(parser)
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.model
        if directory is None:
            directory = str(Path(tmp) / args.preset)
            write_checkpoint(Path(directory), args.preset, getattr(torch, args.dtype))
        run(args, directory)


def run(args: argparse.Namespace, directory: str) -> None:
    times: dict[str, list[list[float]]] = {"brisklm": [], "transformers": []}
    for _ in range(args.rounds):
        for name, script in (("brisklm", BRISKLM), ("transformers", TRANSFORMERS)):
            done = subprocess.run(
                [sys.executable, "-c", script, directory, str(args.new_tokens)],
                capture_output=True,
                text=True,
            )
            if done.returncode:  # the child's own error, not the script it ran
                raise SystemExit(f"{name} failed on {directory}:\n{done.stderr.strip()}")
            phases = json.loads(done.stdout.strip().splitlines()[-1])
            times[name].append([*phases, sum(phases)])
    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads "
        f"{torch.get_num_threads()}; model: {args.model or args.preset}"
        f"{'' if args.model else f' ({args.dtype})'}, {args.new_tokens} new tokens, "
        f"median of {args.rounds} rounds (seconds)"
    )
    print(f"{'phase':<13}{'brisklm':>10}{'transformers':>14}{'speed-up':>10}")
    for i, phase in enumerate(PHASES):
        ours = statistics.median(t[i] for t in times["brisklm"])
        theirs = statistics.median(t[i] for t in times["transformers"])
        print(f"{phase:<13}{ours:>10.2f}{theirs:>14.2f}{theirs / ours:>9.2f}x")


if __name__ == "__main__":
    main()
