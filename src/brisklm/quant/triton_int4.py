"""CUDA int4 matmul: our Triton kernel, fused dequant + matmul over GPTQ-packed weights, tuned for decode.

The weight stays in GPTQ's int32 [K/8, N] layout (in kernel column order: sorted by group for
act-order, with the activations gathered through `perm` inside the kernel), so each packed word is read
from memory once. For small M (decode, 1..16 rows) the N x M tiles are few, so K is split across
programs (split-K) until there are several programs per SM; partial sums go to an fp32 buffer and
are added at the end (deterministic, no atomics).

Triton is imported lazily. CPU tensors run in Triton's interpreter when TRITON_INTERPRET=1 was set
before triton was first imported (slow; that is how CI checks the kernel's arithmetic).
Block sizes are untuned first choices: see `choose_blocks`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from .gptq_format import pack_qweight

_INSTALL_HINT = (
    "the Triton int4 kernel needs triton: pip install 'brisklm[gpu]' (or pip install triton)"
)


@dataclass(frozen=True)
class TritonInt4Weight:
    """An int4 weight in the Triton kernel's layout."""

    qweight: torch.Tensor  # int32 [K/8, N], kernel column order
    scales: torch.Tensor  # [K/group_size, N], float (fp16 as the checkpoint stores it)
    zeros: torch.Tensor  # [K/group_size, N], integer zero points in the scales' dtype (exact)
    perm: torch.Tensor | None  # int32 [K]: kernel column j reads input perm[j]; None = identity
    group_size: int  # one of 32, 64, 128, 256

    @property
    def in_features(self) -> int:
        return self.qweight.shape[0] * 8

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1]


def triton_available() -> bool:
    """Whether triton can be imported (it is an optional dependency)."""
    return importlib.util.find_spec("triton") is not None


def make_triton_weight(
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    perm: torch.Tensor | None,
    group_size: int,
) -> TritonInt4Weight:
    """q int [K, N] codes 0..15 in kernel order, scales/zeros [K/group_size, N] -> kernel layout."""
    num_in, num_out = q.shape
    if group_size % 32 or num_in % group_size:
        raise ValueError(f"group_size {group_size} must be a multiple of 32 dividing K={num_in}")
    if tuple(scales.shape) != (num_in // group_size, num_out) or scales.shape != zeros.shape:
        raise ValueError(f"scales/zeros must be [{num_in // group_size}, {num_out}]")
    scale_dtype = scales.dtype if scales.dtype in (torch.float16, torch.bfloat16) else torch.float32
    return TritonInt4Weight(
        qweight=pack_qweight(q),
        scales=scales.to(scale_dtype).contiguous(),
        zeros=zeros.to(scale_dtype).contiguous(),
        perm=None if perm is None else perm.to(device=q.device, dtype=torch.int32).contiguous(),
        group_size=group_size,
    )


def choose_blocks(
    num_rows: int, num_out: int, num_in: int, group_size: int, num_sms: int
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K) for an (M, N, K) problem.

    Decode (M <= 16) is memory bound: BLOCK_M is tl.dot's minimum of 16, BLOCK_N 64, and while the
    M x N tiles alone give under two programs per SM, K is split until there are about four (into
    equal runs of K tiles, so no program is left without work). Larger M (over 32 rows) gets larger
    tiles and no split: it is compute bound, and partial sums would cost M x N x 4 bytes each.
    """
    block_m = 16 if num_rows <= 16 else 32 if num_rows <= 32 else 64
    block_n = 64 if num_rows <= 32 else 128
    block_k = min(128, group_size)
    tiles_mn = -(-num_rows // block_m) * -(-num_out // block_n)
    num_k_tiles = num_in // block_k
    if num_rows > 32 or tiles_mn >= 2 * num_sms:  # compute-bound, or the GPU is full already
        return block_m, block_n, block_k, 1
    wanted = max(1, min(num_k_tiles, -(-4 * num_sms // tiles_mn), 16))
    tiles_per_split = -(-num_k_tiles // wanted)
    return block_m, block_n, block_k, -(-num_k_tiles // tiles_per_split)


def int4_matmul(
    x: torch.Tensor,
    weight: TritonInt4Weight,
    *,
    split_k: int | None = None,
) -> torch.Tensor:
    """x [M, K] (fp16, bf16 or fp32) @ dequantized weight -> [M, N] in x's dtype.

    `split_k` overrides the heuristic's split of K (tests use it to cover the partial-sum path).
    """
    if not triton_available():
        raise ImportError(_INSTALL_HINT)
    from . import _triton_int4_kernel as kernels

    if x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"x must be [M, {weight.in_features}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"unsupported activation dtype {x.dtype}")
    interpret = kernels.interpreting()
    if x.device.type != "cuda" and not interpret:
        raise RuntimeError(
            "the Triton int4 kernel runs CPU tensors only in Triton's interpreter: "
            "set TRITON_INTERPRET=1 before triton is first imported"
        )
    num_rows, num_in = x.shape
    num_out = weight.out_features
    num_sms = (
        4
        if x.device.type != "cuda"
        else torch.cuda.get_device_properties(x.device).multi_processor_count
    )
    block_m, block_n, block_k, auto_split = choose_blocks(
        num_rows, num_out, num_in, weight.group_size, num_sms
    )
    split = auto_split if split_k is None else max(1, min(split_k, num_in // block_k))
    partial = torch.empty((split, num_rows, num_out), dtype=torch.float32, device=x.device)
    if num_rows == 0:
        return partial.sum(0).to(x.dtype)
    grid = (-(-num_out // block_n), -(-num_rows // block_m), split)
    perm = weight.perm if weight.perm is not None else weight.qweight  # any int tensor; unread
    args = (
        x,
        weight.qweight,
        weight.scales,
        weight.zeros,
        perm,
        partial,
        num_rows,
        num_out,
        num_in,
        x.stride(0),
        x.stride(1),
    )
    meta = dict(
        GROUP_SIZE=weight.group_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_K=split,
        HAS_PERM=weight.perm is not None,
        # Triton's interpreter has no bf16 matmul (numpy has no bf16), so there bf16 goes through
        # the fp32 dot; on CUDA bf16/fp16 use the tensor-core dot.
        DOT_FP32=x.dtype == torch.float32 or (interpret and x.dtype == torch.bfloat16),
    )
    if interpret:
        kernels.int4_matmul_kernel[grid](*args, **meta)
    else:
        # Triton launches on the current CUDA device, not on its arguments' device: a model on
        # cuda:1 ran its kernels against cuda:0 ("Pointer argument cannot be accessed").
        with torch.cuda.device(x.device):
            kernels.int4_matmul_kernel[grid](*args, **meta, num_warps=4, num_stages=3)
    out = partial[0] if split == 1 else partial.sum(0)
    return out.to(x.dtype)
