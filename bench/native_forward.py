"""brisklm's native CPU forward pass against its torch ops (oneDNN-packed weights), in one process.

Loads the same random Llama-shaped checkpoint twice, once with the native kernels (row-major
weights) and once without (``BRISKLM_NATIVE_KERNELS=0``: packed weights, torch's ops), then
alternates rounds of: a streaming read of a 256 MB tensor, and for each path a prefill, decode steps
at one row and at eight rows through ``ModelRunner.forward``. Prints each round (the bandwidth of
this VM drifts within minutes, so rounds are compared side by side) and the step's share of the
streaming read beside it.

    python bench/native_forward.py --rounds 8
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from common import PRESETS, parse_checked, write_checkpoint
from engine_vs_transformers import decode_weight_bytes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="125m", choices=sorted(PRESETS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=64)
    args = parse_checked(parser)

    from brisklm.engine.model_runner import ForwardBatch, ModelRunner
    from brisklm.engine.scratch_thread import call_in_scratch_thread
    from brisklm.kernels import native
    from brisklm.loader import load_model

    if not native.available():
        raise SystemExit("the native kernels do not build on this machine")
    length = args.prefill_len + args.steps + 8

    def run(directory: Path) -> dict:
        # Everything on one thread: one OpenMP pool (see brisklm.engine.scratch_thread).
        model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
        runners = {"native": ModelRunner(model, num_slots=8, max_seq_len=length)}
        previous = os.environ.get(native.ENV_SWITCH)
        os.environ[native.ENV_SWITCH] = "0"
        native.library.cache_clear()
        try:
            packed = load_model(directory, device="cpu", dtype="float32", show_progress=False)
            runners["torch"] = ModelRunner(packed, num_slots=8, max_seq_len=length)
        finally:
            if previous is None:
                del os.environ[native.ENV_SWITCH]
            else:
                os.environ[native.ENV_SWITCH] = previous
            native.library.cache_clear()
        assert runners["native"].native is not None and runners["torch"].native is None
        stream = torch.randn(16384, 4096)
        prompt = torch.randint(
            3, 250, (args.prefill_len,), generator=torch.Generator().manual_seed(0)
        )
        rows: list[dict] = []
        with torch.inference_mode():
            for _ in range(args.rounds):
                start = time.perf_counter()
                for _ in range(30):
                    stream.sum()
                row = {"sum": 30 * stream.numel() * 4 / (time.perf_counter() - start)}
                for name, runner in runners.items():
                    start = time.perf_counter()
                    runner.forward(ForwardBatch([0], [0], [prompt.tolist()], [1]))
                    row[name + " prefill"] = time.perf_counter() - start
                    start = time.perf_counter()
                    for i in range(args.steps):
                        position = args.prefill_len + i
                        runner.forward(ForwardBatch([0], [position], [[7]], [1]))
                    row[name + " b1"] = (time.perf_counter() - start) / args.steps
                    start = time.perf_counter()
                    for i in range(args.steps // 2):
                        position = args.prefill_len + i
                        batch = ForwardBatch(list(range(8)), [position] * 8, [[7]] * 8, [1] * 8)
                        runner.forward(batch)
                    row[name + " b8"] = (time.perf_counter() - start) / (args.steps // 2)
                rows.append(row)
        return {"rows": rows, "bytes": decode_weight_bytes(model)}

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        call_in_scratch_thread(lambda: write_checkpoint(directory, args.preset, torch.float32))
        result = call_in_scratch_thread(lambda: run(directory))
    step_bytes = result["bytes"]
    print(f"model: {args.preset} preset, {step_bytes / 1e6:.0f} MB read per decode step, float32")
    print(
        "sum GB/s | b1 ms native (share) torch (share) | b8 ms native torch | prefill ms native torch"
    )
    for row in result["rows"]:
        share = {k: step_bytes / row[k + " b1"] / row["sum"] for k in ("native", "torch")}
        print(
            f"{row['sum'] / 1e9:6.1f} | {row['native b1'] * 1e3:6.2f} ({share['native']:4.0%}) "
            f"{row['torch b1'] * 1e3:6.2f} ({share['torch']:4.0%}) | "
            f"{row['native b8'] * 1e3:6.2f} {row['torch b8'] * 1e3:6.2f} | "
            f"{row['native prefill'] * 1e3:6.1f} {row['torch prefill'] * 1e3:6.1f}"
        )


if __name__ == "__main__":
    main()
