"""Turns a scheduled batch into tensors, runs the model over the KV cache, returns logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from brisklm.attention import AttentionBackend, AttentionMetadata, select_backend
from brisklm.cache.contiguous import KVCache
from brisklm.engine.decode_graphs import DecodeGraphs
from brisklm.kernels.native import MAX_TOKENS as NATIVE_MAX_TOKENS
from brisklm.models.llama import LlamaForCausalLM
from brisklm.models.native_forward import (
    MAX_QUERY_LEN,
    LogitAdjustments,
    NativeForward,
    StepSampling,
)


@dataclass
class ForwardBatch:
    """Rows to run: row b appends ``token_ids[b]`` to cache slot ``slots[b]`` at ``start_positions[b]``.

    ``num_logits[b]`` is how many of the row's trailing positions need logits: 1 to sample the next
    token, more when verifying speculative proposals, 0 for a row that only fills the cache.
    """

    slots: list[int]
    start_positions: list[int]
    token_ids: list[list[int]]
    num_logits: list[int]
    # Compute every row exactly as it would be computed alone (rows of a ragged batch attend one by
    # one): set when a seeded request is in the batch, so its tokens do not depend on the others.
    row_invariant: bool = False
    # Per row, whether its queries must each come out as a one-token decode step at its position
    # would compute them (AttentionMetadata.stepwise; see ``decode_rows_stepwise``); None: none.
    stepwise: list[bool] | None = None

    def __post_init__(self) -> None:
        if not self.slots:
            raise ValueError("a forward batch needs at least one row")
        if self.stepwise is not None and len(self.stepwise) != len(self.slots):
            raise ValueError("a forward batch's stepwise flags need one entry per row")


def decode_rows_stepwise(decoding: list[bool], row_invariant: bool) -> list[bool] | None:
    """The ``ForwardBatch.stepwise`` flags of a pass whose rows ``decoding`` feed generated tokens
    (the others prompt chunks): those rows attend query by query when their output must not depend
    on the batch (a single decoding row, or a seeded request in the batch).

    Every generated token then attends as a one-token step whichever pass feeds it (a plain
    step, a run of grammar-forced tokens, a speculative verification row), so a draft leaves the
    output bit for bit the plain one where the linear layers round each row alike (CPU)."""
    if row_invariant or sum(decoding) == 1:
        return list(decoding)
    return None


class ModelRunner:
    """Owns the model, its KV cache and attention backend; runs one forward pass per call."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        num_slots: int,
        max_seq_len: int,
        attention_backend: str = "auto",
        cuda_graphs: bool = True,
        max_batch_size: int | None = None,
    ) -> None:
        """``max_batch_size``: the most sequences a pass runs (CUDA graphs are captured up to
        it; default ``num_slots``), where the cache's other slots only keep prefixes."""
        self.model = model
        config = model.config
        first_param = next(model.parameters())
        self.device = first_param.device
        self.dtype = model.activation_dtype
        self.max_seq_len = max_seq_len
        model.rotary.size_tables_for(max_seq_len)
        self.kv_cache = KVCache(
            num_layers=config.num_hidden_layers,
            num_slots=num_slots,
            max_seq_len=max_seq_len,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=model.cache_dtype,
            device=self.device,
        )
        # Per slot, how many leading positions passes have written since the slot was cleared.
        self._written: dict[int, int] = {}
        # Per slot, the first position a row longer than the native pass takes wrote (through
        # torch's ops, which round otherwise), and the first a call of torch's ops over several
        # rows wrote (its products and attention round each row by the others): prefix caching
        # reuses no key from there on (see positions_computed_alike).
        self._torch_written_from: dict[int, int] = {}
        self._shared_written_from: dict[int, int] = {}
        self.backend: AttentionBackend = select_backend(
            attention_backend,
            self.device,
            dtype=self.dtype,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
        )
        # Rows of up to MAX_QUERY_LEN tokens run through the native CPU kernels when the model
        # qualifies (float32 on CPU, dense weights packed for them by the loader); None otherwise.
        # The native pass does its own attention, the SDPA backend's computation: not used when
        # another backend was asked for.
        self.native = (
            NativeForward.create(model, self.kv_cache) if self.backend.name == "sdpa" else None
        )
        # On CUDA, plain decode passes replay CUDA graphs (brisklm.engine.decode_graphs).
        self.graphs: DecodeGraphs | None = None
        if (
            cuda_graphs
            and self.device.type == "cuda"
            and DecodeGraphs.supported(model, max_seq_len)
        ):
            self.graphs = DecodeGraphs(
                model, self.kv_cache, max_batch_size or num_slots, max_seq_len
            )

    def positions_computed_alike(self, slot: int, length: int, any_offset: bool) -> int:
        """Of a slot's first ``length`` positions, how many a later request recomputing them
        would compute bit for bit alike, and so may reuse. ``any_offset`` (the native pass:
        ``computes_rows_alike``): recomputed from any position, so up to the first a row longer
        than the native pass wrote (a grammar's long forced run, through torch's ops). Otherwise
        recomputed alone in the same prompt chunks: up to the first a call of torch's ops over
        several rows wrote."""
        limit = self._shared_written_from.get(slot, length)
        if any_offset:
            limit = min(limit, self._torch_written_from.get(slot, length))
        return min(length, limit)

    def computes_rows_alike(self, max_row_len: int) -> bool:
        """Whether every row of up to ``max_row_len`` tokens gets each token's keys, values and
        logits bit for bit as in any other pass, whatever its offset and batch (the native pass:
        it computes each token alike in any call)."""
        return self.native is not None and max_row_len <= MAX_QUERY_LEN

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Float32 logits (sum(num_logits), V), rows in batch order, positions in order within a row.

        Under inference mode. The engine's thread is in it already, and the pass then does not
        enter it again: a sampled or speculative step calls this up to k + 1 times, and each entry
        and exit ran ~14 Python calls after the weights had streamed through the caches."""
        if torch.is_inference_mode_enabled():
            return self._forward(batch)
        with torch.inference_mode():
            return self._forward(batch)

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        query_lens = [len(t) for t in batch.token_ids]
        self._check(batch, query_lens)
        self._record_writes(batch, query_lens)
        if self._graphs_take(batch, query_lens):
            assert self.graphs is not None
            return self.graphs.forward(
                [tokens[0] for tokens in batch.token_ids], batch.slots, batch.start_positions
            )
        if self.native is None:
            return self._forward_torch(batch, query_lens)
        if self._native_runs_all(query_lens):
            return self.native.forward(
                batch.token_ids, batch.slots, batch.start_positions, batch.num_logits
            )
        # Each row's path depends on its own length only, so its logits do not depend on its batch.
        short = [i for i, n in enumerate(query_lens) if n <= MAX_QUERY_LEN]
        if not short:
            return self._forward_torch(batch, query_lens)
        return self._forward_in_parts(batch, short)

    def _check(self, batch: ForwardBatch, query_lens: list[int]) -> None:
        """A ValueError for rows that do not fit the cache or give more logits than tokens."""
        rows = len(batch.slots)
        if not (
            len(batch.start_positions) == len(batch.token_ids) == len(batch.num_logits) == rows
        ):
            raise ValueError(
                "a forward batch needs one start position, token list and count per slot"
            )
        for slot, start, length, count in zip(
            batch.slots, batch.start_positions, query_lens, batch.num_logits
        ):
            if length < 1 or start < 0 or start + length > self.max_seq_len:
                raise ValueError(
                    f"row of {length} tokens at position {start} does not fit the cache of "
                    f"{self.max_seq_len} positions"
                )
            if not 0 <= slot < self.kv_cache.num_slots:
                raise ValueError(f"slot {slot} is not one of the cache's {self.kv_cache.num_slots}")
            if not 0 <= count <= length:
                raise ValueError(f"a row of {length} tokens cannot give {count} logits")

    def _record_writes(self, batch: ForwardBatch, query_lens: list[int]) -> None:
        """Note how far the pass writes each row's slot (what ``clear_slot`` zeroes)."""
        for slot, start, length in zip(batch.slots, batch.start_positions, query_lens):
            self._written[slot] = max(self._written.get(slot, 0), start + length)
            if self.native is not None and length > MAX_QUERY_LEN:
                _mark_from(self._torch_written_from, slot, start)

    def clear_slot(self, slot: int) -> None:
        """Zero what passes wrote to a slot's keys and values, when the sequence in it is done.

        Attention over a padded batch (SDPA, the reference, a CUDA graph's key bucket) reads
        every row up to the longest and masks the rest; a masked position weighs 0, but 0 times
        an infinite or NaN value left by the slot's previous sequence (a float16 cache that
        overflowed) is NaN, which would spoil an unrelated request's output."""
        self.keep_slot_prefix(slot, 0)

    def keep_slot_prefix(self, slot: int, length: int, source: int | None = None) -> None:
        """Keep a slot's first ``length`` positions for a new sequence that starts with the same
        tokens (prefix caching) and zero the rest its previous sequence wrote (see
        ``clear_slot``). With a ``source`` slot, its first ``length`` positions are copied in
        first (the slot's own sequence is dropped)."""
        self._torch_written_from.pop(slot, None)  # a retained prefix ends before them
        self._shared_written_from.pop(slot, None)
        if source is not None:
            self.keep_slot_prefix(slot, 0)
            self.kv_cache.copy_slot(source, slot, length)
            self._written[slot] = length
            return
        written = self._written.pop(slot, 0)
        if written > length:
            self.kv_cache.keys[:, slot, :, length:written].zero_()
            self.kv_cache.values[:, slot, :, length:written].zero_()
        if length:
            self._written[slot] = min(written, length)

    def forward_greedy(
        self, batch: ForwardBatch, columns: int
    ) -> tuple[torch.Tensor | None, list[int] | None]:
        """The pass of ``forward``. When the native pass runs the whole batch, (None, each logits
        row's greedy token over its first ``columns`` logits): it finds them as it computes the
        logits, which nobody then reads (``NativeForward.forward_greedy``). Otherwise
        (``forward``'s logits, None). The native pass records no autograd graph, so unlike
        ``forward`` this does not enter inference mode itself (the engine's step is under it)."""
        query_lens = [len(t) for t in batch.token_ids]
        if (
            self.native is None
            or not self._native_runs_all(query_lens)
            or self._graphs_take(batch, query_lens)
        ):
            return self.forward(batch), None
        self._check(batch, query_lens)
        self._record_writes(batch, query_lens)
        tokens = self.native.forward_greedy(
            batch.token_ids, batch.slots, batch.start_positions, batch.num_logits, columns
        )
        return None, tokens

    def run_steps(
        self,
        batch: ForwardBatch,
        columns: int,
        steps: int,
        sampling: StepSampling | None = None,
        adjustments: LogitAdjustments | None = None,
        step_logits: torch.Tensor | None = None,
    ) -> list[list[int]] | None:
        """``steps`` passes of a batch of one-token rows in one native call
        (``NativeForward.run_steps``): each row feeds its token, then each pass's greedy token over
        the first ``columns`` logits, or with ``sampling`` a sampled row's draw, one position on
        (from logits with ``adjustments``: a logit bias and penalties). Returns each pass's tokens,
        ``[step][row]``, each as ``forward_greedy`` of that one token would find it or the native
        sampler draw it (fewer steps where a sampled row had nothing to draw); None where the native
        pass does not take the batch that way (then nothing ran). ``step_logits`` (steps, rows,
        vocab) gets each pass's raw logits."""
        query_lens = [len(t) for t in batch.token_ids]
        if (
            self.native is None
            or any(n != 1 for n in query_lens)
            or any(c != 1 for c in batch.num_logits)
            or not self._native_runs_all(query_lens)
            or self._graphs_take(batch, query_lens)
        ):
            return None
        reach = [steps] * len(query_lens)  # the positions the passes write
        self._check(batch, reach)
        tokens = self.native.run_steps(
            [t[0] for t in batch.token_ids],
            batch.slots,
            batch.start_positions,
            steps,
            columns,
            sampling,
            adjustments,
            step_logits,
        )
        if tokens is not None:
            self._record_writes(batch, reach)
        return tokens

    def _graphs_take(self, batch: ForwardBatch, query_lens: list[int]) -> bool:
        """Whether the batch runs through ``self.graphs`` (plain decode passes)."""
        return self.graphs is not None and self.graphs.takes(
            batch.num_logits, query_lens, batch.row_invariant
        )

    @staticmethod
    def _native_runs_all(query_lens: list[int]) -> bool:
        """Whether one native pass takes rows of these lengths."""
        return max(query_lens) <= MAX_QUERY_LEN and sum(query_lens) <= NATIVE_MAX_TOKENS

    def _forward_in_parts(self, batch: ForwardBatch, short: list[int]) -> torch.Tensor:
        """Short rows through the native pass (in calls of at most its token limit), the others
        through torch's ops; logits merged back into batch order.

        Rows go into calls longest first, each into the first call with room (every call reads
        all the weights once, and a row's logits do not depend on its call): a 512-token prompt
        chunk between decoding rows makes two calls, not three."""
        limit = NATIVE_MAX_TOKENS
        groups: list[list[int]] = []
        sizes: list[int] = []
        for index in sorted(short, key=lambda i: -len(batch.token_ids[i])):
            length = len(batch.token_ids[index])
            room = next((g for g, size in enumerate(sizes) if size + length <= limit), None)
            if room is None:
                groups.append([])
                sizes.append(0)
                room = len(groups) - 1
            groups[room].append(index)
            sizes[room] += length
        for group in groups:
            group.sort()
        chosen = set(short)
        long_rows = [i for i in range(len(batch.slots)) if i not in chosen]
        if long_rows:
            groups.append(long_rows)
        per_row: dict[int, torch.Tensor] = {}
        for group in groups:
            part = ForwardBatch(
                [batch.slots[i] for i in group],
                [batch.start_positions[i] for i in group],
                [batch.token_ids[i] for i in group],
                [batch.num_logits[i] for i in group],
                batch.row_invariant,
                None if batch.stepwise is None else [batch.stepwise[i] for i in group],
            )
            logits = self.forward(part)
            for index, chunk in zip(group, logits.split(part.num_logits)):
                per_row[index] = chunk
        return torch.cat([per_row[i] for i in range(len(batch.slots))])

    def _forward_torch(self, batch: ForwardBatch, query_lens: list[int]) -> torch.Tensor:
        if len(query_lens) > 1:
            for slot, start in zip(batch.slots, batch.start_positions):
                _mark_from(self._shared_written_from, slot, start)
        meta = AttentionMetadata.build(
            batch.slots,
            batch.start_positions,
            query_lens,
            self.device,
            batch.row_invariant,
            batch.stepwise,
        )
        ids = torch.tensor([t for tokens in batch.token_ids for t in tokens], dtype=torch.int64)
        hidden = self.model(ids.to(self.device), meta, self.kv_cache, self.backend)  # (N, E)
        return self.model.compute_logits(self._select(hidden, query_lens, batch.num_logits))

    @staticmethod
    def _select(hidden: torch.Tensor, query_lens: list[int], num_logits: list[int]) -> torch.Tensor:
        """The hidden states whose logits are wanted, as (M, E): the LM head only runs on those."""
        if num_logits == query_lens:
            return hidden
        index: list[int] = []
        end = 0
        for length, count in zip(query_lens, num_logits):
            end += length
            index.extend(range(end - count, end))
        if len(index) == len(query_lens) and all(n == 1 for n in query_lens):
            return hidden
        return hidden.index_select(0, torch.tensor(index, dtype=torch.int64, device=hidden.device))


def _mark_from(marks: dict[int, int], slot: int, start: int) -> None:
    """Record that ``slot`` was written from ``start`` on (the earliest such start is kept)."""
    marks[slot] = min(marks.get(slot, start), start)
