"""Apply token bitmasks to logits in place (disallowed -> -inf), on the logits' device."""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F


def _check(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError(
            f"need logits (B, V) and bitmask (B, W), got {tuple(logits.shape)} and {tuple(bitmask.shape)}"
        )
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if logits.shape[0] != bitmask.shape[0]:
        raise ValueError(
            f"batch mismatch: logits {logits.shape[0]} rows, bitmask {bitmask.shape[0]}"
        )


def _rows_index(rows: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if rows is None:
        return None
    return torch.as_tensor(rows, dtype=torch.long).to(device, non_blocking=True)


def apply_token_bitmask_reference(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """Plain-torch reference: token t of row r is allowed iff bit t % 32 of bitmask[r, t // 32] is set.

    logits (B, V) float, bitmask (B, W) int32; `rows` (optional, distinct) limits the update to those
    rows of both. Tokens at or beyond 32 * W (a model vocabulary padded past the tokenizer's) are
    disallowed.
    """
    _check(logits, bitmask)
    batch, vocab = logits.shape
    bitmask = bitmask.to(logits.device)
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # (B, W, 32)
    allowed = bits.reshape(batch, -1).bool()  # (B, 32W)
    if allowed.shape[1] >= vocab:
        allowed = allowed[:, :vocab]
    else:
        padding = torch.zeros(
            batch, vocab - allowed.shape[1], dtype=torch.bool, device=logits.device
        )
        allowed = torch.cat([allowed, padding], dim=1)  # (B, V)
    row_index = _rows_index(rows, logits.device)
    if row_index is not None:
        selected = torch.zeros(batch, dtype=torch.bool, device=logits.device)
        selected[row_index] = True
        allowed = allowed | ~selected.unsqueeze(1)  # rows not selected keep every token
    logits.masked_fill_(~allowed, float("-inf"))


@functools.cache
def _byte_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(256, 8): +inf where bit j of byte value b is set (token allowed), else -inf. Built once per
    dtype and device (five small ops each time cost ~40 us a step); read only."""
    # A normal tensor even when first built under inference_mode, so later calls outside it can
    # use it too.
    with torch.inference_mode(False):
        values = torch.arange(256, dtype=torch.int32, device=device).unsqueeze(1)
        bits = (values >> torch.arange(8, dtype=torch.int32, device=device)) & 1
        return torch.where(bits.bool(), float("inf"), float("-inf")).to(dtype)


def _apply_natively(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> bool:
    """``apply_token_bitmask_`` through the native kernels' loop, where it runs: float32 logits
    and the bitmask on the CPU, rows contiguous (~60 us of torch ops a row of 4,096 right after a
    forward pass, ~2 us this way). False where it does not."""
    if (
        logits.device.type != "cpu"
        or bitmask.device.type != "cpu"
        or logits.dtype != torch.float32
        or logits.stride(1) != 1
        or not bitmask.is_contiguous()
    ):
        return False
    from brisklm.kernels import native

    apply = native.function("brisk_apply_bitmask_f32")
    if apply is None:
        return False
    index = None
    if rows is not None:
        index = torch.as_tensor(rows, dtype=torch.int64).contiguous()
        if index.numel() == 0:
            return True
        low, high = (int(end) for end in index.aminmax())
        if low < 0 or high >= logits.shape[0]:
            raise IndexError(f"rows {index.tolist()} out of range for {logits.shape[0]} rows")
    apply(
        logits.data_ptr(),
        logits.stride(0),
        logits.shape[1],
        bitmask.data_ptr(),
        bitmask.shape[1],
        index.data_ptr() if index is not None else None,
        index.numel() if index is not None else logits.shape[0],
    )
    return True


def apply_token_bitmask_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """Set disallowed tokens' logits to -inf in place; same contract as `apply_token_bitmask_reference`.

    Looks each mask byte up in a (256, 8) table of +inf/-inf (one gather, no per-bit shifts) and
    takes the bound where it is -inf: masked_fill_ with a bool mask is ~10x slower on CPU, and
    unlike adding a -inf bias, this also masks a +inf or NaN logit. Only the selected rows are touched.
    The bitmask may live on the CPU (pinned); it is copied to the logits' device asynchronously,
    so do not refill that CPU bitmask before the device has consumed it (the next sync).
    """
    _check(logits, bitmask)
    if _apply_natively(logits, bitmask, rows):
        return
    if sys.byteorder != "little":  # the byte view below assumes little-endian words
        apply_token_bitmask_reference(logits, bitmask, rows)
        return
    device = logits.device
    row_index = _rows_index(rows, device)
    bitmask = bitmask.to(device, non_blocking=True)
    if row_index is not None:
        if row_index.numel() == 0:
            return
        bitmask = bitmask.index_select(0, row_index)
    num_covered = min(logits.shape[1], 32 * bitmask.shape[1])
    # Byte k of the little-endian words holds tokens 8k..8k+7 (bit j = token 8k+j).
    mask_bytes = bitmask.contiguous().view(torch.uint8).long()  # (R, 4W)
    bound = F.embedding(mask_bytes, _byte_table(logits.dtype, device))  # (R, 4W, 8)
    bound = bound.view(bound.shape[0], -1)[:, :num_covered]  # (R, num_covered)
    target = logits if row_index is None else logits.index_select(0, row_index)  # (R, V)
    covered = target[:, :num_covered]
    # -inf where the bound is (not minimum: a NaN logit would stay NaN, and greedy decoding,
    # which counts NaN the largest, would pick a token the grammar forbids)
    torch.where(bound < 0, bound, covered, out=covered)
    target[:, num_covered:] = float("-inf")
    if row_index is not None:
        logits.index_copy_(0, row_index, target)
