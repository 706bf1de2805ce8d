"""The native forward pass with its weights and KV cache on huge pages against 4 KB pages, in one process.

Loads the same random Llama-shaped checkpoint twice, once as brisklm loads it (packed weights and
KV cache on transparent huge pages where the machine gives them: ``brisklm.kernels.huge_pages``)
and once with ``BRISKLM_HUGE_PAGES=0`` (torch's allocator, 4 KB pages), then alternates rounds of:
a streaming read of a 256 MB tensor on each kind of page, and for each model decode steps at one row
and at eight rows through ``ModelRunner.forward``, in alternating order. This VM's bandwidth
drifts within seconds, so each round is printed side by side and the summary is the median of the
rounds' ratios. Both models compute the same bits (checked first).

    python bench/huge_pages_ab.py --rounds 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from common import PRESETS, write_checkpoint
from engine_vs_transformers import decode_weight_bytes

KINDS = ("4k", "huge")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="125m", choices=sorted(PRESETS))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--position", type=int, default=160, help="cached tokens before each step")
    parser.add_argument(
        "--steps", type=int, default=32, help="steps per round, model and row count"
    )
    args = parser.parse_args()

    from brisklm.engine.model_runner import ForwardBatch, ModelRunner
    from brisklm.engine.scratch_thread import call_in_scratch_thread
    from brisklm.kernels import huge_pages
    from brisklm.loader import load_model

    if not huge_pages.available():
        raise SystemExit(
            "this machine gives no huge pages (not Linux, or transparent_hugepage: never)"
        )

    def load(directory: Path, kind: str) -> tuple[ModelRunner, torch.Tensor]:
        with mock.patch.dict(os.environ, {huge_pages.ENV_SWITCH: "1" if kind == "huge" else "0"}):
            model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
            runner = ModelRunner(model, num_slots=8, max_seq_len=args.position + args.steps + 8)
            stream = huge_pages.empty((16384, 4096), torch.float32).normal_()
        if runner.native is None:
            raise SystemExit("this model does not run through the native kernels")
        return runner, stream

    def run(directory: Path) -> dict:
        # Everything on one thread: one OpenMP pool (see brisklm.engine.scratch_thread).
        loaded = {kind: load(directory, kind) for kind in KINDS}
        model = loaded["huge"][0].model
        on_huge = sum(huge_pages.backed_by_huge_pages(p) for p in model.parameters())
        prompt = torch.randint(3, 250, (args.position,), generator=torch.Generator().manual_seed(0))
        rows: list[dict[str, float]] = []
        with torch.inference_mode():
            logits = []
            for runner, _ in loaded.values():
                for slot in range(8):
                    runner.forward(ForwardBatch([slot], [0], [prompt.tolist()], [1]))
                logits.append(runner.forward(ForwardBatch([0], [args.position], [[7]], [1])))
            difference = (logits[0] - logits[1]).abs().max().item()
            for round_index in range(args.rounds):
                row: dict[str, float] = {}
                for kind in KINDS if round_index % 2 == 0 else KINDS[::-1]:
                    runner, stream = loaded[kind]
                    start = time.perf_counter()
                    for _ in range(10):
                        stream.sum()
                    row[kind + " sum"] = 10 * stream.numel() * 4 / (time.perf_counter() - start)
                    for width in (1, 8):
                        batch = ForwardBatch(
                            list(range(width)), [args.position] * width, [[7]] * width, [1] * width
                        )
                        samples = []
                        for _ in range(args.steps):
                            start = time.perf_counter()
                            runner.forward(batch)
                            samples.append(time.perf_counter() - start)
                        row[f"{kind} b{width}"] = statistics.median(samples)
                rows.append(row)
        return {
            "rows": rows,
            "bytes": decode_weight_bytes(model),
            "on_huge": on_huge,
            "difference": difference,
        }

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        call_in_scratch_thread(lambda: write_checkpoint(directory, args.preset, torch.float32))
        result = call_in_scratch_thread(lambda: run(directory))
    step_bytes = result["bytes"]
    print(
        f"model: {args.preset} preset, {step_bytes / 1e6:.0f} MB read per decode step, float32; "
        f"{result['on_huge'] / 1e6:.0f} MB of its parameters on huge pages; "
        f"largest |logit difference| {result['difference']:.3g}"
    )
    print("sum GB/s 4k huge | b1 ms 4k huge (huge/4k) | b8 ms 4k huge (huge/4k)")
    for row in result["rows"]:
        print(
            f"{row['4k sum'] / 1e9:5.1f} {row['huge sum'] / 1e9:5.1f} | "
            f"{row['4k b1'] * 1e3:6.2f} {row['huge b1'] * 1e3:6.2f} "
            f"({row['huge b1'] / row['4k b1']:.3f}) | "
            f"{row['4k b8'] * 1e3:6.2f} {row['huge b8'] * 1e3:6.2f} "
            f"({row['huge b8'] / row['4k b8']:.3f})"
        )
    rows = result["rows"]
    for name in ("sum", "b1", "b8"):
        # sum: bytes/s, so huge/4k > 1 is faster; steps: seconds, so < 1 is faster.
        ratio = statistics.median(row[f"huge {name}"] / row[f"4k {name}"] for row in rows)
        print(f"median huge/4k over {len(rows)} rounds, {name}: {ratio:.3f}")
    b1 = statistics.median(step_bytes / row["huge b1"] / row["huge sum"] for row in rows)
    print(
        f"one-token step with huge pages against the huge-page streaming read beside it: {b1:.0%}"
    )


if __name__ == "__main__":
    main()
