"""The Triton int4 kernel; imported only by triton_int4.py, and only once triton is known to be there.

With TRITON_INTERPRET=1 set before triton is first imported, it runs on CPU tensors in Triton's
interpreter (numpy); that is how CI checks its arithmetic without a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def int4_matmul_kernel(
    x_ptr,  # (M, K) activations, any float dtype, read in kernel column order through perm_ptr
    qweight_ptr,  # int32 (K/8, N): GPTQ layout, nibble m of row r is kernel column 8r + m
    scales_ptr,  # fp16 (K/GROUP_SIZE, N)
    zeros_ptr,  # fp16 (K/GROUP_SIZE, N): integer zero points, exact in fp16
    perm_ptr,  # int32 (K,): kernel column j multiplies x[:, perm[j]] (act-order); unused without HAS_PERM
    out_ptr,  # fp32 (SPLIT_K, M, N) partial sums
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_PERM: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # Grid: (N tiles, M tiles, SPLIT_K). Each program owns a BLOCK_M x BLOCK_N output tile and a
    # contiguous run of K tiles; every packed weight word is loaded by exactly one program.
    # BLOCK_K divides GROUP_SIZE, so one K tile has one scale/zero row.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    offs_kk = tl.arange(0, BLOCK_K)
    offs_rows = tl.arange(0, BLOCK_K // 8)
    shifts = tl.arange(0, 8) * 4

    num_k_tiles = K // BLOCK_K
    tiles_per_split = (num_k_tiles + SPLIT_K - 1) // SPLIT_K
    t_begin = pid_k * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, num_k_tiles)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(t_begin, t_end):
        k0 = t * BLOCK_K
        offs_k = k0 + offs_kk
        if HAS_PERM:
            src_k = tl.load(perm_ptr + offs_k)
        else:
            src_k = offs_k
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + src_k[None, :] * stride_xk,
            mask=mask_m[:, None],
            other=0.0,
        )
        packed = tl.load(
            qweight_ptr + (k0 // 8 + offs_rows)[:, None] * N + offs_n[None, :],
            mask=mask_n[None, :],
            other=0,
        )  # (BLOCK_K/8, BLOCK_N)
        # (BLOCK_K/8, 8, BLOCK_N) -> (BLOCK_K, BLOCK_N): row-major, so row 8r + m is nibble m of word r.
        q = (packed[:, None, :] >> shifts[None, :, None]) & 0xF
        q = tl.reshape(q, (BLOCK_K, BLOCK_N))
        group = k0 // GROUP_SIZE
        scale = tl.load(scales_ptr + group * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + group * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        # (q - z) * s as one FMA per weight; both forms are exact in fp32 for q, z <= 16, fp16 s.
        w = q.to(tl.float32) * scale[None, :] - (zero * scale)[None, :]
        if DOT_FP32:
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))

    out_ptrs = out_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out_ptrs, acc, mask=mask_m[:, None] & mask_n[None, :])


def interpreting() -> bool:
    """Whether triton was imported in interpreter mode (TRITON_INTERPRET=1)."""
    return bool(triton.knobs.runtime.interpret)
