"""Plain-torch attention (explicit scores and softmax): the reference the fast backends are tested against."""

from __future__ import annotations

import torch

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata


class ReferenceAttention(AttentionBackend):
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
