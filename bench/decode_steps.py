"""Batch-1 decode steps through ``ModelRunner.forward``, each timed alone: min, p10, median, p90.

The spread says how much of a run's mean is the machine (this VM's memory bandwidth moves between
steps) rather than the step. Everything runs on one scratch thread (one OpenMP pool), as the engine
runs it. A target for profilers, e.g. per thread:

    python bench/decode_steps.py --steps 300
    perf record -o perf.data python bench/decode_steps.py --steps 2000
    perf script -i perf.data -F tid,ip,sym | awk '{$2=""; print}' | sort | uniq -c | sort -rn | head
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from common import PRESETS, parse_checked, write_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="125m", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument(
        "--positions", type=int, default=64, help="steps cycle over this many cache positions"
    )
    args = parse_checked(parser)

    from brisklm.engine.model_runner import ForwardBatch, ModelRunner
    from brisklm.engine.scratch_thread import call_in_scratch_thread
    from brisklm.loader import load_model

    def run(directory: Path) -> list[float]:
        model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
        runner = ModelRunner(model, num_slots=1, max_seq_len=args.prompt_len + args.positions)
        print(f"native kernels: {runner.native is not None}")
        times = []
        with torch.inference_mode():
            prompt = list(range(3, 3 + args.prompt_len))
            runner.forward(ForwardBatch([0], [0], [prompt], [1]))
            for i in range(args.steps):
                position = args.prompt_len + i % args.positions
                start = time.perf_counter()
                runner.forward(ForwardBatch([0], [position], [[7]], [1]))
                times.append(time.perf_counter() - start)
        return times

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        call_in_scratch_thread(lambda: write_checkpoint(directory, args.preset, torch.float32))
        times = sorted(call_in_scratch_thread(lambda: run(directory)))
    n = len(times)
    shown = {"min": 0, "p10": n // 10, "median": n // 2, "p90": 9 * n // 10}
    print(
        f"{args.preset}: {n} batch-1 steps, ms: "
        + " ".join(f"{name} {times[i] * 1e3:.2f}" for name, i in shown.items())
    )


if __name__ == "__main__":
    main()
