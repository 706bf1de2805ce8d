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

    On CPU, the queries of ``meta.stepwise`` rows (generated tokens fed several at once:
    speculative verification, grammar-forced runs) each run as the one-token decode step at their
    position would: the masked call over a row's k+1 queries rounds
    differently (~2e-7) from one-token steps, which a bfloat16 int4 target magnified into other
    tokens than plain decoding. Not on CUDA: there the linear layers themselves round k+1 rows
    differently from one (cuBLAS picks kernels by shape), so one call per query would buy nothing.
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
        if meta.batch_size == 1 and meta.query_lens[0] == 1:
            return self._decode_steps(q, k_cache, v_cache, meta, sliding_window)
        if meta.stepwise is not None and q.device.type == "cpu":
            stepwise = meta.stepwise
        elif meta.is_uniform or not meta.row_invariant:
            return self._attend(q, k, v, k_cache, v_cache, meta, sliding_window)
        else:
            stepwise = (False,) * meta.batch_size
        # Row by row: each stepwise row's queries and each one-token row as decode steps (one path
        # for every decode step of a row alone), every other row alone.
        outputs = []
        for row, one_by_one, (start, end) in zip(meta.rows(), stepwise, meta.row_token_ranges()):
            if one_by_one or end - start == 1:
                outputs.append(
                    self._decode_steps(q[start:end], k_cache, v_cache, row, sliding_window)
                )
            else:
                outputs.append(
                    self._attend(
                        q[start:end],
                        k[start:end],
                        v[start:end],
                        k_cache,
                        v_cache,
                        row,
                        sliding_window,
                    )
                )
        return torch.cat(outputs)

    @staticmethod
    def _decode_steps(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        row: AttentionMetadata,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """The T queries of one row (its cache written), each attending as the one-token decode
        step at its position: one unmasked call over exactly the keys that step sees. A one-token
        row attended alone takes this path too, so a stepwise query and a decode step are the
        same call on the same views (bookkeeping kept to narrow views: ~40 us a query
        less than ``_attend``)."""
        num_queries, num_heads, head_dim = q.shape
        gqa = num_heads != k_cache.shape[1]
        widen = k_cache.dtype != q.dtype
        queries = q.view(num_queries, 1, num_heads, head_dim).transpose(1, 2)  # (T, H, 1, D)
        slot, first_position = row.slot_list[0], row.start_positions[0]
        slot_keys, slot_values = k_cache.narrow(0, slot, 1), v_cache.narrow(0, slot, 1)
        outputs = []
        for t in range(num_queries):
            num_keys = first_position + t + 1
            first_key = 0
            if sliding_window is not None and sliding_window < num_keys:
                first_key = num_keys - sliding_window
            keys = slot_keys.narrow(2, first_key, num_keys - first_key)
            values = slot_values.narrow(2, first_key, num_keys - first_key)
            if widen:
                keys, values = keys.to(q.dtype), values.to(q.dtype)
            out = F.scaled_dot_product_attention(
                queries.narrow(0, t, 1), keys, values, enable_gqa=gqa
            )  # (1, H, 1, D)
            outputs.append(out.reshape(1, num_heads * head_dim))
        return outputs[0] if num_queries == 1 else torch.cat(outputs)

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
        keys, values, gqa = kv_heads_for_sdpa(keys, values, num_heads, mask is not None)
        out = F.scaled_dot_product_attention(
            meta.to_rows(q).transpose(1, 2),
            keys,
            values,
            attn_mask=mask,
            is_causal=is_causal,
            enable_gqa=gqa,
        )  # (B, H, T, D)
        return meta.to_packed(out.transpose(1, 2)).reshape(num_tokens, num_heads * head_dim)


def kv_heads_for_sdpa(
    keys: torch.Tensor,
    values: torch.Tensor,
    num_heads: int,
    masked: bool,
    device_type: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(B, KV, S, D) keys and values for an SDPA call of ``num_heads`` query heads, and its
    ``enable_gqa``. On CUDA torch's fused kernels take grouped heads only unmasked in half
    precision (flash attention): a masked or float32 call with ``enable_gqa`` ran in the math
    kernel, which builds the whole (B, H, T, S) float32 score matrix (~2 GB for a 2,048-token
    chunk over 8,192 keys of 32 heads), so there each KV head is repeated for its query heads
    and the memory-efficient kernel takes the call. On CPU ``enable_gqa`` as it was.
    ``device_type``: the keys' (tests give "cuda" to CPU tensors)."""
    groups = num_heads // keys.shape[1]
    if groups == 1:
        return keys, values, False
    half = keys.dtype in (torch.float16, torch.bfloat16)
    if (device_type or keys.device.type) != "cuda" or (half and not masked):
        return keys, values, True
    return keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1), False
