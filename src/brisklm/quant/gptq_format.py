"""GPTQ int4 tensor format: pack/unpack of qweight and qzeros, v1/v2 zero conversion, reference dequantize.

Layout (auto-gptq, GPTQModel, transformers):
  qweight int32 [K/8, N]: nibble m (bits 4m..4m+3) of row r holds input k = 8r + m.
  qzeros  int32 [G, N/8]: nibble m of column c holds output n = 8c + m.
  scales  fp16  [G, N];  g_idx int32 [K], the group of input k (k // group_size unless act-order).
  w[n, k] = scales[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n]).
v1 (`gptq`) stores zero - 1 in qzeros, v2 (`gptq_v2`) the zero itself.

On v1 zeros we follow GPTQModel, which converts whole 32-bit words (v2 = v1 + 0x11111111 modulo 2**32)
rather than nibble by nibble: it is the exact inverse of how GPTQModel writes asymmetric v1 files, and
it agrees with per-nibble readers (auto-gptq's kernels: zero = nibble + 1) on every word without a 0xF
nibble. A 0xF nibble only appears for a zero of 0, which v1 cannot store; our quantizer never emits
one (it uses zeros 1..15 for v1), so files we write read the same in every loader.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

logger = logging.getLogger(__name__)

PACK_FACTOR = 8  # int4 values per int32
_SHIFTS = tuple(range(0, 32, 4))
_V1_V2_OFFSET = 0x11111111  # +1 in every nibble of a word
_WORD = 1 << 32


class GPTQTensors(NamedTuple):
    """The four tensors one GPTQ linear layer stores (HF names), in the checkpoint's own dtypes."""

    qweight: torch.Tensor  # int32 [K/8, N]
    qzeros: torch.Tensor  # int32 [G, N/8]
    scales: torch.Tensor  # fp16 [G, N]
    g_idx: torch.Tensor  # int32 [K]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[0] * PACK_FACTOR

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def num_groups(self) -> int:
        return self.scales.shape[0]


def _to_int32_words(words: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) -> int32 with the same 32 bits."""
    words = words & (_WORD - 1)
    return torch.where(words >= (1 << 31), words - _WORD, words).to(torch.int32)


def pack_int4(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Pack int values 0..15 eight to an int32 along `dim` (element 8r+m at bits 4m..4m+3 of word r)."""
    if values.dtype.is_floating_point or values.dtype == torch.bool:
        raise ValueError(f"pack_int4 expects an integer tensor, got {values.dtype}")
    dim = dim % values.dim()
    size = values.shape[dim]
    if size % PACK_FACTOR:
        raise ValueError(
            f"pack_int4: dimension {dim} has size {size}, not a multiple of {PACK_FACTOR}"
        )
    if values.device.type != "meta" and values.numel() and (values.min() < 0 or values.max() > 15):
        raise ValueError("pack_int4: values must lie in 0..15")
    moved = values.movedim(dim, -1).to(torch.int64)
    grouped = moved.reshape(*moved.shape[:-1], size // PACK_FACTOR, PACK_FACTOR)
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=values.device)
    words = (grouped << shifts).sum(dim=-1)  # nibbles do not overlap, so the sum is a bitwise or
    return _to_int32_words(words).movedim(-1, dim).contiguous()


def unpack_int4(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of `pack_int4`: int32 words -> int32 values 0..15, `dim` grows eightfold."""
    if packed.dtype != torch.int32:
        raise ValueError(f"unpack_int4 expects int32 words, got {packed.dtype}")
    dim = dim % packed.dim()
    moved = packed.movedim(dim, -1)
    shifts = torch.tensor(_SHIFTS, dtype=torch.int32, device=packed.device)
    # Arithmetic shift sign-extends negative words; the mask keeps only the wanted nibble.
    values = (moved.unsqueeze(-1) >> shifts) & 0xF
    values = values.reshape(*moved.shape[:-1], moved.shape[-1] * PACK_FACTOR)
    return values.movedim(-1, dim).contiguous()


def pack_qweight(q: torch.Tensor) -> torch.Tensor:
    """int values [K, N] (0..15) -> qweight int32 [K/8, N]."""
    return pack_int4(q, dim=0)


def unpack_qweight(qweight: torch.Tensor) -> torch.Tensor:
    """qweight int32 [K/8, N] -> int32 [K, N] values 0..15."""
    return unpack_int4(qweight, dim=0)


def pack_qzeros(zeros: torch.Tensor, *, checkpoint_format: str = "gptq") -> torch.Tensor:
    """True zero points [G, N] -> qzeros int32 [G, N/8] in the given format (v1 stores zero - 1).

    v1 cannot hold a zero point of 0 (it would need nibble -1): that raises ValueError.
    """
    _check_format(checkpoint_format)
    if checkpoint_format == "gptq":
        if zeros.device.type != "meta" and zeros.numel() and zeros.min() < 1:
            raise ValueError(
                "GPTQ v1 cannot store a zero point of 0 (it stores zero - 1); use gptq_v2"
            )
        zeros = zeros - 1
    return pack_int4(zeros, dim=1)


def unpack_qzeros(qzeros: torch.Tensor, *, checkpoint_format: str = "gptq") -> torch.Tensor:
    """qzeros int32 [G, N/8] -> true zero points int32 [G, N] (0..15)."""
    _check_format(checkpoint_format)
    if checkpoint_format == "gptq":
        _warn_on_unstorable_zeros(qzeros)
        qzeros = qzeros_v1_to_v2(qzeros)
    return unpack_int4(qzeros, dim=1)


_warned_unstorable_zeros = False


def _warn_on_unstorable_zeros(qzeros: torch.Tensor) -> None:
    """Once per process: v1 qzeros holding a 0xF nibble (auto-gptq's packer writes one for a zero
    point of 0, which v1 cannot store). Loaders read it differently (here and in GPTQModel the
    word-wise +1 carries into the next nibble; auto-gptq's kernels read zero 16), so the weights
    of those groups depend on the loader."""
    global _warned_unstorable_zeros
    if _warned_unstorable_zeros or qzeros.device.type == "meta":
        return
    if bool((unpack_int4(qzeros, dim=1) == 15).any()):
        _warned_unstorable_zeros = True
        logger.warning(
            "this GPTQ v1 checkpoint stores a zero point of 0 (a 0xF nibble in qzeros), which v1 "
            "cannot represent: loaders disagree on such groups (brisklm reads them as GPTQModel "
            "does), so their weights may be off; a gptq_v2 (or symmetric) quantization avoids it"
        )


def qzeros_v1_to_v2(qzeros: torch.Tensor) -> torch.Tensor:
    """v1 (zero - 1) -> v2 (zero) qzeros, word-wise as GPTQModel does (see the module docstring)."""
    return _to_int32_words(qzeros.to(torch.int64) + _V1_V2_OFFSET)


def qzeros_v2_to_v1(qzeros: torch.Tensor) -> torch.Tensor:
    """v2 (zero) -> v1 (zero - 1) qzeros; the exact inverse of `qzeros_v1_to_v2`."""
    return _to_int32_words(qzeros.to(torch.int64) - _V1_V2_OFFSET)


def default_g_idx(
    in_features: int, group_size: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """g_idx without act-order: k // group_size (all zeros for group_size -1). On the meta
    device, where a model is built before its weights load, a tensor of its shape alone (a
    division there goes through torch's Python decompositions, which import torch._dynamo and
    sympy: ~1.7 s and ~200 MB of a process's first GPTQ load)."""
    if device is not None and torch.device(device).type == "meta":
        return torch.empty(in_features, dtype=torch.int32, device="meta")
    size = in_features if group_size == -1 else group_size
    return torch.arange(in_features, dtype=torch.int32, device=device) // size


def check_gptq_tensors(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None
) -> tuple[int, int, int]:
    """Validate shapes and dtypes of one layer's tensors; return (in_features, out_features, num_groups)."""
    if qweight.dim() != 2 or qweight.dtype != torch.int32:
        raise ValueError(
            f"qweight must be int32 [K/8, N], got {qweight.dtype} {tuple(qweight.shape)}"
        )
    in_features, out_features = qweight.shape[0] * PACK_FACTOR, qweight.shape[1]
    if scales.dim() != 2 or scales.shape[1] != out_features or not scales.dtype.is_floating_point:
        raise ValueError(
            f"scales must be float [G, {out_features}], got {scales.dtype} {tuple(scales.shape)}"
        )
    num_groups = scales.shape[0]
    if qzeros.dtype != torch.int32 or tuple(qzeros.shape) != (
        num_groups,
        out_features // PACK_FACTOR,
    ):
        raise ValueError(
            f"qzeros must be int32 [{num_groups}, {out_features // PACK_FACTOR}], "
            f"got {qzeros.dtype} {tuple(qzeros.shape)}"
        )
    if out_features % PACK_FACTOR:
        raise ValueError(f"out_features={out_features} must be a multiple of {PACK_FACTOR}")
    if g_idx is not None:
        if g_idx.dim() != 1 or g_idx.shape[0] != in_features or g_idx.dtype.is_floating_point:
            raise ValueError(
                f"g_idx must be an int tensor [{in_features}], got {g_idx.dtype} {tuple(g_idx.shape)}"
            )
        if g_idx.device.type != "meta" and (g_idx.min() < 0 or g_idx.max() >= num_groups):
            raise ValueError(f"g_idx values must lie in [0, {num_groups})")
    return in_features, out_features, num_groups


def g_idx_or_default(
    g_idx: torch.Tensor | None,
    in_features: int,
    num_groups: int,
    group_size: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``g_idx``, or for tensors without one (no act-order) each input's group: runs of
    ``group_size`` inputs (the checkpoint's group size, -1 for one group; the last run may be
    short). Without ``group_size`` the groups must be equal: the tensors alone cannot tell 96
    inputs in groups of 64 (one short) from groups of 48."""
    if g_idx is not None:
        return g_idx
    if group_size is None or group_size == -1:
        if in_features % num_groups:
            raise ValueError(
                f"without g_idx, {num_groups} groups of in_features={in_features} are unequal: "
                "pass the checkpoint's group_size"
            )
        size = in_features // num_groups
    else:
        if group_size < 1 or -(-in_features // group_size) != num_groups:
            raise ValueError(
                f"group_size={group_size} makes {-(-in_features // max(group_size, 1))} groups of "
                f"in_features={in_features}, but the tensors hold {num_groups}"
            )
        size = group_size
    return default_g_idx(in_features, size, device=device)


def pack_gptq(
    q: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor,
    *,
    checkpoint_format: str = "gptq",
) -> GPTQTensors:
    """Integer weights q [N, K] (0..15), zero points [G, N], scales [G, N], g_idx [K] -> GPTQ tensors."""
    return GPTQTensors(
        qweight=pack_qweight(q.t()),
        qzeros=pack_qzeros(zeros, checkpoint_format=checkpoint_format),
        scales=scales.to(torch.float16).contiguous(),
        g_idx=g_idx.to(torch.int32).contiguous(),
    )


def dequantize_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    *,
    checkpoint_format: str = "gptq",
    dtype: torch.dtype = torch.float32,
    group_size: int | None = None,
) -> torch.Tensor:
    """Plain-torch reference: GPTQ tensors -> float weight W [N, K] (as nn.Linear stores it).

    ``group_size``: the checkpoint's, needed without ``g_idx`` when the last group is short.
    """
    in_features, _, num_groups = check_gptq_tensors(qweight, qzeros, scales, g_idx)
    g_idx = g_idx_or_default(g_idx, in_features, num_groups, group_size, qweight.device)
    q = unpack_qweight(qweight)  # (K, N)
    zeros = unpack_qzeros(qzeros, checkpoint_format=checkpoint_format)  # (G, N)
    groups = g_idx.long()
    w = scales.float()[groups] * (q - zeros[groups]).float()  # (K, N)
    return w.t().contiguous().to(dtype)


def _check_format(checkpoint_format: str) -> None:
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}"
        )
