"""Checks the Triton int4 kernel's arithmetic in Triton's CPU interpreter; run by test_triton_int4.py.

Must run in a fresh process with TRITON_INTERPRET=1 (triton picks the interpreter at import).
Exits non-zero and prints the failing case when the kernel disagrees with the reference.
"""

from __future__ import annotations

import os
import sys

import torch
from conftest import random_gptq  # this script's own folder is on sys.path

from brisklm.quant import GPTQLinear, dequantize_gptq, kernel_layout
from brisklm.quant.triton_int4 import int4_matmul, make_triton_weight

# fp32 activations use the kernel's ieee fp32 dot: summation order only (1e-5 of sum |x||w|).
# fp16: w is rounded to fp16 for the dot and the output once more; bf16 (fp32 dot in the
# interpreter) only has its output rounded: 2^-7 of (sum |x||w| + |y|) covers both with room.
REL = {torch.float32: 1e-5, torch.float16: 2.0**-7, torch.bfloat16: 2.0**-7}


def check(
    name: str,
    y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rel: float,
    bias: torch.Tensor | None = None,
) -> None:
    ref = x.float() @ weight.t()
    if bias is not None:
        ref = ref + bias.float()
    bound = rel * (x.float().abs() @ weight.abs().t() + ref.abs()) + 1e-6
    err = (y.float() - ref).abs()
    if y.dtype != x.dtype or not bool((err <= bound).all()):
        print(f"FAIL {name}: dtype {y.dtype}, max err/bound {(err / bound).max().item():.3g}")
        sys.exit(1)
    print(f"ok   {name}: max err/bound {(err / bound).max().item():.3f}")


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    gen = torch.Generator().manual_seed(0)
    cases = [
        # (K, N, group_size, act_order, sym, format)
        (256, 96, 32, True, False, "gptq"),
        (256, 80, 64, False, True, "gptq"),
        (256, 64, 128, True, False, "gptq_v2"),
        (512, 48, -1, False, False, "gptq"),
    ]
    for idx, (num_in, num_out, group_size, act_order, sym, fmt) in enumerate(cases):
        t = random_gptq(
            num_in,
            num_out,
            group_size,
            act_order=act_order,
            sym=sym,
            checkpoint_format=fmt,
            seed=idx,
        )
        weight = dequantize_gptq(*t, checkpoint_format=fmt)  # (N, K), input column order
        layout = kernel_layout(*t, checkpoint_format=fmt)
        tw = make_triton_weight(
            layout.q, layout.scales.half(), layout.zeros, layout.perm, layout.group_size
        )
        assert (tw.perm is not None) == (act_order and group_size != -1)
        for rows in (1, 7, 33):
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                x = torch.randn(rows, num_in, generator=gen).to(dtype)
                for split_k in (None, 3):
                    name = f"K={num_in} N={num_out} g={group_size} act={act_order} sym={sym} {fmt} M={rows} {dtype} split={split_k}"
                    check(name, int4_matmul(x, tw, split_k=split_k), x, weight, REL[dtype])
        # Through the layer (bias, leading dims) on the "triton" backend.
        bias = torch.randn(num_out, generator=gen).half()
        layer = GPTQLinear.from_gptq_tensors(
            *t, bias=bias, checkpoint_format=fmt, backend="triton", keep_gptq_tensors=True
        )
        assert layer.backend == "triton"
        x = torch.randn(2, 3, num_in, generator=gen).bfloat16()
        y = layer(x)
        assert y.shape == (2, 3, num_out) and y.dtype == torch.bfloat16
        check(f"GPTQLinear triton {idx}", y.reshape(6, -1), x.reshape(6, -1), weight, 2.0**-7, bias)
        # compute_dtype=float32 (int4_compute_dtype="float32"): exact products whatever the
        # activations' dtype (it was ignored: half-precision activations rounded the weight).
        exact = GPTQLinear.from_gptq_tensors(
            *t, checkpoint_format=fmt, backend="triton", compute_dtype=torch.float32
        )
        assert exact.compute_dtype == torch.float32
        x = torch.randn(5, num_in, generator=gen).half()
        want = int4_matmul(x.float(), tw).half()  # the kernel's float32 path
        assert not torch.equal(int4_matmul(x, tw), want)  # the half path rounds otherwise
        assert torch.equal(exact(x), want), (
            f"float32 compute {idx}: {(exact(x) - want).abs().max()}"
        )
        check(f"GPTQLinear triton float32 {idx}", exact(x), x, weight, 2.0**-10)
    # A strided (non-contiguous) activation view.
    t = random_gptq(128, 32, 32, act_order=True, seed=9)
    layout = kernel_layout(*t)
    tw = make_triton_weight(
        layout.q, layout.scales.half(), layout.zeros, layout.perm, layout.group_size
    )
    x = torch.randn(256, 5, generator=gen).t()[:, :128]
    check("strided x", int4_matmul(x, tw), x, dequantize_gptq(*t), REL[torch.float32])
    # The probe that "auto" runs before choosing triton on CUDA passes where the kernel works.
    from brisklm.quant import int4_linear

    for compute_dtype in (None, torch.float32, torch.float16):
        for activations in (torch.bfloat16, torch.float16, torch.float32):
            int4_linear._probe_backend("triton", torch.device("cpu"), compute_dtype, activations)
    print("all triton interpreter checks passed")


if __name__ == "__main__":
    main()
