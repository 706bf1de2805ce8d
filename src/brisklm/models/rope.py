"""Rotary position embeddings: inverse frequencies for each scaling type, cos/sin tables, application."""

from __future__ import annotations

import math

import torch
from torch import nn

from brisklm.config import RopeConfig


def rope_inv_freq(
    rope: RopeConfig, head_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (head_dim/2,) float32 and the cos/sin scale, as transformers computes them.

    ``seq_len`` only matters for dynamic NTK scaling, whose base grows with the sequence length.
    """
    dim = head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    kind = rope.rope_type
    if kind == "default":
        return 1.0 / (rope.theta**exponents), 1.0
    if kind == "linear":
        return (1.0 / (rope.theta**exponents)) / rope.factor, 1.0
    if kind == "dynamic":
        length = max(seq_len or max_position_embeddings, max_position_embeddings)
        factor = rope.factor
        base = rope.theta * ((factor * length / max_position_embeddings) - (factor - 1)) ** (
            dim / (dim - 2)
        )
        return 1.0 / (base**exponents), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(rope, exponents), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(rope, dim)
    raise ValueError(f"unsupported rope type {kind!r}")


def _llama3_inv_freq(rope: RopeConfig, exponents: torch.Tensor) -> torch.Tensor:
    inv_freq = 1.0 / (rope.theta**exponents)
    old_context = rope.original_max_position_embeddings
    assert old_context is not None
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are interpolated, short ones kept, the band between blended smoothly.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    factor = rope.factor
    original = rope.original_max_position_embeddings
    assert original is not None

    def mscale_of(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = mscale_of(factor, rope.mscale) / mscale_of(
                factor, rope.mscale_all_dim
            )
        else:
            attention_factor = mscale_of(factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta)
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Produces (cos, sin) for absolute positions from a lazily built table.

    Holds no buffers so the model can be built on the meta device; the table is made on first use
    on the device of the positions, ``table_length`` positions long (the trained context unless
    ``size_tables_for`` says how long the engine's sequences get), and grown if a longer position
    shows up.
    """

    def __init__(self, rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.table_length = max_position_embeddings
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def size_tables_for(self, max_seq_len: int) -> None:
        """Make tables ``max_seq_len`` positions long, not the trained context's (a 1M-token
        config held a 1 GiB float32 table, 2.3 GB at its peak, for an engine of 4,096 tokens)."""
        self.table_length = max_seq_len
        self._tables = {
            key: table for key, table in self._tables.items() if table[0].shape[0] <= max_seq_len
        }

    def _table(
        self, device: torch.device, dtype: torch.dtype, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, dtype)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < length:
            size = max(length, self.table_length)
            cos, sin = self._compute(torch.arange(size, device=device), None)
            table = (cos.to(dtype), sin.to(dtype))
            self._tables[key] = table
        return table

    def _compute(
        self, positions: torch.Tensor, seq_len: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq, scale = rope_inv_freq(
            self.rope, self.head_dim, self.max_position_embeddings, seq_len
        )
        freqs = positions[..., None].to(torch.float32) * inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * scale, emb.sin() * scale

    def rotates_by_length(self, longest: int) -> bool:
        """Whether rows reaching ``longest`` positions are rotated by their own length (dynamic
        NTK scaling past the trained context) instead of read from one table."""
        return self.rope.rope_type == "dynamic" and longest > self.max_position_embeddings

    def tables(
        self, device: torch.device, dtype: torch.dtype, longest: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (cos, sin) tables, (L, head_dim) indexed by position, that ``forward`` reads for
        rows up to ``longest`` positions; None where it computes per row instead (dynamic NTK
        scaling past the trained context)."""
        if self.rotates_by_length(longest):
            return None
        return self._table(device, dtype, longest)

    def forward(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype,
        query_lens: list[int],
        row_max_positions: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (N, head_dim) for the packed positions (N,) of rows of ``query_lens``."""
        longest = max(row_max_positions) + 1
        if self.rotates_by_length(longest):
            return self._dynamic(positions, dtype, query_lens, row_max_positions)
        cos, sin = self._table(positions.device, dtype, longest)
        return cos[positions], sin[positions]

    def _dynamic(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype,
        query_lens: list[int],
        row_max_positions: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Dynamic NTK rescales the base by each sequence's own length, as transformers does for a
        # single sequence, so a row's result does not depend on what else is in the batch.
        rows_cos, rows_sin = [], []
        for row_positions, row_max in zip(positions.split(query_lens), row_max_positions):
            cos, sin = self._compute(row_positions, row_max + 1)
            rows_cos.append(cos)
            rows_sin.append(sin)
        return torch.cat(rows_cos).to(dtype), torch.cat(rows_sin).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (N, H, D) by cos/sin (N, D) in the rotate-half convention of HF Llama."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
