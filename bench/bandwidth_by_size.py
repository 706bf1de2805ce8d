"""How fast one read of a weight goes against the weight's size: the native kernels' single-token
product, F.linear on the column-major copy (MKL's gemv) and, where the machine gives huge pages, a
streaming float32 ``sum`` of as many bytes on huge pages (the faster adjacent reader of
engine_vs_transformers.py on the Zen 4), over weights of 4,096 columns from 64 MB to 1 GB
(float32), best of 15 bursts of 3 reads, over three rounds.

A decode step's roofline is its weight bytes over a read rate, and that rate depends on how much
of the weight the last-level cache holds: engine_vs_transformers.py reads weights as large as the
step's for that reason. On a CPU whose last-level cache is smaller than the smallest weight here
the columns are level.

    python bench/bandwidth_by_size.py
    python bench/bandwidth_by_size.py --sizes-mb 100,400,1600
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

SIZES_MB = (64, 256, 400, 1024)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes-mb", default=",".join(str(s) for s in SIZES_MB))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from brisklm.engine.scratch_thread import call_in_scratch_thread
    from brisklm.kernels import huge_pages, native

    sizes = [int(s) for s in args.sizes_mb.split(",")]

    def run() -> dict[tuple[str, int], list[float]]:
        readers = {}
        for size in sizes:
            rows = max(256, size * 2**20 // (4 * 4096) // 256 * 256)
            weight = torch.randn(rows, 4096)
            x = torch.randn(1, 4096)
            column_major = weight.t().contiguous().t()
            readers["F.linear, column-major", size] = (
                lambda x=x, w=column_major: torch.nn.functional.linear(x, w),
                weight.nbytes,
            )
            if native.available():
                packed = native.pack(weight)
                readers["native product", size] = (
                    lambda x=x, p=packed, rows=rows: native.linear(x, p, None, rows),
                    weight.nbytes,
                )
            del weight
            if huge_pages.available():
                stream = huge_pages.empty((rows, 4096), torch.float32, torch.device("cpu"))
                stream.normal_()
                readers["sum, huge pages", size] = (lambda s=stream: s.sum(), stream.nbytes)
        rates: dict[tuple[str, int], list[float]] = {key: [] for key in readers}
        for _ in range(args.rounds):
            for key, (read, nbytes) in readers.items():
                best = float("inf")
                for _ in range(15):
                    start = time.perf_counter()
                    for _ in range(3):
                        read()
                    best = min(best, (time.perf_counter() - start) / 3)
                rates[key].append(nbytes / best)
        return rates

    with torch.inference_mode():
        rates = call_in_scratch_thread(run)
    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads {torch.get_num_threads()}"
    )
    for (reader, size), values in rates.items():
        shown = " ".join(f"{v / 1e9:.1f}" for v in values)
        print(f"{reader:<24}{size:>6} MB: {shown} GB/s")


if __name__ == "__main__":
    main()
