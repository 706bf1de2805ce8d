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

The draft length changes only what is proposed, never what is emitted: it depends on past steps
only, so greedy output stays the target's own and sampled output the target's distribution.
"""

from __future__ import annotations

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


@dataclass
class DraftLength:
    """One request's place in its schedule: ``tokens`` proposed per step while proposing,
    ``paused`` plain steps left before it proposes again, ``pause`` the length of the last pause
    (0: none since a proposal was last accepted)."""

    tokens: int
    paused: int = 0
    pause: int = 0


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

    def update(self, state: DraftLength, num_proposed: int, num_accepted: int) -> None:
        """Advance ``state`` past a step that proposed ``num_proposed`` tokens (0: a plain step)
        and kept ``num_accepted``."""
        if state.paused:
            state.paused -= 1
            return
        before = state.tokens
        state.tokens = self.next(before, num_proposed, num_accepted)
        if self.schedule != "adaptive" or num_proposed == 0:
            return
        if num_accepted:
            state.pause = 0
        elif before == 1:
            state.pause = MIN_PAUSE if state.pause == 0 else min(2 * state.pause, MAX_PAUSE)
            state.paused = state.pause

    def next(self, current: int, num_proposed: int, num_accepted: int) -> int:
        """The draft length after a step that proposed ``num_proposed`` tokens and kept ``num_accepted``."""
        if self.schedule == "fixed" or num_proposed == 0:  # nothing proposed: nothing learned
            return current
        if num_accepted >= num_proposed:
            return min(self.max_tokens, current + 1)
        if 2 * num_accepted < num_proposed:
            return max(1, current - 1)
        return current
