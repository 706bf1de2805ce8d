"""CPU int4 GEMV/GEMM (GPTQLinear through brisklm's native kernels and through torch's packed int4
kernel) vs float32 and bfloat16 products, same run.

    python bench/int4_gemv.py                     # 4096x4096 and 4096->11008, M = 1, 8 and 64
    python bench/int4_gemv.py --shapes 4096x4096 --rows 1 --repeats 50

Prints min/median milliseconds per call, weight bytes, and ratios of min times (>1: the native int4
layer is faster). "int4 nat" is GPTQLinear's "native" backend (the CPU default: float32 arithmetic
over the dequantized weight) on float32 input, "int4 act" the same with act-order groups;
"int4 torch" its "cpu" backend (torch's _weight_int4pack_mm_for_cpu, bfloat16) on bfloat16 input,
casts included (the layers have no bias). The float baselines are F.linear (MKL, what transformers runs) and the
native kernels' products over float32 and bfloat16 weights ("nat"), what brisklm runs for dense
CPU weights.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from brisklm.kernels import native
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


def random_layer(
    num_in: int, num_out: int, group_size: int, act_order: bool, backend: str
) -> GPTQLinear:
    gen = torch.Generator().manual_seed(0)
    group_size = num_in if group_size == -1 else group_size
    num_groups = -(-num_in // group_size)
    q = torch.randint(0, 16, (num_out, num_in), generator=gen, dtype=torch.int32)
    zeros = torch.randint(1, 16, (num_groups, num_out), generator=gen, dtype=torch.int32)
    scales = (torch.rand(num_groups, num_out, generator=gen) * 0.01).half()
    g_idx = torch.arange(num_in, dtype=torch.int32) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(num_in, generator=gen)]
    t = pack_gptq(q, zeros, scales, g_idx)
    return GPTQLinear.from_gptq_tensors(*t, bias=None, backend=backend)


def weight_bytes(layer: GPTQLinear) -> int:
    return sum(b.numel() * b.element_size() for b in layer.buffers())


def make_candidates(
    layers: dict[str, GPTQLinear], w32: torch.Tensor, x32: torch.Tensor
) -> dict[str, Callable[[], object]]:
    x16 = x32.bfloat16()
    rows = w32.shape[0]
    f32, bf16 = native.pack(w32), native.pack(w32.bfloat16())
    return {
        "fp32": lambda: F.linear(x32, w32),
        "fp32 nat": lambda: native.linear(x32, f32, None, rows),
        "bf16 nat": lambda: native.linear(x32, bf16, None, rows),
        "int4 torch": lambda: layers["torch"](x16),
        "int4 nat": lambda: layers["native"](x32),
        "int4 act": lambda: layers["act-order"](x32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", default=["4096x4096", "4096x11008"], help="IN x OUT features"
    )
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, group_size {args.group_size}"
    )
    if not native.available():
        raise SystemExit("the native CPU kernels do not build here (see the log)")
    names = ["fp32", "fp32 nat", "bf16 nat", "int4 torch", "int4 nat", "int4 act"]
    ratios = ["bf16 nat", "int4 torch", "fp32 nat"]
    print(
        f"{'K x N':>12} {'M':>3} "
        + " ".join(f"{n:>13}" for n in names)
        + "".join(f"{n + '/int4':>16}" for n in ratios)
    )
    for shape in args.shapes:
        num_in, num_out = (int(v) for v in shape.lower().split("x"))
        layers = {
            name: random_layer(num_in, num_out, args.group_size, act_order, backend)
            for name, act_order, backend in (
                ("torch", False, "cpu"),
                ("native", False, "native"),
                ("act-order", True, "native"),
            )
        }
        w32 = torch.randn(num_out, num_in) * 0.02
        for rows in args.rows:
            x32 = torch.randn(rows, num_in)
            candidates = make_candidates(layers, w32, x32)
            with torch.inference_mode():
                times = time_ms(candidates, args.repeats)
            best = {name: t[0] for name, t in times.items()}
            cells = " ".join(f"{times[n][0]:.3f}/{times[n][1]:.3f}".rjust(13) for n in names)
            shares = "".join(f"{best[n] / best['int4 nat']:16.2f}" for n in ratios)
            print(f"{shape:>12} {rows:>3} {cells}{shares}")
        mib = 1 << 20
        print(
            f"{'':>12} weights: fp32 {w32.numel() * 4 / mib:.1f} MiB, bf16 {w32.numel() * 2 / mib:.1f} MiB, "
            f"int4 native {weight_bytes(layers['native']) / mib:.1f} MiB (codes + zero points, scales), "
            f"int4 torch {weight_bytes(layers['torch']) / mib:.1f} MiB"
        )
    print("cells: min/median ms per call; X/int4 = X's min time / the native int4 layer's")


if __name__ == "__main__":
    main()
