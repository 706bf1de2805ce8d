"""CPU linear weights pre-packed into oneDNN's blocked layout, with a probe and a strided fallback.

MKL's GEMM (what ``F.linear`` calls on CPU) re-lays out the weight operand on every call, and for
the few rows of a decode step that costs as much as the product itself. oneDNN can take the weight
already packed into its kernels' blocked format, once, at load time. Measured on this project's
2-vCPU AVX-512 VM over a 125M-parameter Llama's 49 float32 weights: 10.5 ms per decode step's
products at one row (38 GB/s, against 17.7 ms column-major and 23.5 ms row-major through MKL),
11.8 ms at eight rows (against 38-41 ms) and 2.3x faster at prefill sizes; bfloat16 1.9x at one row.
See docs/benchmarks.md.

The entry points (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``) are the ones
torch.compile's CPU backend emits; they are not public API, so ``packing_supported`` tries them once
per dtype on a small product, compares with ``F.linear``, and logs why when it falls back to
strided weights. A packed weight is an opaque tensor with the logical (out, in) shape and dtype: it
cannot be sliced, viewed or saved; ``unpack`` returns the strided matrix.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

# oneDNN picks the blocked format for an expected row count. Packed for 8 rows, the 125M model's
# products took 10.5 ms at 1 row, 11.8 ms at 8 and the same at 512 rows as packed for 64; packed
# for 1 row they took 12.1 ms at 1 row and 16.8 ms at 8.
_PACK_ROWS_HINT = 8

# Smallest float32 weight packed by default: every one. oneDNN's packed product gives each row the
# same bits whatever the number of rows, and MKL's (what F.linear runs on strided weights) does
# not: one row of a 4-row product differs from the row alone by ~1e-5, enough to move a seeded
# draw to the neighbouring token when the batch changes. Packing costs small models a little at one
# row: each packed product builds a oneDNN primitive descriptor (~9 us per call against 1.5 us for
# F.linear), so the bundled draft's decode step takes 0.42 ms packed against 0.34 ms with its
# weights (0.15-0.8 MB, under 1 MiB) strided, and 0.55 against 0.61 ms at eight rows; the
# bundled target and larger models are level. ``Linear(min_pack_bytes=...)`` still overrides.
MIN_FLOAT32_BYTES = 0


def _ops_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def packing_supported(dtype: torch.dtype) -> bool:
    """Whether CPU weights of ``dtype`` can be packed here; probed once, the reason logged if not."""
    if dtype not in (torch.float32, torch.bfloat16):
        return False
    if not _ops_available():
        logger.info("oneDNN linear ops unavailable in this torch build: CPU weights stay strided")
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(48, 40, generator=generator).to(dtype)
        bias = torch.randn(48, generator=generator).to(dtype)
        x = torch.randn(3, 40, generator=generator).to(dtype)
        got = packed_linear(x, pack(weight), bias).float()
        expected = F.linear(x, weight, bias).float()
    except Exception as error:  # any failure means "not on this machine", never a crash
        logger.info(
            "oneDNN weight packing failed for %s (%s): CPU weights stay strided", dtype, error
        )
        return False
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    if got.shape != expected.shape or not torch.allclose(got, expected, atol=tolerance, rtol=0):
        logger.warning("oneDNN packed linear disagrees with F.linear for %s: not used", dtype)
        return False
    return True


def worth_packing(weight: torch.Tensor, min_bytes: int | None = None) -> bool:
    """Whether packing ``weight`` pays off (see ``MIN_FLOAT32_BYTES``); ``min_bytes`` overrides."""
    if min_bytes is None:
        min_bytes = MIN_FLOAT32_BYTES if weight.dtype == torch.float32 else 0
    return weight.numel() * weight.element_size() >= min_bytes


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The (out, in) CPU weight in oneDNN's blocked layout (an opaque tensor of the same shape)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_ROWS_HINT)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The strided, contiguous (out, in) matrix of a packed weight (a copy)."""
    return packed.to_dense()


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a weight made by ``pack``; ``x`` may have any leading dims."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
