"""Attention through xformers' memory_efficient_attention on CUDA, verified by a probe call at start."""

from __future__ import annotations

import functools
import logging

import torch

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)


@functools.cache
def probe_xformers(
    device: torch.device,
    dtype: torch.dtype = torch.float16,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
) -> str | None:
    """None if xformers attends correctly here for a model of this dtype and head layout, else why
    not; the answer is kept per (device, dtype, heads, head size).

    The probe is the backend's own call (grouped 5-D layout, padded tensor bias) on a prompt chunk
    beside a decoding row, checked against SDPA: which of xformers' operators takes a call depends
    on the dtype, the head size, the bias and the GPU (no bfloat16 before Ampere, no tensor bias
    in some operators), so a call of another shape proves nothing about the model's.
    """
    try:
        from xformers import ops as xops  # type: ignore[import-not-found]  # noqa: F401
    except Exception as exc:  # ImportError, or a broken C++ extension raising at import
        return f"xformers is not importable ({type(exc).__name__}: {exc}); install the 'gpu' extra"
    from brisklm.attention.sdpa import SdpaAttention

    generator = torch.Generator().manual_seed(0)
    cache_shape = (2, num_kv_heads, 24, head_dim)
    lens = [1, 9]  # a decoding row at position 12 beside a 9-token prompt chunk at 0

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)

    outputs = []
    try:
        q = draw(10, num_heads, head_dim)
        k, v = draw(10, num_kv_heads, head_dim), draw(10, num_kv_heads, head_dim)
        k_cache, v_cache = draw(*cache_shape), draw(*cache_shape)
        for backend in (XformersAttention(), SdpaAttention()):
            meta = AttentionMetadata.build([0, 1], [12, 0], lens, device)
            outputs.append(backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, None))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # no operator for this call, or kernels built for another torch / CUDA
        return f"xformers kernels failed to run ({type(exc).__name__}: {exc})"
    got, expected = (out.float() for out in outputs)
    if not torch.isfinite(got).all():
        return "xformers probe returned non-finite values"
    tolerance = 1e-3 if dtype == torch.float32 else 5e-2
    if not torch.allclose(got, expected, atol=tolerance, rtol=tolerance):
        error = (got - expected).abs().max().item()
        return f"xformers attention differs from SDPA by {error:.3g} in the probe call"
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
