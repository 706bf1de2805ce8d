"""Attention through xformers' memory_efficient_attention on CUDA, verified by a probe call at start."""

from __future__ import annotations

import functools
import logging

import torch

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)


@functools.cache
def probe_xformers(device: torch.device) -> str | None:
    """Run one tiny real call (once per device); None if xformers works here, else why it does not."""
    if device.type != "cuda":
        return f"xformers needs a CUDA device, not {device.type}"
    try:
        from xformers import ops as xops  # type: ignore[import-not-found]
    except Exception as exc:  # ImportError, or a broken C++ extension raising at import
        return f"xformers is not importable ({type(exc).__name__}: {exc}); install the 'gpu' extra"
    try:
        q = torch.randn(1, 4, 2, 64, device=device, dtype=torch.float16)
        out = xops.memory_efficient_attention(q, q, q, attn_bias=xops.LowerTriangularMask())
        torch.cuda.synchronize(device)
        if not torch.isfinite(out).all():
            return "xformers probe returned non-finite values"
    except Exception as exc:  # its kernels may be built for another torch / CUDA
        return f"xformers kernels failed to run ({type(exc).__name__}: {exc})"
    return None


class XformersAttention(AttentionBackend):
    """memory_efficient_attention over the cached keys; GQA through xformers' 5-D grouped layout."""

    name = "xformers"

    def __init__(self) -> None:
        from xformers import ops as xops  # type: ignore[import-not-found]

        self._ops = xops

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
        batch, num_queries = meta.batch_size, meta.max_query_len
        num_keys = meta.max_kv_len
        # (B, S, Hkv, D), widened to q's dtype if the cache holds another (kv_cache_dtype)
        keys = self.cached_rows(k_cache, meta, 0, num_keys).transpose(1, 2).to(q.dtype)
        values = self.cached_rows(v_cache, meta, 0, num_keys).transpose(1, 2).to(q.dtype)
        num_kv_heads = keys.shape[2]
        groups = num_heads // num_kv_heads
        # (B, M, G, H/G, D): queries grouped by the kv head they share; keys broadcast over the group.
        q5 = meta.to_rows(q).reshape(batch, num_queries, num_kv_heads, groups, head_dim)
        k5 = keys[:, :, :, None].expand(batch, num_keys, num_kv_heads, groups, head_dim)
        v5 = values[:, :, :, None].expand(batch, num_keys, num_kv_heads, groups, head_dim)
        allowed = meta.allowed_keys(num_keys, sliding_window)  # (B, 1, T, S)
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
        bias.masked_fill_(~allowed, float("-inf"))
        # xformers wants a bias of shape (B, G, H/G, M, S) whose last dim is padded to 8 elements.
        padded = (num_keys + 7) // 8 * 8
        storage = torch.zeros(batch, 1, 1, num_queries, padded, dtype=q.dtype, device=q.device)
        storage[..., :num_keys] = bias[:, :, None]
        attn_bias = storage[..., :num_keys].expand(
            batch, num_kv_heads, groups, num_queries, num_keys
        )
        out = self._ops.memory_efficient_attention(
            q5, k5, v5, attn_bias=attn_bias
        )  # (B, T, G, H/G, D)
        out = out.reshape(batch, num_queries, num_heads, head_dim)
        return meta.to_packed(out).reshape(num_tokens, num_heads * head_dim)
