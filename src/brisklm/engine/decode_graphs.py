"""Decode passes replayed from CUDA graphs: one launch a step instead of hundreds.

A batch-1 decode step of a 125M-parameter model on an H200 launched ~300 kernels whose GPU time
was ~0.7 ms, but took 5-9 ms: the step was the host launching kernels (~9 us each on the lent
machine) and the Python around them. A graph captured once per shape replays all of a step's
kernels in one call.

A graph fixes its shapes and addresses, so the pass it captures reads everything that changes
from step to step out of a few static buffers: the batch's token ids, cache slots and positions.
Batches are padded to the next captured size (``graph_batch_sizes``) with copies of their first
row, which write that row's key and value again to the same place; attention reads each row's
cached keys up to the next key bucket (``key_buckets``: powers of two from 256, the cache's
length last) through a mask built from the positions, so one graph serves every length in its
bucket. Graphs are captured lazily, the first time a shape is needed, with that batch's own
inputs, so capturing writes only what the replay writes again.

Only plain decode passes take a graph: one token and one logits row per request, and no request
that needs its row computed exactly as alone (seeded sampling: ``ForwardBatch.row_invariant``;
the padded batch would change the matmuls' row count). Prefill, prompt chunks, speculative
verification and such batches run eagerly through the model's attention backend. Attention
inside a graph is SDPA over the gathered keys whatever backend the engine uses for the rest.

``DecodeGraphs(capture=False)`` runs the same static pass eagerly: that is how the CPU test suite
checks the pass's padding, masks and buckets against the engine's ordinary path.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from brisklm.attention.base import AttentionBackend
from brisklm.cache.contiguous import KVCache
from brisklm.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

SMALLEST_KEY_BUCKET = 256
# One capture at a time in the process: torch.cuda.graph captures on a stream shared by every
# graph and empties the allocator's cache as it begins, which must not happen while another
# engine's thread (a second model on the same GPU) is inside a capture.
_CAPTURE_LOCK = threading.Lock()


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """Batch sizes that get a graph: powers of two below ``max_batch_size``, then it."""
    sizes = []
    size = 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch_size]


def key_buckets(max_seq_len: int) -> list[int]:
    """Key lengths that get a graph: powers of two from 256 below ``max_seq_len``, then it."""
    buckets = []
    size = SMALLEST_KEY_BUCKET
    while size < max_seq_len:
        buckets.append(size)
        size *= 2
    return buckets + [max_seq_len]


@dataclass
class StaticDecodeMeta:
    """What the model's forward and ``StaticDecodeAttention`` read in a static decode pass: the
    device tensors of the static buffers, and host values that are the same at every replay."""

    positions: torch.Tensor  # (B,) int64
    slots: torch.Tensor  # (B,) int64
    num_keys: int
    # The rotary table is read at ``positions``; these make it choose its table lookup.
    query_lens: list[int]
    row_max_positions: list[int]
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)
    # (a graph never takes a batch whose rows must come out as alone: ``DecodeGraphs.takes``)
    row_invariant: ClassVar[bool] = False

    def allowed_keys(self, sliding_window: int | None) -> torch.Tensor:
        """Boolean (B, 1, 1, num_keys): key j is visible to the row at position p when
        p - window < j <= p."""
        mask = self.masks.get(sliding_window)
        if mask is None:
            keys = torch.arange(self.num_keys, device=self.positions.device)
            query = self.positions[:, None]
            mask = keys[None, :] <= query
            if sliding_window is not None:
                mask &= keys[None, :] > query - sliding_window
            mask = mask[:, None, None, :]
            self.masks[sliding_window] = mask
        return mask


class StaticDecodeAttention(AttentionBackend):
    """Attention of one-token rows with shapes that do not depend on the positions: the new keys
    and values scattered into the cache at (slot, position), each row's first ``num_keys`` cached
    keys gathered and masked past its position.

    With grouped KV heads the query heads of each KV head are that head's queries (q as (B, Hkv,
    H/Hkv, D) against keys (B, Hkv, S, D)): SDPA's memory-efficient kernel takes a mask but not
    ``enable_gqa``, and the math fallback would copy every key once per query head."""

    name = "static-decode"

    def attend(self, q, k, v, k_cache, v_cache, meta, sliding_window):  # type: ignore[override]
        return self.forward(q, k, v, k_cache, v_cache, meta, sliding_window)

    def forward(self, q, k, v, k_cache, v_cache, meta, sliding_window):  # type: ignore[override]
        rows, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        k_cache[meta.slots, :, meta.positions] = k.to(k_cache.dtype)
        v_cache[meta.slots, :, meta.positions] = v.to(v_cache.dtype)
        keys = k_cache[:, :, : meta.num_keys].index_select(0, meta.slots).to(q.dtype)
        values = v_cache[:, :, : meta.num_keys].index_select(0, meta.slots).to(q.dtype)
        out = F.scaled_dot_product_attention(
            q.view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim),
            keys,
            values,
            attn_mask=meta.allowed_keys(sliding_window),
        )  # (B, Hkv, H / Hkv, D)
        return out.reshape(rows, num_heads * head_dim)


class _StaticPass:
    """The decode pass of one (batch size, key bucket): reads the first ``batch`` columns of the
    shared (3, max) input buffer (token ids, slots, positions), writes ``logits``."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        inputs: torch.Tensor,
        batch: int,
        num_keys: int,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.ids = inputs[0, :batch]
        self.meta = StaticDecodeMeta(
            positions=inputs[2, :batch],
            slots=inputs[1, :batch],
            num_keys=num_keys,
            query_lens=[1] * batch,
            row_max_positions=[0] * batch,
        )
        self.backend = StaticDecodeAttention()
        self.logits: torch.Tensor | None = None

    def run(self) -> torch.Tensor:
        self.meta.masks.clear()  # built inside the pass, from the positions of this replay
        hidden = self.model(self.ids, self.meta, self.kv_cache, self.backend)  # type: ignore[arg-type]
        self.logits = self.model.compute_logits(hidden)
        return self.logits


class DecodeGraphs:
    """The decode passes of one model runner as CUDA graphs (or, with ``capture=False``, the same
    static passes run eagerly). ``takes(batch)`` says whether a batch can run here; ``forward``
    runs it and returns its float32 logits (B, V)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        max_batch_size: int,
        max_seq_len: int,
        capture: bool = True,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.keys.device
        self.capture = capture
        self.batch_sizes = graph_batch_sizes(max_batch_size)
        self.key_buckets = key_buckets(max_seq_len)
        self._inputs = torch.zeros(3, max_batch_size, dtype=torch.int64, device=self.device)
        # Built now at full length, so no pass grows (reallocates) the table it reads; kept here
        # because a graph holds its tensors' addresses, not references to them.
        self._rotary_tables = model.rotary.tables(self.device, model.activation_dtype, max_seq_len)
        self._passes: dict[tuple[int, int], tuple[_StaticPass, torch.cuda.CUDAGraph | None]] = {}
        self._pool: object | None = None  # the graphs' memory pool, made at the first capture
        # The stream every capture runs on, made on this device at the first capture. Left to
        # torch, a capture takes one stream per process, made on whichever device first captured:
        # an engine on cuda:1 after one on cuda:0 captured on a cuda:0 stream (empty graphs).
        self._capture_stream: torch.cuda.Stream | None = None

    @staticmethod
    def supported(model: LlamaForCausalLM, max_seq_len: int) -> bool:
        """Whether a model's decode pass has static shapes: not with dynamic NTK rope past the
        trained context, whose rotations depend on each pass's longest position."""
        return not model.rotary.rotates_by_length(max_seq_len)

    def takes(self, num_logits: list[int], query_lens: list[int], row_invariant: bool) -> bool:
        return (
            not row_invariant
            and len(query_lens) <= self.batch_sizes[-1]
            and all(n == 1 for n in query_lens)
            and all(n == 1 for n in num_logits)
        )

    def forward(self, token_ids: list[int], slots: list[int], positions: list[int]) -> torch.Tensor:
        """Float32 logits (B, V) of one-token rows: token ``token_ids[b]`` at ``positions[b]`` of
        cache slot ``slots[b]``."""
        rows = len(token_ids)
        size = next(s for s in self.batch_sizes if s >= rows)
        longest = max(positions) + 1
        num_keys = next(k for k in self.key_buckets if k >= longest)
        pad = size - rows
        staged = torch.tensor(
            [
                token_ids + token_ids[:1] * pad,
                slots + slots[:1] * pad,
                positions + positions[:1] * pad,
            ],
            dtype=torch.int64,
        )
        self._inputs[:, :size].copy_(staged, non_blocking=True)
        entry = self._passes.get((size, num_keys))
        if entry is None:
            entry = self._prepare(size, num_keys)
            self._passes[(size, num_keys)] = entry
        static, graph = entry
        if graph is None:
            logits = static.run()
        else:
            graph.replay()
            logits = static.logits
            assert logits is not None
        # A copy: the next replay rewrites the graph's output, and callers (the draft's proposal
        # loop) may still hold this step's logits then.
        return logits[:rows].clone()

    def _prepare(self, size: int, num_keys: int) -> tuple[_StaticPass, torch.cuda.CUDAGraph | None]:
        """The pass for (size, num_keys), captured when graphs are on. The inputs already hold
        this batch's values: the warm-up and the capture compute this very step, writing the cache
        entries its replay writes again. A capture that fails (memory, say) leaves that shape to
        run the same pass eagerly, with a warning, rather than fail every step of that shape."""
        static = _StaticPass(self.model, self.kv_cache, self._inputs, size, num_keys)
        if not self.capture:
            return static, None
        try:
            return static, self._capture(static)
        except RuntimeError as error:  # torch's CUDA errors, out-of-memory included
            logger.warning(
                "capturing the decode pass of %d rows over %d keys as a CUDA graph failed (%s); "
                "that shape runs eagerly",
                size,
                num_keys,
                error,
            )
            return static, None

    def _capture(self, static: _StaticPass) -> torch.cuda.CUDAGraph:
        with _CAPTURE_LOCK, torch.cuda.device(self.device):
            current = torch.cuda.current_stream()
            if self._capture_stream is None:
                self._capture_stream = torch.cuda.Stream()
            side = self._capture_stream
            try:
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    static.run()  # warm-up: lazy initialisation, kernel autotuning, workspaces
                current.wait_stream(side)
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                # Thread-local: another engine's thread may run CUDA work while this one captures.
                with torch.cuda.graph(
                    graph, pool=self._pool, stream=side, capture_error_mode="thread_local"
                ):
                    static.run()
                return graph
            finally:
                # A capture that raised can leave its stream current on this thread, and a
                # warm-up that raised its kernels queued on the side stream.
                torch.cuda.set_stream(current)
                current.wait_stream(side)
