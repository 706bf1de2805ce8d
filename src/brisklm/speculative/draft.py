"""A small draft model that proposes tokens from its own KV cache, kept in step with the target's slots."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from brisklm.cache.prefix_cache import common_prefix_length
from brisklm.config import ModelConfig
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.kernels.native import MAX_TOKENS
from brisklm.models.llama import LlamaForCausalLM
from brisklm.sampling import SamplingMetadata, SamplingParams
from brisklm.sampling.categorical import NO_TOKEN, uniforms_for_rows
from brisklm.sampling.sampler import greedy_tokens, sample_with_probs
from brisklm.speculative.proposer import DraftRow, Proposal

logger = logging.getLogger(__name__)

# Added to a request's seed for its draft generator (mod 2**64): the golden-ratio increment.
_DRAFT_SEED_OFFSET = 0x9E3779B97F4A7C15


def make_draft_generator(
    params: SamplingParams, device: torch.device | str
) -> torch.Generator | None:
    """The draft model's own generator for a request, seeded from (not equal to) ``params.seed``;
    None when the request has no seed or is greedy.

    Keep it next to the request's target generator for the request's whole life: the draft's
    draws then never interleave with the target's, so a seeded request is reproducible."""
    if params.seed is None or params.is_greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed((params.seed + _DRAFT_SEED_OFFSET) % 2**64)
    return generator


def check_compatible(
    target_config: ModelConfig,
    draft_config: ModelConfig,
    tokenizer: Any,
    draft_tokenizer: Any = None,
) -> None:
    """Raise ValueError unless the draft model speaks the target's vocabulary.

    ``tokenizer`` is the target's (a :class:`brisklm.tokenizer.Tokenizer`). With the draft's own
    tokenizer, every real token id must stand for the same bytes in both, and the draft's
    embedding must cover them (padding past the tokenizer may differ, as across Qwen2.5 sizes).
    Without it, only the vocabulary sizes can be compared, so they must be equal.
    """
    num_real = min(tokenizer.vocab_size, target_config.vocab_size)
    if draft_tokenizer is None:
        if draft_config.vocab_size != target_config.vocab_size:
            raise ValueError(
                f"draft model vocabulary size {draft_config.vocab_size} does not match the target "
                f"model's {target_config.vocab_size} (target tokenizer: {tokenizer.vocab_size} "
                f"tokens); a draft model must use the target's tokenizer"
            )
        return
    if draft_config.vocab_size < num_real:
        raise ValueError(
            f"draft model vocabulary size {draft_config.vocab_size} is smaller than the target's "
            f"{num_real} tokens (target model {target_config.vocab_size}, target tokenizer "
            f"{tokenizer.vocab_size}); a draft model must use the target's tokenizer"
        )
    target_bytes = tokenizer.token_bytes()[:num_real]
    draft_bytes = draft_tokenizer.token_bytes()[:num_real]
    if target_bytes != draft_bytes:
        differ = next(
            (i for i, (a, b) in enumerate(zip(target_bytes, draft_bytes)) if a != b),
            min(len(target_bytes), len(draft_bytes)),
        )
        raise ValueError(
            f"draft tokenizer ({draft_tokenizer.vocab_size} tokens) differs from the target "
            f"tokenizer ({tokenizer.vocab_size} tokens) at token id {differ}; a draft model must "
            f"use the target's tokenizer"
        )


def _group_by_length(
    lengths: Sequence[int], max_ratio: float = 1.25, free_padding: int = 64
) -> list[list[int]]:
    """Indices grouped, longest first, so that each group's padded size (rows x longest row) is
    at most ``max_ratio`` x its real tokens + ``free_padding``: short rows share one pass (a pass
    costs more than a few padding tokens), a long prompt does not pad short rows to its length."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    num_real = 0  # real tokens in the last group
    for i in order:
        if groups:
            group = groups[-1]
            padded = (len(group) + 1) * lengths[group[0]]
            if padded <= max_ratio * (num_real + lengths[i]) + free_padding:
                group.append(i)
                num_real += lengths[i]
                continue
        groups.append([i])
        num_real = lengths[i]
    return groups


@dataclass
class _SlotState:
    """What the draft knows about one slot: the context it last saw, what it proposed after it,
    and how many leading tokens of that sequence have keys and values in its cache."""

    num_context: int = 0
    proposals: list[int] = field(default_factory=list)
    num_cached: int = 0


@dataclass
class _Plan:
    """One row of a propose call."""

    index: int
    row: DraftRow
    num_tokens: int  # L, context length
    max_tokens: int  # k for this row
    drafted: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    num_matched: int = 0  # proposals accepted into the row's grammar matcher


class DraftModelProposer:
    """Proposes with a draft model over its own :class:`ModelRunner` and KV cache, whose slots are
    numbered like the target engine's.

    Each ``propose`` first feeds, in one ragged pass, the tokens of each row its cache has not seen
    (the whole prompt for a new request, usually one or two tokens after a verification step), then
    runs up to k - 1 single-token steps batched over the rows still drafting. The per-row q it
    returns is the exact distribution each proposal was drawn from: the draft's logits cut or padded
    to the target's vocabulary width, ids past the tokenizer masked (as the engine does for the
    target), the request's grammar mask when ``row.matcher`` is set, then :func:`processed_probs`
    with the request's SamplingParams, its output plus the proposals so far (penalties, min_tokens).

    The proposer checks each row's context against what it proposed last time, so rejected
    proposals are dropped from its cache even if ``rollback`` was not called; ``rollback`` trims
    eagerly, ``release`` must be called when a slot changes hands. A row stops drafting after a
    token that would end its request (eos, a stop token id, or a grammar's end).

    With ``tokenizer`` (the target's), :func:`check_compatible` runs first; ``target_config`` sets
    the width of q to the target's logits (default: the draft's own vocabulary).
    ``max_batch_size``: the most rows a pass runs, where the engine's ``num_slots`` include slots
    that only keep prefixes (default: ``num_slots``).
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        num_slots: int,
        max_seq_len: int,
        num_speculative_tokens: int,
        attention_backend: str = "auto",
        *,
        cuda_graphs: bool = True,
        target_config: ModelConfig | None = None,
        tokenizer: Any = None,
        draft_tokenizer: Any = None,
        max_batch_size: int | None = None,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        draft_config = model.config
        target = target_config or draft_config
        if tokenizer is not None:
            check_compatible(target, draft_config, tokenizer, draft_tokenizer)
        if draft_config.max_position_embeddings < max_seq_len:
            logger.warning(
                "the draft model was trained on %d positions and the engine's context is %d: "
                "past %d its proposals are extrapolated (the output stays the target's; fewer "
                "proposals may be accepted)",
                draft_config.max_position_embeddings,
                max_seq_len,
                draft_config.max_position_embeddings,
            )
        self.runner = ModelRunner(
            model,
            num_slots,
            max_seq_len,
            attention_backend,
            cuda_graphs=cuda_graphs,
            max_batch_size=max_batch_size,
        )
        self.device = self.runner.device
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.num_speculative_tokens = num_speculative_tokens
        self.vocab_size = target.vocab_size  # width of every q returned
        self.num_real_tokens = min(self.vocab_size, draft_config.vocab_size)
        if tokenizer is not None:
            self.num_real_tokens = min(self.num_real_tokens, tokenizer.vocab_size)
        eos = tokenizer.eos_token_ids if tokenizer is not None else draft_config.eos_token_ids
        # An eos past the vocabulary masks nothing (the engine drops it too, with a warning).
        self.eos_token_ids: tuple[int, ...] = tuple(t for t in eos if t < self.num_real_tokens)
        self._slots: list[_SlotState | None] = [None] * num_slots
        # Prefix caching (enable_prefix_reuse): per slot, the tokens whose keys and values the
        # draft cache holds for a later request that starts alike.
        self.keeps_prefixes = False
        self._kept: dict[int, list[int]] = {}

    # ----------------------------------------------------------------- slot bookkeeping
    def num_cached_tokens(self, slot: int) -> int:
        """How many leading tokens of the slot's sequence the draft cache holds."""
        state = self._slots[self._check_slot(slot)]
        return 0 if state is None else state.num_cached

    def rollback(self, slot: int, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` of the slot's context-plus-proposals (see :class:`Proposer`)."""
        state = self._slots[self._check_slot(slot)]
        total = 0 if state is None else state.num_context + len(state.proposals)
        if not 0 <= num_tokens <= total:
            raise ValueError(f"slot {slot}: can roll back 0..{total} tokens, got {num_tokens}")
        if state is None or num_tokens == 0:
            return
        remaining = total - num_tokens
        if remaining >= state.num_context:
            del state.proposals[remaining - state.num_context :]
        else:
            state.num_context = remaining
            state.proposals = []
        state.num_cached = min(state.num_cached, remaining)

    def release(self, slot: int) -> None:
        """The slot's request is gone: its cached tokens are no longer valid."""
        self._slots[self._check_slot(slot)] = None
        self._kept.pop(slot, None)
        self.runner.clear_slot(slot)

    # ----------------------------------------------------------------- prefix caching
    def enable_prefix_reuse(self, chunk_size: int) -> None:
        """The engine keeps finished requests' prefixes: keep the draft's alongside where its
        pass computes each token alike whatever the row (the native pass, chunks of at most
        its length), so a reused prefix gives the draft the keys it would compute itself; not
        with dynamic NTK rope past the draft's trained context (a key rotates by its pass's
        longest position there)."""
        self.keeps_prefixes = self.runner.computes_rows_alike(
            chunk_size
        ) and not self.runner.model.rotary.rotates_by_length(self.max_seq_len)

    def retain(self, slot: int, token_ids: Sequence[int]) -> None:
        """The slot's request is gone and the engine keeps its prefix ``token_ids``: keep the
        draft's keys and values of as much of it as the draft cache holds."""
        valid = self._num_held(slot, token_ids)
        if not self.keeps_prefixes or not valid:
            self.release(slot)
            return
        self._slots[slot] = None
        self._kept[slot] = list(token_ids[:valid])
        self.runner.keep_slot_prefix(slot, valid)

    def _num_held(self, slot: int, token_ids: Sequence[int]) -> int:
        """Of the slot's sequence ``token_ids``, how many leading tokens' keys the draft cache
        holds as a pass computing them again would compute them."""
        state = self._slots[self._check_slot(slot)]
        valid = 0 if state is None else min(state.num_cached, state.num_context, len(token_ids))
        return self.runner.positions_computed_alike(slot, valid, True)

    def claim(
        self,
        slot: int,
        prompt: Sequence[int],
        source: int | None,
        source_tokens: Sequence[int] | None = None,
    ) -> None:
        """The engine gave ``slot`` to a new request with ``prompt``, reusing the target's keys
        there (or copied from slot ``source``): reuse the draft's kept keys of the same start
        (at least the prompt's last token is fed: its logits start the first proposal).
        ``source_tokens``: where ``source`` is a running request's slot, its sequence (the draft
        holds its keys as far as it has taken them)."""
        kept: Sequence[int] = self._kept.get(
            self._check_slot(slot if source is None else source), []
        )
        if source is not None and source_tokens is not None and self._slots[source] is not None:
            kept = source_tokens[: self._num_held(source, source_tokens)]
        length = 0
        if self.keeps_prefixes and prompt:
            length = min(common_prefix_length(kept, prompt), len(prompt) - 1)
        self.runner.keep_slot_prefix(slot, length, source if length else None)
        self._kept[slot] = list(prompt[:length])  # still there while the request runs
        self._slots[slot] = _SlotState(num_context=length, num_cached=length) if length else None

    def _check_slot(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is out of range [0, {self.num_slots})")
        return slot

    def _num_reusable(self, row: DraftRow) -> int:
        """Leading tokens of the row's context whose keys and values the draft cache holds (after
        checking that the row is a slot's and its context fits the cache)."""
        slot = self._check_slot(row.slot)
        length = row.num_tokens
        if not 1 <= length <= self.max_seq_len:
            raise ValueError(
                f"slot {slot}: a context of {length} tokens does not fit the draft cache of "
                f"{self.max_seq_len} positions"
            )
        state = self._slots[slot]
        if state is None:
            return 0
        return min(self._num_valid(row, state), state.num_cached)

    def _num_valid(self, row: DraftRow, state: _SlotState | None) -> int:
        """Leading tokens of the row's context that match what the cache was built from."""
        if state is None or row.num_tokens < state.num_context:
            return 0
        seen = row.token_slice(state.num_context, state.num_context + len(state.proposals))
        matched = 0
        for token, proposed in zip(seen, state.proposals):
            if token != proposed:
                break
            matched += 1
        return state.num_context + matched

    # ----------------------------------------------------------------- prefilling
    @torch.inference_mode()
    def prefill(self, rows: Sequence[DraftRow]) -> None:
        """Bring each row's cache up to its whole context (``row.num_tokens`` tokens; nothing is
        proposed). The engine calls this with each prompt chunk the target takes, the row's
        context cut at the chunk's end: a long prompt then enters the draft cache chunk by chunk,
        beside the target's passes, and its first proposal feeds one or two tokens, not the whole
        prompt in the verification step where requests decoding beside it wait."""
        if len({row.slot for row in rows}) != len(rows):
            raise ValueError("each slot may appear only once per prefill call")
        fed: list[DraftRow] = []
        feeds: list[tuple[int, list[int]]] = []
        for row in rows:
            length = row.num_tokens
            num_cached = self._num_reusable(row)
            if num_cached < length:
                fed.append(row)
                feeds.append((num_cached, row.token_slice(num_cached, length)))
        if fed:
            self._feed(fed, feeds, num_logits=0)
        for row in fed:  # only once every pass has run: a failed one leaves the states as they were
            self._slots[row.slot] = _SlotState(
                num_context=row.num_tokens, num_cached=row.num_tokens
            )

    # ----------------------------------------------------------------- proposing
    @torch.inference_mode()
    def propose(self, rows: Sequence[DraftRow]) -> list[Proposal]:
        """One Proposal per row with ``probs`` (n, V) float32; n <= ``row.max_draft_tokens``,
        ``num_speculative_tokens`` and what the draft cache has room for."""
        if len({row.slot for row in rows}) != len(rows):
            raise ValueError("each slot may appear only once per propose call")
        proposals: list[Proposal | None] = [None] * len(rows)
        plans: list[_Plan] = []
        feeds: list[tuple[int, list[int]]] = []  # per plan: (start position, tokens to feed)
        for index, row in enumerate(rows):
            slot, length = row.slot, row.num_tokens
            # Always re-feed at least the last token: its logits give the first proposal.
            num_cached = min(self._num_reusable(row), length - 1)
            self._slots[slot] = _SlotState(num_context=length, proposals=[], num_cached=num_cached)
            # The last proposal is never fed, so k proposals need L + k - 1 cache positions.
            max_tokens = min(
                row.max_draft_tokens, self.num_speculative_tokens, self.max_seq_len - length + 1
            )
            if max_tokens <= 0:
                proposals[index] = Proposal([], self._empty_probs())
                continue
            plans.append(_Plan(index, row, length, max_tokens))
            feeds.append((num_cached, row.token_slice(num_cached, length)))
        if plans:
            # Rows all greedy on the raw logits (no grammar) draft on the kernels' argmax.
            greedy = all(
                plan.row.params.picks_raw_argmax(len(plan.row.output_token_ids))
                and plan.row.matcher is None
                for plan in plans
            )
            self._draft(plans, feeds, greedy)
            for plan in plans:
                state = self._slots[plan.row.slot]
                assert state is not None
                state.proposals = list(plan.drafted)
                state.num_cached = plan.num_tokens + len(plan.drafted) - 1
                # Greedy drafts are a function of the context, as n-gram proposals are: no q.
                if greedy:
                    probs = None
                else:  # (none drafted: its first draw had nothing to draw from)
                    probs = torch.stack(plan.probs) if plan.probs else self._empty_probs()
                proposals[plan.index] = Proposal(list(plan.drafted), probs)
        return [p for p in proposals if p is not None]

    def _draft(self, plans: list[_Plan], feeds: list[tuple[int, list[int]]], greedy: bool) -> None:
        """Extend every row's cache, then draft step by step over the rows still going.

        ``greedy``: every row takes the argmax of the draft's raw logits, which the kernels find as
        they compute them (``_greedy_pass``): the logits are not read and no q is built."""
        rows = [plan.row for plan in plans]
        probs: torch.Tensor | None = None
        metadata: SamplingMetadata | None = None
        if greedy:
            tokens = self._feed_greedy(rows, feeds)
        else:  # (A,), (A, V)
            tokens, probs, metadata = self._next_tokens(self._extend(plans, feeds), plans)
        active = plans
        # Greedy: each row's later tokens from one call of greedy steps (by plan), next first;
        # {}: that call declined, a pass a step.
        queued: dict[int, list[int]] | None = None
        try:
            while True:
                still = []
                for i, plan in enumerate(active):
                    if tokens[i] == NO_TOKEN:  # the draft's distribution had nothing to draw
                        continue  # the proposal ends before it
                    plan.drafted.append(tokens[i])
                    if probs is not None:
                        plan.probs.append(probs[i])
                    if len(plan.drafted) < plan.max_tokens and self._continues(plan, tokens[i]):
                        still.append(plan)
                if not still:
                    return
                # The rows' metadata stays theirs while none went and it does not depend on the
                # tokens drafted (no penalties; min_tokens met, which stays so as they grow).
                if metadata is not None and not (
                    len(still) == len(active) and metadata.no_penalties and metadata.no_min_tokens
                ):
                    metadata = None
                active = still
                batch = ForwardBatch(
                    slots=[plan.row.slot for plan in active],
                    start_positions=[plan.num_tokens + len(plan.drafted) - 1 for plan in active],
                    token_ids=[[plan.drafted[-1]] for plan in active],
                    num_logits=[1] * len(active),
                    row_invariant=any(plan.row.params.is_seeded for plan in active),
                )
                if greedy:
                    if queued is None:
                        queued = self._greedy_steps(batch, active)
                    if queued and all(queued[id(plan)] for plan in active):
                        tokens = [queued[id(plan)].pop(0) for plan in active]
                    else:  # (a row needs more than the call could run: a pass a step from here)
                        queued = {}
                        tokens = self._greedy_pass(batch)
                else:
                    tokens, probs, metadata = self._next_tokens(
                        self.runner.forward(batch), active, metadata
                    )
        finally:
            for plan in plans:
                if plan.num_matched:
                    plan.row.matcher.rollback(plan.num_matched)

    @property
    def _greedy_columns(self) -> int:
        """The logits a greedy draft picks from: the target's real tokens that the draft's
        vocabulary has (the rest are -inf after ``_fit_vocab``)."""
        return min(self.runner.model.config.vocab_size, self.num_real_tokens)

    def _greedy_pass(self, batch: ForwardBatch) -> list[int]:
        """The argmax of each logits row of ``batch`` over ``_greedy_columns``."""
        columns = self._greedy_columns
        logits, tokens = self.runner.forward_greedy(batch, columns)
        if tokens is None:
            assert logits is not None
            tokens = greedy_tokens(logits[:, :columns]).tolist()
        return tokens

    def _greedy_steps(self, batch: ForwardBatch, plans: list[_Plan]) -> dict[int, list[int]]:
        """Each row's greedy tokens for the rest of its proposal from one call of greedy steps
        (``ModelRunner.run_steps``: the tokens of a pass a step, bit for bit), by ``id`` of
        its plan; {} where that does not run (a pass a step then). A row that stops early (a stop
        token) leaves the rest of its tokens unread, and their keys past its proposal, which
        the cache drops as it drops a rejected proposal's. As many steps as the longest proposal
        needs, but what every row's slot has room for and the kernels take in a call."""
        steps = min(
            max(plan.max_tokens - len(plan.drafted) for plan in plans),
            min(self.max_seq_len - start for start in batch.start_positions),
            MAX_TOKENS // len(plans),
        )
        if steps < 2:
            return {}
        chosen = self.runner.run_steps(batch, self._greedy_columns, steps)
        if chosen is None:
            return {}
        return {id(plan): [row[i] for row in chosen] for i, plan in enumerate(plans)}

    def _extend(self, plans: list[_Plan], feeds: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Feed each row its unseen tokens; (A, V_draft) logits at each row's last position."""
        return self._feed([plan.row for plan in plans], feeds, num_logits=1)

    def _feed(
        self, rows: list[DraftRow], feeds: list[tuple[int, list[int]]], num_logits: int
    ) -> torch.Tensor:
        """Feed each row ``feeds[i]`` (start position, tokens); logits of each row's last
        ``num_logits`` positions, rows in order."""
        groups = self._passes(rows, feeds, num_logits)
        rows_logits: list[torch.Tensor | None] = [None] * len(rows)
        for group, batch in groups:
            logits = self.runner.forward(batch)
            if len(groups) == 1 and group == sorted(group):
                return logits
            if num_logits:
                for i, row_logits in zip(group, logits.split(num_logits)):
                    rows_logits[i] = row_logits
        return torch.cat(rows_logits) if num_logits else logits  # type: ignore[arg-type]

    def _feed_greedy(self, rows: list[DraftRow], feeds: list[tuple[int, list[int]]]) -> list[int]:
        """``_feed`` of one logits row each, as the token ``_greedy_pass`` picks there."""
        tokens = [0] * len(rows)
        for group, batch in self._passes(rows, feeds, 1):
            for i, token in zip(group, self._greedy_pass(batch)):
                tokens[i] = token
        return tokens

    @staticmethod
    def _passes(
        rows: list[DraftRow], feeds: list[tuple[int, list[int]]], num_logits: int
    ) -> list[tuple[list[int], ForwardBatch]]:
        """The passes that feed each row ``feeds[i]``, with the rows (indices) of each.

        A ragged pass costs rows x longest row, so rows go in length groups
        (:func:`_group_by_length`): a new 2000-token prompt does not pad seven 2-token rows."""
        return [
            (
                group,
                ForwardBatch(
                    slots=[rows[i].slot for i in group],
                    start_positions=[feeds[i][0] for i in group],
                    token_ids=[feeds[i][1] for i in group],
                    num_logits=[num_logits] * len(group),
                    row_invariant=any(rows[i].params.is_seeded for i in group),
                ),
            )
            for group in _group_by_length([len(tokens) for _, tokens in feeds])
        ]

    def _continues(self, plan: _Plan, token: int) -> bool:
        """Whether to draft past ``token``: not past the end of the request. Stopping depends only
        on tokens already drafted, never on the next one, so it leaves the output distribution alone."""
        params = plan.row.params
        if token in params.stop_token_ids or (
            token in self.eos_token_ids and not params.ignore_eos
        ):
            return False
        matcher = plan.row.matcher
        if matcher is not None:
            if not matcher.accept_token(token):
                return False
            plan.num_matched += 1
            if matcher.is_terminated():
                return False
        return True

    def _next_tokens(
        self, logits: torch.Tensor, plans: list[_Plan], metadata: SamplingMetadata | None = None
    ) -> tuple[list[int], torch.Tensor, SamplingMetadata]:
        """One token per row, the (A, V) distributions q they were drawn from, processed like
        the target's, and the rows' metadata (``metadata``: the last step's, still theirs). When
        every row is greedy, q is the one-hot of the argmax and is built from the argmax directly
        (what drawing from the one-hot would return, with no draws)."""
        logits, metadata = self._processing(logits, plans, metadata)
        tokens, probs = sample_with_probs(logits, metadata, self._uniforms(plans, logits.device))
        return tokens.tolist(), probs, metadata

    def _processing(
        self, logits: torch.Tensor, plans: list[_Plan], metadata: SamplingMetadata | None = None
    ) -> tuple[torch.Tensor, SamplingMetadata]:
        """The draft's logits in the target's width with the grammar masks applied, and the
        sampling metadata of the rows (their own params, output plus the proposals so far), or
        ``metadata`` where given."""
        logits = self._fit_vocab(logits)
        matched = [i for i, plan in enumerate(plans) if plan.row.matcher is not None]
        if matched:
            from brisklm.constrained import allocate_token_bitmask, apply_token_bitmask_

            for i in matched:
                matcher = plans[i].row.matcher
                bitmask = allocate_token_bitmask(1, matcher.compiled.vocab_size)
                matcher.fill_bitmask(bitmask, 0)
                apply_token_bitmask_(logits[i : i + 1], bitmask)
        if metadata is not None:
            return logits, metadata
        metadata = SamplingMetadata.build(
            [plan.row.params for plan in plans],
            [plan.row.prompt_token_ids for plan in plans],
            [[*plan.row.output_token_ids, *plan.drafted] for plan in plans],
            [plan.row.generator for plan in plans],
            vocab_size=self.vocab_size,
            device=logits.device,
            eos_token_ids=self.eos_token_ids,
        )
        return logits, metadata

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits (A, V_draft) -> (A, V) in the target's width, non-tokens masked to -inf."""
        width = logits.shape[1]
        if width > self.vocab_size:
            logits = logits[:, : self.vocab_size].clone()
        elif width < self.vocab_size:
            pad = logits.new_full((logits.shape[0], self.vocab_size - width), float("-inf"))
            logits = torch.cat([logits, pad], dim=1)
        if self.num_real_tokens < self.vocab_size:
            logits[:, self.num_real_tokens :] = float("-inf")
        return logits

    @staticmethod
    def _uniforms(plans: list[_Plan], device: torch.device) -> torch.Tensor:
        """(A,) one uniform per row for its inverse-CDF draw (an exact categorical draw): seeded
        rows from their own generator, greedy rows none (their q is one-hot: the argmax)."""
        return uniforms_for_rows(
            [plan.row.params.is_greedy for plan in plans],
            [plan.row.generator for plan in plans],
            device,
        )

    def _empty_probs(self) -> torch.Tensor:
        return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.device)
