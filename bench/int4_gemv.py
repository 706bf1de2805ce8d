"""CPU int4 GEMV/GEMM (GPTQLinear, torch's packed int4 kernel) vs float32 and bfloat16 products, same run.

    python bench/int4_gemv.py                     # 4096x4096 and 4096->11008, M = 1 and 8
    python bench/int4_gemv.py --shapes 4096x4096 --rows 1 --repeats 50

Prints min/median milliseconds per call, weight bytes, and ratios of min times (>1: int4 is faster). "int4 raw" is the
kernel alone on bf16 input; "int4 layer" is GPTQLinear.forward on the given input dtype (casts,
bias, act-order permutation included). The float baselines are F.linear (MKL, what transformers
runs) and the oneDNN-packed product brisklm runs for dense CPU weights ("pk"), where supported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from brisklm.models import packed_weights
from brisklm.quant import GPTQLinear, pack_gptq


def time_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(min, median) milliseconds per call for each function, measured round-robin so that load
    from other processes on a shared machine hits every candidate alike; min is the best estimate
    of the uncontended time and is what the ratios use."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: (min(v), statistics.median(v)) for name, v in samples.items()}


def random_layer(num_in: int, num_out: int, group_size: int, act_order: bool) -> GPTQLinear:
    gen = torch.Generator().manual_seed(0)
    num_groups = num_in // group_size
    q = torch.randint(0, 16, (num_out, num_in), generator=gen, dtype=torch.int32)
    zeros = torch.randint(1, 16, (num_groups, num_out), generator=gen, dtype=torch.int32)
    scales = (torch.rand(num_groups, num_out, generator=gen) * 0.01).half()
    g_idx = torch.arange(num_in, dtype=torch.int32) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(num_in, generator=gen)]
    t = pack_gptq(q, zeros, scales, g_idx)
    return GPTQLinear.from_gptq_tensors(*t, bias=None)


def weight_bytes(layer: GPTQLinear) -> int:
    return sum(b.numel() * b.element_size() for b in layer.buffers())


def make_candidates(
    layer: GPTQLinear, layer_act: GPTQLinear, w32: torch.Tensor, x32: torch.Tensor
) -> dict[str, Callable[[], object]]:
    w16, x16 = w32.bfloat16(), x32.bfloat16()
    candidates: dict[str, Callable[[], object]] = {
        "fp32": lambda: F.linear(x32, w32),
        "bf16": lambda: F.linear(x16, w16),
        "int4 raw": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x16, layer._packed, layer.kernel_group_size, layer._scales_zeros
        ),
        "layer bf16": lambda: layer(x16),
        "layer fp32": lambda: layer(x32),
        "act-order": lambda: layer_act(x16),
    }
    for name, w, x in (("fp32 pk", w32, x32), ("bf16 pk", w16, x16)):
        if packed_weights.packing_supported(w.dtype):
            packed = packed_weights.pack(w)
            candidates[name] = lambda x=x, packed=packed: packed_weights.packed_linear(
                x, packed, None
            )
        else:
            candidates[name] = candidates[name.split()[0]]
    return candidates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", default=["4096x4096", "4096x11008"], help="IN x OUT features"
    )
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, group_size {args.group_size}"
    )
    names = [
        "fp32",
        "fp32 pk",
        "bf16",
        "bf16 pk",
        "int4 raw",
        "layer bf16",
        "layer fp32",
        "act-order",
    ]
    print(
        f"{'K x N':>12} {'M':>3} "
        + " ".join(f"{n:>13}" for n in names)
        + f"  {'bf16/int4':>9} {'bf16pk/int4':>11} {'fp32/int4':>9}"
    )
    for shape in args.shapes:
        num_in, num_out = (int(v) for v in shape.lower().split("x"))
        layer = random_layer(num_in, num_out, args.group_size, act_order=False)
        layer_act = random_layer(num_in, num_out, args.group_size, act_order=True)
        w32 = torch.randn(num_out, num_in) * 0.02
        for rows in args.rows:
            x32 = torch.randn(rows, num_in)
            candidates = make_candidates(layer, layer_act, w32, x32)
            with torch.inference_mode():
                times = time_ms(candidates, args.repeats)
            best = {name: t[0] for name, t in times.items()}
            cells = " ".join(f"{times[n][0]:.3f}/{times[n][1]:.3f}".rjust(13) for n in names)
            print(
                f"{shape:>12} {rows:>3} {cells}  {best['bf16'] / best['layer bf16']:9.2f} "
                f"{best['bf16 pk'] / best['layer bf16']:11.2f} {best['fp32'] / best['layer fp32']:9.2f}"
            )
        mib = 1 << 20
        print(
            f"{'':>12} weights: fp32 {w32.numel() * 4 / mib:.1f} MiB, bf16 {w32.numel() * 2 / mib:.1f} MiB, "
            f"int4 layer {weight_bytes(layer) / mib:.1f} MiB (packed + scales/zeros)"
        )
    print(
        "cells: min/median ms per call; bf16/int4 = bf16 F.linear / int4 layer on bf16 input (min times);"
    )
    print("bf16pk/int4 = bf16 oneDNN-packed product (brisklm's dense CPU path) / int4 layer")
    print("fp32/int4 = fp32 F.linear / int4 layer on fp32 input, casts included (min times)")


if __name__ == "__main__":
    main()
