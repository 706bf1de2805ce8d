"""Attention through torch's scaled_dot_product_attention (CPU and CUDA), with mask-free fast paths."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata


class SdpaAttention(AttentionBackend):
    name = "sdpa"

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
        num_queries = meta.max_query_len
        num_keys = meta.max_kv_len
        first_key = 0
        mask: torch.Tensor | None = None
        is_causal = False
        # A mask costs a (B, 1, T, S) tensor and slower kernels; skip it whenever positions allow.
        if meta.is_uniform and num_queries == 1:
            if sliding_window is not None and sliding_window < num_keys:
                first_key = num_keys - sliding_window
        elif (
            meta.is_uniform
            and meta.start_positions[0] == 0
            and (sliding_window is None or sliding_window >= num_queries)
        ):
            is_causal = True
        else:
            mask = meta.allowed_keys(num_keys, sliding_window)
        if is_causal:  # uniform rows starting at 0: the new keys are all there is
            keys, values = meta.to_rows(k).transpose(1, 2), meta.to_rows(v).transpose(1, 2)
        else:
            keys = self.cached_rows(k_cache, meta, first_key, num_keys - first_key)
            values = self.cached_rows(v_cache, meta, first_key, num_keys - first_key)
        out = F.scaled_dot_product_attention(
            meta.to_rows(q).transpose(1, 2),
            keys,
            values,
            attn_mask=mask,
            is_causal=is_causal,
            enable_gqa=num_heads != keys.shape[1],
        )  # (B, H, T, D)
        return meta.to_packed(out.transpose(1, 2)).reshape(num_tokens, num_heads * head_dim)
