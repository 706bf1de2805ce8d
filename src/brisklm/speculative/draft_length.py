"""How many tokens to propose for a request in its next speculative step.

A proposal of k tokens costs k draft steps plus a target pass over k + 1 positions, and pays off
only as far as the target accepts it. On requests the draft predicts well every proposal is
accepted and long proposals win; on requests it predicts badly (open-ended text a small draft
cannot follow) most proposals are rejected after a token or two, and a fixed k = 4-5 made decoding
slower than the target alone (docs/benchmarks.md). The adaptive schedule follows each request's
acceptance: one token longer after a step whose proposals were all accepted, one shorter after a
step that kept fewer than half of them, unchanged otherwise, between 1 and the configured maximum.
(transformers' "heuristic" schedule, +2 on full acceptance and -1 on any rejection, shrank the
proposals of the bundled pair's task prompts too far: 2.68 accepted tokens per step at k = 4
against 2.89 fixed; this one keeps 2.78.)

Even one proposed token costs a draft step and a wider target pass: with the bundled pair on CPU
a plain step takes ~0.41 ms and a one-token speculative step an estimated ~0.75 ms (a two-token
target pass, a draft pass and the Python around them), so it pays only when the token is accepted
more than ~80% of the time. So when a one-token proposal is rejected, the
adaptive schedule pauses: the request decodes plainly (no draft pass, no proposal) for
``MIN_PAUSE`` steps, then proposes one token again; each rejection right after a pause doubles the
next pause, up to ``MAX_PAUSE`` steps, and an accepted proposal ends the backoff.

That rule misses a draft that is often right but not often enough: on open-ended chat the bundled
draft's proposals kept about one token a step on the Zen 4, each step of five proposals costing ~4
plain steps, so decoding ran at 0.80x the target alone though hardly a step paused. So where the
engine has timed a plain step (``StepCosts``), a request's schedule weighs what its proposals buy:
each proposing step's profit is the tokens it emitted (the accepted ones and the target's own after
them) less the plain steps its time would have run (each step timed from its start to the next's,
the engine's work between them included; the first step after a pause pays for the draft catching up
on the paused tokens, so a draft that keeps failing pauses longer), and while the moving average of
that profit (``DraftLength.profit``) is negative the request pauses, with the same backoff, then
proposes one token (the cheapest probe), one more after each step whose proposal was kept whole. The
first step after a pause starts the average afresh, and one that pays ends the backoff. Until the
engine has timed a plain step, a step with a rejected proposal pauses (so one is timed) and one kept
whole ends the backoff. Paused requests decode several steps a native call where the target alone
would (``LLMEngine.decode_steps``), so a pause costs what decoding without a draft costs. On the
bundled pair (Zen 4, six alternating rounds of ``bench/speculative.py --ks 5 --draft-lengths
adaptive``, medians) chat went from 0.84x to 0.89x the target alone; the tasks, which keep most
proposals, stayed level (1.02x, 1.00x), and so did n-gram lookup's bursts of copied text (1.07-1.08x
before, 1.18-1.21x after, in a noisy stretch). Versions that timed only the pass, or charged a probe
the time of longer proposals, paused the tasks and n-gram lookup too long or gained nothing on chat
(docs/benchmarks.md).

The draft length changes only what is proposed, never what is emitted: it depends on past steps
only, so greedy output stays the target's own and sampled output the target's distribution. The
timed rule makes proposals depend on how fast past steps ran, so a seeded sampled request, whose
tokens follow from its proposals, keeps the rule that counts tokens alone and repeats exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("adaptive", "fixed")

# Most tokens proposed per step unless told otherwise. With the bundled pair (bench/speculative.py,
# docs/benchmarks.md) 5 beat 4 on the requests the models were trained for (1.58-1.66x against
# 1.41-1.43x, adaptive) for a few percent on open-ended chat (0.88-0.89x against 0.91-0.92x),
# and n-gram lookup gained too (1.42-1.48x against 1.26-1.35x at 3).
DEFAULT_NUM_SPECULATIVE_TOKENS = 5

# Plain steps after a rejected one-token proposal: the first pause, and the longest the backoff
# doubles to.
MIN_PAUSE = 4
MAX_PAUSE = 64

# Weight of the latest step in the moving averages: of a request's profit per proposing step, and
# of a plain step's seconds (StepCosts).
AVERAGE_WEIGHT = 0.25


@dataclass
class DraftLength:
    """One request's place in its schedule: ``tokens`` proposed per step while proposing,
    ``paused`` plain steps left before it proposes again, ``pause`` the length of the last pause
    (0: none since a proposal last paid), ``profit`` the moving average of its proposing steps'
    tokens emitted less the plain steps each cost (the timed rule; None before its first).
    ``paused`` is infinite for a request the proposer failed on: it decodes plainly to its end
    (``without_draft``)."""

    tokens: int
    paused: float = 0
    pause: int = 0
    profit: float | None = None

    @property
    def without_draft(self) -> bool:
        """Whether the request decodes plainly to its end (the proposer failed on it)."""
        return self.paused == math.inf


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else mean + AVERAGE_WEIGHT * (value - mean)


class StepCosts:
    """The moving average of how long a plain decode step takes an engine (a call of several
    steps: its mean a step), and so what a speculative step of a measured time costs in plain
    steps. The time of a step runs from its start to the next step's, so that the engine's own
    work between steps counts as a plain call of several steps shares it out. Mixed batch sizes
    share it: on the memory-bound passes of small batches both kinds of step grow alike."""

    def __init__(self) -> None:
        self.plain: float | None = None
        # Whether the first plain step, which runs cold (buffers allocated, caches cold), was
        # dropped.
        self._warm = False

    def add_plain(self, seconds: float) -> None:
        """A plain step of ``seconds`` a token (a call of several steps: its mean)."""
        if self._warm:
            self.plain = _average(self.plain, seconds)
        self._warm = True

    def cost(self, seconds: float) -> float:
        """Plain steps a speculative step of ``seconds`` cost: infinity before a plain step was
        timed (a step that does not keep its whole proposal then pauses, timing one)."""
        if self.plain is None:
            return math.inf
        return seconds / max(self.plain, 1e-9)


class DraftLengthSchedule:
    """Per-request draft lengths: ``fixed`` always proposes the maximum, ``adaptive`` follows acceptance."""

    def __init__(self, max_tokens: int, schedule: str = "adaptive") -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an int >= 1, got {max_tokens!r}")
        if schedule not in SCHEDULES:
            raise ValueError(
                f"unknown draft length schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}"
            )
        self.max_tokens = max_tokens
        self.schedule = schedule

    def initial(self) -> int:
        """A new request's first draft length: the maximum (the first step's acceptance decides)."""
        return self.max_tokens

    def start(self) -> DraftLength:
        """A new request's state: proposing the maximum."""
        return DraftLength(self.initial())

    @staticmethod
    def proposal_size(state: DraftLength) -> int:
        """Tokens to propose this step: none while paused."""
        return 0 if state.paused else state.tokens

    def update(
        self,
        state: DraftLength,
        num_proposed: int,
        num_accepted: int,
        cost: float | None = None,
    ) -> None:
        """Advance ``state`` past a step that proposed ``num_proposed`` tokens (0: a plain step)
        and kept ``num_accepted``. ``cost``: the plain steps that step cost (``StepCosts.cost``;
        infinity: not known yet), or None to decide on the tokens alone."""
        if state.paused:
            state.paused -= 1
            return
        before = state.tokens
        state.tokens = self.next(before, num_proposed, num_accepted)
        if self.schedule != "adaptive" or num_proposed == 0:
            return
        if cost is None:
            paid, pauses = num_accepted > 0, num_accepted == 0 and before == 1
        elif math.isinf(cost):  # no plain step timed yet: time one where a proposal failed
            paid = num_accepted == num_proposed
            pauses = not paid
        else:
            profit = num_accepted + 1 - cost
            # The first step after a pause starts afresh: the steps before it are stale.
            state.profit = profit if state.pause else _average(state.profit, profit)
            paid = state.profit >= 0
            pauses = not paid
        if paid:
            state.pause = 0
        elif pauses:
            state.pause = MIN_PAUSE if state.pause == 0 else min(2 * state.pause, MAX_PAUSE)
            state.paused = state.pause
            if cost is not None:  # the cheapest probe: one token, longer as it is kept
                state.tokens = 1

    def next(self, current: int, num_proposed: int, num_accepted: int) -> int:
        """The draft length after a step that proposed ``num_proposed`` tokens and kept ``num_accepted``."""
        if self.schedule == "fixed" or num_proposed == 0:  # nothing proposed: nothing learned
            return current
        if num_accepted >= num_proposed:
            return min(self.max_tokens, current + 1)
        if 2 * num_accepted < num_proposed:
            return max(1, current - 1)
        return current
