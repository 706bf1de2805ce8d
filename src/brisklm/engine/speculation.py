"""Speculative decode steps: a proposer drafts tokens, one target pass verifies them, rejection
sampling keeps the output distribution exactly the target's, rejected tokens are rolled back."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

import torch

from brisklm.engine.model_runner import ForwardBatch, decode_rows_stepwise
from brisklm.engine.request import Request
from brisklm.outputs import SpeculativeStats, StreamChunk, TokenLogprob, joined
from brisklm.speculative import (
    DraftLength,
    DraftLengthSchedule,
    DraftRow,
    Proposal,
    Proposer,
    StepCosts,
    accept_greedy,
    batch_proposals,
    greedy_verification,
    rejection_sample,
    target_probs,
    verification_counts,
)

if TYPE_CHECKING:
    from brisklm.engine.llm_engine import LLMEngine, StepResult

logger = logging.getLogger(__name__)

# A step whose end is further from the next one's start than this, or than the step took, is not
# timed: the engine did something else between them (or the machine stalled), and its time says
# nothing of what the step costs.
MAX_GAP_SECONDS = 0.005
# The kinds of step the schedule times: plain decoding, speculative decoding, or neither (a pass
# with a prompt chunk in it).
_UNTIMED, _PLAIN, _SPECULATIVE = range(3)


class _LastStep(NamedTuple):
    """The last step, until the next one's start times it (``Speculator._settle``)."""

    kind: int  # _UNTIMED, _PLAIN or _SPECULATIVE
    started: float
    ended: float
    steps: int  # (a plain call of several)
    recorded: list[tuple[Request, int, int]]  # its target steps: (request, proposed, accepted)


class Speculator:
    """Runs decode steps with a proposer (draft model or n-gram lookup) for an LLMEngine."""

    def __init__(
        self, proposer: Proposer, num_speculative_tokens: int, draft_length: str = "fixed"
    ) -> None:
        self.schedule = DraftLengthSchedule(num_speculative_tokens, draft_length)
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        # How long this engine's decode steps take, for the adaptive schedule.
        self.costs = StepCosts()
        # The step's target steps, (request, proposed, accepted), whose schedules advance once it
        # is timed, at the next step's start (``_settle``).
        self._recorded: list[tuple[Request, int, int]] = []
        self._last_step: _LastStep | None = None

    def release(self, request: Request) -> None:
        if request.slot is not None:
            self.proposer.release(request.slot)

    # Prefix caching: a proposer with a cache of its own (the draft model) keeps and reuses the
    # same prefixes as the target; the others only hear that the slot's request is gone.
    def enable_prefix_reuse(self, chunk_size: int) -> None:
        enable = getattr(self.proposer, "enable_prefix_reuse", None)
        if enable is not None:
            enable(chunk_size)

    def retain(self, request: Request, token_ids: Sequence[int]) -> None:
        """The request is gone and the engine keeps its prefix ``token_ids`` in its slot."""
        retain = getattr(self.proposer, "retain", None)
        if request.slot is not None and retain is not None:
            retain(request.slot, token_ids)
        else:
            self.release(request)

    def claim(
        self,
        slot: int,
        prompt: Sequence[int],
        source: int | None,
        source_tokens: Sequence[int] | None = None,
    ) -> None:
        """A new request took ``slot``, reusing the target's keys there (or from ``source``;
        ``source_tokens``: the sequence of the running request there, if one is)."""
        claim = getattr(self.proposer, "claim", None)
        if claim is not None:
            claim(slot, prompt, source, source_tokens)

    def prefill(
        self,
        requests: Sequence[Request],
        prefill_lens: Sequence[int],
        chunk_size: int | None = None,
    ) -> None:
        """Before the target takes ``prefill_lens[i]`` more prompt tokens of request i, let a
        proposer with a cache of its own (one that defines ``prefill``) take them too. Where its
        cache lags further behind (the target reused a prefix from its prefix cache), it takes
        the gap in the prompt chunks of ``chunk_size`` it would have taken without that reuse,
        one pass each, so its keys and proposals are the same either way."""
        prefill = getattr(self.proposer, "prefill", None)
        if prefill is None:
            return
        cached = getattr(self.proposer, "num_cached_tokens", None)
        pending = [(r, r.num_cached + n, -1) for r, n in zip(requests, prefill_lens) if n]
        while pending:
            rows, later = [], []
            for request, end, before in pending:
                cut = end
                if chunk_size is not None and cached is not None:
                    have = cached(request.slot)
                    if have > before:  # (a cache that did not advance takes the rest at once)
                        cut = min(end, (have // chunk_size + 1) * chunk_size)
                    if cut < end:
                        later.append((request, end, have))
                rows.append(
                    DraftRow(
                        slot=request.slot,  # type: ignore[arg-type]
                        prompt_token_ids=request.prompt_token_ids[:cut],
                        output_token_ids=(),
                        max_draft_tokens=0,
                        params=request.params,
                    )
                )
            prefill(rows)
            pending = later

    def _draft_length(self, request: Request) -> DraftLength:
        """Where ``request`` stands in its draft length schedule."""
        if request.draft_length is None:
            request.draft_length = self.schedule.start()
        return request.draft_length

    def _proposal_size(self, request: Request) -> int:
        """Tokens to propose for ``request`` this step: 0 while its schedule pauses it."""
        return self.schedule.proposal_size(self._draft_length(request))

    def _rows(self, requests: Sequence[Request], engine: LLMEngine) -> list[DraftRow]:
        return [
            DraftRow(
                slot=r.slot,  # type: ignore[arg-type]
                prompt_token_ids=r.prompt_token_ids,
                # (pending forced tokens: the output's, as a request without logprobs has them;
                # no copy of a long output each step where there are none)
                output_token_ids=(
                    r.output_token_ids + r.pending_forced
                    if r.pending_forced
                    else r.output_token_ids
                ),
                max_draft_tokens=self._max_draft_tokens(r, engine),
                params=r.params,
                generator=r.draft_generator,
                matcher=r.matcher,
            )
            for r in requests
        ]

    def _max_draft_tokens(self, request: Request, engine: LLMEngine) -> int:
        """How many tokens ``request`` may have verified this step.

        Each step emits up to n + 1 tokens: never past max_tokens or the context (nor past a
        thinking budget's count, which ``_emit`` cuts the run at, so that the tokens before it
        are those the request would take without a budget; none while the budget forces its
        closing tag). And never past a dynamic NTK model's trained context: there a pass rotates
        each row by its longest position, so a row of n proposals would rotate them (and the keys
        it caches) otherwise than the one-token steps of decoding without a draft, and change the
        output.
        """
        if request.matcher is not None and request.matcher.took_eos_as_content:
            # llguidance (1.9) can fail on the states that verifying proposals rolls back to once
            # its grammar has taken an EOS as content: such a request decodes without a draft.
            return 0
        pending = len(request.pending_forced)
        free = request.thinking_free_tokens
        if free is not None and free <= pending:
            return 0  # a thinking budget's closing tag comes next: forced, not proposed
        size = max(0, min(self._proposal_size(request), request.max_new_tokens - pending - 1))
        rotary = engine.model.rotary
        while size and rotary.rotates_by_length(request.num_tokens + pending + size):
            size -= 1
        return size

    @staticmethod
    def _valid_for_grammar(
        requests: Sequence[Request], proposals: list[Proposal]
    ) -> tuple[list[Proposal], list[Proposal]]:
        """``(fed, tested)``: the proposals the verification pass feeds and those rejection
        sampling tests. A constrained request's proposals are fed only up to an EOS: an EOS a
        grammar takes as content would otherwise enter the request's matcher while masks are
        computed, and llguidance (1.9) does not roll such an EOS back correctly. An EOS needs no
        feeding (nothing follows it), so a sampled draft's EOS is still tested, as the token
        after the fed ones, against the target's distribution there (kept with probability
        min(1, p/q), else a draw from max(0, p - q)): drawn afresh instead, constrained output
        ended less often than the target's own. Greedy and deterministic (n-gram) proposals are
        a function of the context, so cutting them is lossless: those are also cut at the first
        token the grammar forbids, and the target picks the token after them itself.
        """
        fed, tested = [], []
        for request, proposal in zip(requests, proposals):
            cut = proposal
            if request.matcher is not None and proposal.token_ids:
                ids, probs = proposal.token_ids, proposal.probs
                end = next((i for i, t in enumerate(ids) if t in request.eos_token_ids), len(ids))
                if probs is None:
                    end = request.matcher.validate_tokens(ids[:end])
                if end < len(ids):
                    cut = Proposal(ids[:end], None if probs is None else probs[:end])
                    if probs is None or request.params.is_greedy:
                        proposal = cut
                    else:  # ids[end] is the EOS
                        proposal = Proposal(ids[: end + 1], probs[: end + 1])
            fed.append(cut)
            tested.append(proposal)
        return fed, tested

    def _record(self, request: Request, num_proposed: int, num_accepted: int) -> None:
        """Count a target step of ``request`` in its stats and advance its draft length."""
        stats = request.speculative or SpeculativeStats()
        request.speculative = stats
        stats.num_steps += 1
        stats.num_proposed += num_proposed
        stats.num_accepted += num_accepted
        self._recorded.append((request, num_proposed, num_accepted))

    def _cost(self, request: Request, num_proposed: int, seconds: float | None) -> float | None:
        """The plain steps that a speculative step of ``seconds`` (None: not timed) proposing
        ``num_proposed`` tokens for ``request`` cost (``StepCosts.cost``); None where the schedule
        does not ask (a plain step, a fixed schedule), the step was not timed, and for a request
        whose tokens follow from its proposals (seeded and sampled): it must not propose by how
        fast the engine ran (see brisklm.speculative.draft_length)."""
        if not num_proposed or seconds is None or self.schedule.schedule != "adaptive":
            return None
        if request.params.is_seeded:  # (sampled with a seed)
            return None
        return self.costs.cost(seconds)

    def _plain_step(
        self, engine: LLMEngine, requests: list[Request], prefill_lens: list[int]
    ) -> tuple[list[StepResult], int]:
        """A pass without proposals: prompt chunks, and decoding requests that their schedules
        all pause, for as many steps a call as the shortest pause left allows (rows without a
        draft, paused for good: as the target alone would run). Its results, and
        the steps it ran where nothing but one-token decoding rows ran in it (else 0)."""
        decoding = [r for r, n in zip(requests, prefill_lens) if not n]
        pauses = [self._draft_length(r).paused for r in decoding]
        one_token_rows = len(decoding) == len(requests) and all(
            len(r.uncached_token_ids) == 1 for r in decoding
        )
        before = [r.num_cached for r in decoding]
        max_steps = int(min(min(pauses, default=1), engine.config.max_decode_steps))
        results = engine.plain_step(requests, prefill_lens, max_steps)
        # One-token rows each took a step per token cached (a call of several steps, or one).
        steps = [
            max(1, r.num_cached - b) if one_token_rows else 1 for r, b in zip(decoding, before)
        ]
        # Target steps like any other, ones that proposed nothing.
        for request, count in zip(decoding, steps):
            for _ in range(count):
                self._record(request, 0, 0)
        return results, max(steps) if one_token_rows and decoding else 0

    def _settle(self, now: float, requests: list[Request]) -> None:
        """Advance the schedules past the last step's target steps, that step timed from its
        start to ``now`` (this step's start: the engine's own work between steps included, which
        a plain call of several steps shares out) where ``requests`` continue its rows (the
        engine went on to this step without waiting, and none of its rows left), and count a
        plain step's time in ``self.costs``."""
        last, self._last_step = self._last_step, None
        if last is None:
            return
        seconds = None
        went_on = now - last.ended <= max(MAX_GAP_SECONDS, last.ended - last.started)
        if last.kind != _UNTIMED and went_on:
            going = set(map(id, requests))  # (each row of a step recorded a target step)
            if all(id(request) in going for request, _, _ in last.recorded):
                seconds = now - last.started
        if last.kind == _PLAIN and seconds is not None:
            self.costs.add_plain(seconds / last.steps)
        spent = seconds if last.kind == _SPECULATIVE else None
        for request, num_proposed, num_accepted in last.recorded:
            cost = self._cost(request, num_proposed, spent)
            self.schedule.update(self._draft_length(request), num_proposed, num_accepted, cost)

    def _ended(self, kind: int, started: float, steps: int) -> None:
        """Keep the step's recorded target steps, to advance their schedules once it is timed
        (``_settle``)."""
        self._last_step = _LastStep(kind, started, time.perf_counter(), steps, self._recorded)
        self._recorded = []

    def step(
        self, engine: LLMEngine, requests: list[Request], prefill_lens: list[int] | None = None
    ) -> list[StepResult]:
        """One target pass: the decoding requests verify their proposals, and requests feeding
        their prompt (``prefill_lens[i]`` > 0) take their next chunk in the same pass (the draft
        model takes it first). Verification rows see only themselves (row-invariant passes when
        a request is seeded), so a prompt arriving leaves a seeded request's tokens unchanged."""
        if prefill_lens is None:
            prefill_lens = [0] * len(requests)
        start = time.perf_counter()
        self._settle(start, requests)
        self._recorded = []  # (what a failed step recorded)
        chunked = [(r, n) for r, n in zip(requests, prefill_lens) if n]
        decoding = [r for r, n in zip(requests, prefill_lens) if not n]
        drafted = [(r, n) for r, n in chunked if not self._draft_length(r).without_draft]
        if drafted:
            try:
                self.prefill(
                    [r for r, _ in drafted], [n for _, n in drafted], engine.prefill_chunk_size
                )
            except Exception as exc:
                self._without_draft([r for r, _ in drafted], exc)
        failed = False
        if any(self._proposal_size(r) for r in decoding):
            results = self._speculative_step(engine, decoding, chunked)
            if results is not None:
                self._ended(_UNTIMED if chunked else _SPECULATIVE, start, 1)
                return results
            failed = True  # (the proposer: a plain pass, not timed as one)
        # No chunks but prompts, or every decoding row paused by its schedule (or without a
        # draft): a plain pass.
        plain, steps = self._plain_step(engine, requests, prefill_lens)
        self._ended(_PLAIN if steps and not failed else _UNTIMED, start, steps)
        return plain

    def _without_draft(self, requests: list[Request], exc: Exception) -> None:
        """The proposer failed on a pass of ``requests``: they decode to their end without it
        (the output stays the target's; the draft's cache records only passes that ran), and
        later requests try it again."""
        logger.warning(
            "the speculative proposer failed (%s: %s); its %d requests go on without it",
            type(exc).__name__,
            exc,
            len(requests),
            exc_info=exc,
        )
        for request in requests:
            self._draft_length(request).paused = math.inf  # (for good: without_draft)

    def _speculative_step(
        self,
        engine: LLMEngine,
        decoding: list[Request],
        chunked: list[tuple[Request, int]],
    ) -> list[StepResult] | None:
        """The target pass of ``step`` where some decoding request proposes; None where the
        proposer failed (the rows then decode without it, and nothing ran)."""
        rows = self._rows(decoding, engine)
        # Sampled proposals draw from each request's draft generator: a pass that fails (and is
        # run again, see LLMEngine._step) must leave them where they were, or a seeded request
        # would propose, and so emit, other tokens than alone.
        drawn = [r for r in decoding if r.draft_generator is not None]
        states = [r.draft_generator.get_state() for r in drawn]  # type: ignore[union-attr]
        try:
            proposed = self.proposer.propose(rows)
        except BaseException as exc:
            _restore(drawn, states)
            if not isinstance(exc, Exception):
                raise
            # The rows the draft was to propose for (a paused row's went into no draft pass),
            # or all where none was.
            proposing = [r for r, row in zip(decoding, rows) if row.max_draft_tokens]
            self._without_draft(proposing or decoding, exc)
            return None
        try:
            proposals, tested = self._valid_for_grammar(decoding, proposed)
        except BaseException:
            _restore(drawn, states)
            raise
        counts = verification_counts(proposals)
        feeds = [r.uncached_token_ids for r in decoding]
        chunk_feeds = [engine.feed(r, n) for r, n in chunked]
        chunk_logits = [int(engine.samples_after(r, n)) for r, n in chunked]
        sampled = [r for (r, _), k in zip(chunked, chunk_logits) if k]
        # (a prompt chunk with prompt logprobs: a row before those for each of its tokens)
        chunk_extra = [engine.prompt_logprob_rows(r, n) for r, n in chunked]
        chunk_logits = [k + e for k, e in zip(chunk_logits, chunk_extra)]
        row_invariant = any(r.params.is_seeded for r in [*decoding, *(r for r, _ in chunked)])
        forward = ForwardBatch(
            slots=[r.slot for r in decoding] + [r.slot for r, _ in chunked],  # type: ignore[misc]
            start_positions=[r.num_cached for r in decoding] + [r.num_cached for r, _ in chunked],
            token_ids=[feed + p.token_ids for feed, p in zip(feeds, proposals)] + chunk_feeds,
            # (and a row for each pending forced token before the proposals, for its logprobs)
            num_logits=[n + len(r.pending_forced) for n, r in zip(counts, decoding)] + chunk_logits,
            row_invariant=row_invariant,
            stepwise=decode_rows_stepwise(
                [True] * len(decoding) + [False] * len(chunked), row_invariant
            ),
        )
        # Verification rows first, then one row per completed prompt: one mask row each position.
        pending_masks = engine.structured.start_masks(
            decoding + sampled, [p.token_ids for p in proposals] + [[]] * len(sampled)
        )
        # Logits (sum(counts) + len(sampled), V), or the target's token at each of those positions
        # when every row is greedy on the raw logits (the kernels pick them).
        try:
            maybe_logits, choices = engine.forward_pass(
                forward,
                [*decoding, *sampled],
                [*decoding, *(r for r, _ in chunked)],
                [0] * len(decoding) + chunk_extra,
            )
        except BaseException:
            engine.structured.settle(pending_masks)
            _restore(drawn, states)
            raise
        for (request, _), feed in zip(chunked, chunk_feeds):
            request.num_cached += len(feed)
        num_verified = sum(counts)
        if choices is not None:
            out_rows, accepted = accept_greedy(proposals, choices[:num_verified])
            results = self._accept(engine, decoding, proposals, feeds, out_rows, accepted, None)
            for request, token in zip(sampled, choices[num_verified:]):
                results.append((request, engine.update_request(request, token, None)))
            return results
        logits = maybe_logits
        assert logits is not None
        engine.mask_padding(logits)
        logits, appended = engine.take_pending_forced(decoding, logits, counts, pending_masks)
        verified, after = logits[:num_verified], logits[num_verified:]
        if appended:  # their pending tokens finished (or failed) some: those verify nothing
            results, going = self._unverified(decoding, proposals, feeds, appended)
            verified = verified[_rows_of(going, counts)]
            decoding, rows, proposals, tested, feeds = (
                [items[b] for b in going] for items in (decoding, rows, proposals, tested, feeds)
            )
        else:
            results = []
        if decoding:
            for request, result in self._verify(
                engine, decoding, rows, proposals, tested, verified, feeds
            ):
                results.append((request, joined(appended.get(request), result)))
        if sampled:
            results += engine.sample_and_update(sampled, after)
        return results

    def _unverified(
        self,
        requests: list[Request],
        proposals: list[Proposal],
        feeds: list[list[int]],
        appended: dict[Request, StreamChunk | BaseException],
    ) -> tuple[list[StepResult], list[int]]:
        """The results of the requests that their pending forced tokens finished (their
        proposals dropped), and the indices of the others."""
        results: list[StepResult] = []
        going = []
        for b, request in enumerate(requests):
            if not request.is_finished:
                going.append(b)
                continue
            request.num_cached = min(request.num_cached + len(feeds[b]), request.num_tokens)
            self.proposer.rollback(request.slot, len(proposals[b]))  # type: ignore[arg-type]
            results.append((request, appended[request]))
        return results, going

    def _verify(
        self,
        engine: LLMEngine,
        requests: list[Request],
        rows: list[DraftRow],
        proposals: list[Proposal],
        tested: list[Proposal],
        logits: torch.Tensor,
        feeds: list[list[int]],
    ) -> list[StepResult]:
        """Accept each request's proposals against the target's ``logits`` (a row per position
        of the fed ``proposals``; ``tested`` may add an EOS after them, see
        ``_valid_for_grammar``), roll the rejected ones back, and append the accepted run and the
        next token."""
        counts = verification_counts(proposals)
        # A row with nothing to test whose grammar forces the next token takes it without a draw,
        # as a plain step does: a seeded request paused by its schedule takes a plain step when
        # alone and a row here beside drafting requests, and its tokens must not depend on that.
        forced = [
            engine.structured.forced_next(r) if not t.token_ids else None
            for r, t in zip(requests, tested)
        ]
        if all(r.params.is_greedy for r in requests):
            out_rows, accepted = greedy_verification(logits, rows, proposals, engine.eos_token_ids)
        else:
            probs = target_probs(logits, rows, proposals, engine.eos_token_ids)
            if any(len(t) > len(p) for t, p in zip(tested, proposals)):
                probs = _after_tested_eos(probs, proposals, tested)
            batch = batch_proposals(tested, logits.shape[1], logits.device)
            out, num_accepted = rejection_sample(
                probs,
                batch.token_ids,
                batch.num_draft,
                batch.probs,
                [r.params.is_greedy or f is not None for r, f in zip(requests, forced)],
                [r.generator for r in requests],
            )
            out_rows, accepted = out.tolist(), num_accepted.tolist()
            for b, proposal in enumerate(proposals):
                if accepted[b] > len(proposal):  # the tested EOS was kept: it is the next token
                    out_rows[b], accepted[b] = tested[b].token_ids, len(proposal)
        for b, token in enumerate(forced):
            if token is not None:
                out_rows[b], accepted[b] = [token], 0
        offsets = _row_offsets(counts)
        logprobs = self._logprobs(engine, requests, logits, out_rows, accepted, offsets)
        return self._accept(
            engine, requests, proposals, feeds, out_rows, accepted, logprobs, tested
        )

    def _accept(
        self,
        engine: LLMEngine,
        requests: list[Request],
        proposals: list[Proposal],
        feeds: list[list[int]],
        out_rows: list[list[int]],
        accepted: list[int],
        logprobs: list[list[TokenLogprob]] | None,
        tested: list[Proposal] | None = None,
    ) -> list[StepResult]:
        """Keep each request's ``accepted[b]`` proposals and the token after them (``out_rows[b]``):
        the cache keeps their keys, the proposer forgets the rest, the tokens are appended. A
        tested EOS after the fed proposals (``tested``), when kept, is that token, and counts in
        the stats as an accepted proposal."""
        results: list[StepResult] = []
        for b, request in enumerate(requests):
            proposal, n = proposals[b], accepted[b]
            whole = tested[b] if tested is not None else proposal
            kept_eos = len(whole) > n == len(proposal) and out_rows[b][n] == whole.token_ids[-1]
            before = len(request.output_token_ids)
            result, cut = self._emit(
                engine, request, out_rows[b][: n + 1], logprobs[b] if logprobs else None
            )
            # Accepted proposals a stop (string, token, max_tokens) dropped are not counted, nor
            # those a thinking budget cut off (proposed or accepted: they were not judged).
            emitted = len(request.output_token_ids) - before
            proposed = len(whole) if cut is None else cut
            self._record(request, proposed, min(n + kept_eos, emitted))
            kept = n
            if cut is not None:  # a thinking budget cut the run: its last token is fed next
                kept = cut - 1
            # The cache now holds valid keys for the fed tokens and the kept accepted proposals.
            request.num_cached += len(feeds[b]) + kept
            self.proposer.rollback(request.slot, len(proposal) - kept)  # type: ignore[arg-type]
            results.append((request, result))
        return results

    @staticmethod
    def _emit(
        engine: LLMEngine, request: Request, tokens: list[int], logprobs: list[TokenLogprob] | None
    ) -> tuple[StreamChunk | BaseException, int | None]:
        """Append the accepted run and the bonus token, stopping where the request finishes or a
        thinking budget begins to force its closing tag before the run's end: the result, and
        where the budget cut the run (the tokens it kept; None: not cut), the rest dropped."""
        chunk: StreamChunk | None = None
        for j, token in enumerate(tokens):
            logprob = logprobs[j] if logprobs else None
            last = j == len(tokens) - 1
            result = engine.update_request(request, token, logprob, allow_forced=last)
            if isinstance(result, BaseException):
                return result, None
            if chunk is None:
                chunk = result
            else:
                chunk.extend(result)
            if request.is_finished:
                break
            if request.thinking_forced_token is not None and not last:
                assert chunk is not None
                return chunk, j + 1
        assert chunk is not None
        return chunk, None

    @staticmethod
    def _logprobs(
        engine: LLMEngine,
        requests: list[Request],
        logits: torch.Tensor,
        out_rows: list[list[int]],
        accepted: list[int],
        offsets: list[int],
    ) -> list[list[TokenLogprob]] | None:
        wanted = [r.params.logprobs for r in requests]
        if all(w is None for w in wanted):
            return None
        index, tokens = [], []
        for b, n in enumerate(accepted):
            for j in range(n + 1):
                index.append(offsets[b] + j)
                tokens.append(out_rows[b][j])
        flat = engine.token_logprobs(
            [requests[b] for b, n in enumerate(accepted) for _ in range(n + 1)],
            logits.index_select(0, torch.tensor(index, dtype=torch.int64, device=logits.device)),
            torch.tensor(tokens, dtype=torch.int64, device=logits.device),
        )
        per_row, start = [], 0
        for n in accepted:
            per_row.append(flat[start : start + n + 1])
            start += n + 1
        return per_row


def _after_tested_eos(
    probs: torch.Tensor, fed: list[Proposal], tested: list[Proposal]
) -> torch.Tensor:
    """``probs`` (B, K+1, V) of the fed proposals widened for the tested ones: a row whose tested
    proposals end with an unfed EOS tests it at its bonus position, and gets a copy of that
    position after it (the bonus draw after an EOS kept, whose token is dropped)."""
    width = max(len(t) for t in tested) + 1
    out = probs.new_zeros((probs.shape[0], width, probs.shape[2]))
    out[:, : probs.shape[1]] = probs
    for b, (f, t) in enumerate(zip(fed, tested)):
        if len(t) > len(f):
            out[b, len(f) + 1] = probs[b, len(f)]
    return out


def _row_offsets(counts: list[int]) -> list[int]:
    """The first logits row of each request, request b having ``counts[b]`` rows."""
    return list(accumulate(counts, initial=0))[:-1]


def _rows_of(going: list[int], counts: list[int]) -> torch.Tensor:
    """The logits rows (``counts[b]`` per request b) of the requests ``going``."""
    offsets = _row_offsets(counts)
    rows = [offsets[b] + j for b in going for j in range(counts[b])]
    return torch.tensor(rows, dtype=torch.int64)


def _restore(requests: list[Request], states: list[torch.Tensor]) -> None:
    """Put the requests' draft generators back to ``states`` (taken before a failed pass)."""
    for request, state in zip(requests, states, strict=True):
        request.draft_generator.set_state(state)  # type: ignore[union-attr]
