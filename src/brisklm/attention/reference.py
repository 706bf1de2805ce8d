"""Plain-torch attention (explicit scores and softmax): the reference the fast backends are tested against."""

from __future__ import annotations

import torch

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata


class ReferenceAttention(AttentionBackend):
    """Rows of different key lengths run as one product over keys padded to the longest, masked,
    unless ``meta.row_invariant`` asks for each row to come out exactly as alone (a seeded
    request in the batch): then each row alone over exactly its own keys (the padding's masked
    keys still move the sums, ~2e-6)."""

    name = "reference"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        sliding_window: int | None,
    ) -> torch.Tensor:
        self.write_cache(k, v, k_cache, v_cache, meta)
        if meta.row_invariant and not meta.is_uniform:
            return torch.cat(
                [
                    self._attend(q[start:end], k_cache, v_cache, row, sliding_window)
                    for row, (start, end) in zip(meta.rows(), meta.row_token_ranges())
                ]
            )
        return self._attend(q, k_cache, v_cache, meta, sliding_window)

    def _attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        sliding_window: int | None,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        num_keys = meta.max_kv_len
        keys = self.cached_rows(k_cache, meta, 0, num_keys).float()  # (B, Hkv, S, D)
        values = self.cached_rows(v_cache, meta, 0, num_keys).float()
        groups = num_heads // keys.shape[1]
        keys = keys.repeat_interleave(groups, dim=1)  # (B, H, S, D)
        values = values.repeat_interleave(groups, dim=1)
        q_rows = meta.to_rows(q).float().transpose(1, 2)  # (B, H, T, D)
        scores = torch.matmul(q_rows, keys.transpose(2, 3)) * head_dim**-0.5
        allowed = meta.allowed_keys(num_keys, sliding_window)  # (B, 1, T, S)
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(weights, values)  # (B, H, T, D)
        return (
            meta.to_packed(out.transpose(1, 2))
            .reshape(num_tokens, num_heads * head_dim)
            .to(q.dtype)
        )
