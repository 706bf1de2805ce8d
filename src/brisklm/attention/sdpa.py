"""Attention through torch's scaled_dot_product_attention (CPU and CUDA), with mask-free fast paths."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata


class SdpaAttention(AttentionBackend):
    """SDPA over a batch's rows, with mask-free fast paths.

    Rows that share their positions (a decode batch of equal-length requests, prompts of one
    length) run as one call, each row's result the same as alone. Rows that do not run as one call
    over rows padded to the longest, masked, unless ``meta.row_invariant`` asks for each row to
    come out exactly as alone: then one call per row over exactly its own keys. Masked padding
    keys still move the sums (~5e-8), and the per-row calls cost a ragged 8-row decode step 8-24%
    (docs/benchmarks.md), so they run only for batches that hold a seeded request.
    """

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
        if meta.is_uniform or not meta.row_invariant:
            return self._attend(q, k, v, k_cache, v_cache, meta, sliding_window)
        outputs = []
        for row, (start, end) in zip(meta.rows(), meta.row_token_ranges()):
            outputs.append(
                self._attend(
                    q[start:end], k[start:end], v[start:end], k_cache, v_cache, row, sliding_window
                )
            )
        return torch.cat(outputs)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """One SDPA call over the rows of ``meta`` (padded and masked if they differ); the caches
        are already written."""
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
        if is_causal and k_cache.dtype == k.dtype:  # rows at 0: the new keys are all there is
            keys, values = meta.to_rows(k).transpose(1, 2), meta.to_rows(v).transpose(1, 2)
        else:
            # A cache of another dtype than the arithmetic (half-precision elements for float32
            # attention, brisklm.models.native_forward) is read back widened: attention then sees
            # the keys as they are stored, as the native pass does.
            keys = self.cached_rows(k_cache, meta, first_key, num_keys - first_key).to(q.dtype)
            values = self.cached_rows(v_cache, meta, first_key, num_keys - first_key).to(q.dtype)
        out = F.scaled_dot_product_attention(
            meta.to_rows(q).transpose(1, 2),
            keys,
            values,
            attn_mask=mask,
            is_causal=is_causal,
            enable_gqa=num_heads != keys.shape[1],
        )  # (B, H, T, D)
        return meta.to_packed(out.transpose(1, 2)).reshape(num_tokens, num_heads * head_dim)
