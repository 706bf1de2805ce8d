"""The interface every attention backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from brisklm.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    """Writes a layer's new keys/values into its cache and attends over the cached keys.

    Shapes: packed tokens q (N, H, D); k, v (N, Hkv, D); caches (slots, Hkv, S_max, D).
    Returns (N, H * D).
    """

    name: str = "abstract"

    def write_cache(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        if meta.batch_size == 1:
            # One row: a slice assignment, cheaper than an indexed scatter.
            slot, start, length = meta.slot_list[0], meta.start_positions[0], meta.query_lens[0]
            k_cache[slot, :, start : start + length] = k.transpose(0, 1)
            v_cache[slot, :, start : start + length] = v.transpose(0, 1)
            return
        # (N, Hkv, D) scattered; index_put needs the cache's dtype (a half cache under a float32
        # model), where the slice assignment above converts by itself.
        k_cache[meta.token_slots, :, meta.positions] = k.to(k_cache.dtype)
        v_cache[meta.token_slots, :, meta.positions] = v.to(v_cache.dtype)

    @staticmethod
    def cached_rows(
        cache: torch.Tensor, meta: AttentionMetadata, first_key: int, num_keys: int
    ) -> torch.Tensor:
        """(B, Hkv, num_keys, D) keys of the batch's slots: a view when slots are consecutive."""
        span = meta.slot_range
        if span is not None:
            return cache[span[0] : span[1], :, first_key : first_key + num_keys]
        return cache[meta.slots, :, first_key : first_key + num_keys]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """``forward``, with a batch of decoding rows and prompt chunks run as two calls (one per
        group, ``AttentionMetadata.split_single_token_rows``) so that no row is padded to a chunk."""
        parts = meta.split_single_token_rows()
        if parts is None:
            return self.forward(q, k, v, k_cache, v_cache, meta, sliding_window)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        for part, index in parts:
            out[index] = self.forward(
                q[index], k[index], v[index], k_cache, v_cache, part, sliding_window
            )
        return out

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        sliding_window: int | None,
    ) -> torch.Tensor: ...
