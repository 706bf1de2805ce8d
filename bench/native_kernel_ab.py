"""Two builds of brisklm's native kernels (cpu_forward.c) against each other, in one process.

Each version is compiled with brisklm's flags and both are loaded into one ModelRunner, which then
calls them in turn: the same weights, cache and scratch buffers (so the ``brisk_forward_args``
struct must be the same in both versions). Rounds alternate between the two builds, in
alternating order, with forward calls of each row length at one cached position; each round keeps
the median call. This VM's memory bandwidth drifts within seconds, so two builds timed in separate
runs are not comparable; the kernel changes in docs/benchmarks.md were measured this way. Before
timing, both builds run the same calls on the same cache and the largest logit difference is
printed (0 where a change leaves the bits alone).

    python bench/native_kernel_ab.py --a rev:HEAD~1                   # against the working tree
    python bench/native_kernel_ab.py --a old.c --b new.c --preset 125m --position 512 --rows 1,6,8
    python bench/native_kernel_ab.py --a rev:HEAD~1 --flags=-mno-avx512f   # AVX2 code on AVX-512
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from common import PRESETS, write_checkpoint

SOURCE = Path(__file__).resolve().parents[1] / "src" / "brisklm" / "kernels" / "cpu_forward.c"


def source_text(spec: str) -> str:
    """A C file's text: ``rev:REV`` reads cpu_forward.c at a git revision, anything else is a path."""
    if spec.startswith("rev:"):
        relative = SOURCE.relative_to(SOURCE.parents[3]).as_posix()
        return subprocess.run(
            ["git", "show", f"{spec[4:]}:{relative}"],
            cwd=SOURCE.parents[3],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return Path(spec).read_text()


def build(text: str, directory: Path, name: str, flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    from brisklm.kernels import native

    compiler = native._compiler()
    if compiler is None:
        raise SystemExit("no C compiler (cc, gcc, clang or $CC) found")
    source, library = directory / f"{name}.c", directory / f"{name}.so"
    source.write_text(text)
    native.compile_library(compiler, source, library, flags)
    loaded = ctypes.CDLL(str(library))
    native._declare(loaded)
    return loaded


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a", required=True, help="a C file, or rev:REV for cpu_forward.c at REV")
    parser.add_argument("--b", default=str(SOURCE), help="likewise (default: the working tree's)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--model", default=None, help="checkpoint (default: bundled brisk-chat)")
    group.add_argument("--preset", choices=sorted(PRESETS), help="a random checkpoint of this size")
    parser.add_argument("--position", type=int, default=160, help="cached tokens before each call")
    parser.add_argument("--rows", default="1,6,8", help="tokens per call, comma-separated")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="the model's dtype (bfloat16 and float16 weights: arithmetic in float32)",
    )
    parser.add_argument(
        "--calls", type=int, default=None, help="per round and length (default: ~50 ms of them)"
    )
    parser.add_argument(
        "--flags",
        default="",
        help="more compiler flags for both builds, space-separated (-mno-avx512f: the AVX2 code)",
    )
    args = parser.parse_args()
    lengths = [int(n) for n in args.rows.split(",")]

    from brisklm.engine.model_runner import ForwardBatch, ModelRunner
    from brisklm.engine.scratch_thread import call_in_scratch_thread
    from brisklm.kernels import native
    from brisklm.llm import default_model_path
    from brisklm.loader import load_model

    if not native.available():
        raise SystemExit("the native kernels do not build on this machine")

    def run(directory: Path, libraries: dict[str, ctypes.CDLL]) -> None:
        # Everything on one thread: one OpenMP pool (see brisklm.engine.scratch_thread).
        model = load_model(directory, device="cpu", dtype=args.dtype, show_progress=False)
        runner = ModelRunner(model, 1, args.position + max(lengths) + 8)
        if runner.native is None:
            raise SystemExit("this model does not run through the native kernels")
        prompt = torch.randint(3, 250, (args.position,), generator=torch.Generator().manual_seed(0))
        batches = {
            n: ForwardBatch([0], [args.position], [list(range(10, 10 + n))], [n]) for n in lengths
        }
        with torch.inference_mode():
            for start in range(0, args.position, 64):
                chunk = prompt[start : start + 64].tolist()
                runner.forward(ForwardBatch([0], [start], [chunk], [1]))
            keys, values = runner.kv_cache.keys.clone(), runner.kv_cache.values.clone()
            for n, batch in batches.items():
                logits = []
                for library in libraries.values():
                    runner.kv_cache.keys.copy_(keys)
                    runner.kv_cache.values.copy_(values)
                    runner.native.lib = library
                    logits.append(runner.forward(batch))
                difference = (logits[0] - logits[1]).abs().max().item()
                print(f"{n} tokens: largest |logit difference| between the builds {difference:.3g}")
            calls = {}
            for n, batch in batches.items():  # about 50 ms of calls per round and row length
                start_time = time.perf_counter()
                for _ in range(5):
                    runner.forward(batch)
                each = (time.perf_counter() - start_time) / 5
                calls[n] = args.calls or min(400, max(8, int(0.05 / each)))
            times: dict[tuple[str, int], list[float]] = {}
            names = list(libraries)
            for round_index in range(args.rounds):
                for name in names if round_index % 2 == 0 else names[::-1]:
                    runner.native.lib = libraries[name]
                    for n, batch in batches.items():
                        samples = []
                        for _ in range(calls[n]):
                            start_time = time.perf_counter()
                            runner.forward(batch)
                            samples.append(time.perf_counter() - start_time)
                        times.setdefault((name, n), []).append(statistics.median(samples))
        print(f"ms per call at position {args.position}, median of {args.rounds} rounds")
        for n in lengths:
            a, b = (statistics.median(times[(name, n)]) * 1e3 for name in names)
            print(f"{n:4d} tokens: a {a:8.3f}  b {b:8.3f}  b/a {b / a:.3f}")

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        texts = {name: source_text(spec) for name, spec in (("a", args.a), ("b", args.b))}
        for name, text in texts.items():
            # Before the cache_type field a build reads every cache as float32, and a bfloat16 or
            # float16 model keeps a half-precision one.
            if args.dtype != "float32" and "cache_type" not in text:
                raise SystemExit(
                    f"--{name}: a source from before half-precision KV caches (commit 6e46f64) "
                    f"cannot run a {args.dtype} model; use --dtype float32"
                )
        flags = tuple(args.flags.split())
        libraries = {name: build(text, scratch, name, flags) for name, text in texts.items()}
        if args.preset:
            directory = scratch / "model"
            call_in_scratch_thread(lambda: write_checkpoint(directory, args.preset, torch.float32))
        else:
            directory = Path(args.model) if args.model else default_model_path()
        call_in_scratch_thread(lambda: run(directory, libraries))


if __name__ == "__main__":
    main()
