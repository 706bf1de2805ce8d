"""The draft length schedule: how many tokens a request proposes in its next speculative step."""

from __future__ import annotations

import math

import pytest

from brisklm.speculative import SCHEDULES, DraftLength, DraftLengthSchedule, StepCosts
from brisklm.speculative.draft_length import AVERAGE_WEIGHT, MAX_PAUSE, MIN_PAUSE


def test_fixed_always_proposes_the_maximum():
    schedule = DraftLengthSchedule(5, "fixed")
    assert schedule.initial() == 5
    for proposed, accepted in [(5, 0), (5, 5), (3, 1), (0, 0)]:
        assert schedule.next(5, proposed, accepted) == 5


def test_adaptive_grows_on_full_acceptance_and_shrinks_when_most_are_rejected():
    schedule = DraftLengthSchedule(6, "adaptive")
    assert schedule.initial() == 6
    assert schedule.next(4, 4, 4) == 5
    assert schedule.next(6, 6, 6) == 6  # capped at the maximum
    assert schedule.next(6, 6, 2) == 5  # kept under half
    assert schedule.next(5, 5, 0) == 4
    assert schedule.next(6, 6, 3) == 6  # kept half: unchanged
    assert schedule.next(6, 6, 5) == 6
    assert schedule.next(1, 1, 0) == 1  # never below one token
    # A proposal cut short (max_tokens is near) that was fully accepted still counts as full
    # acceptance.
    assert schedule.next(3, 2, 2) == 4


def test_adaptive_ignores_steps_that_proposed_nothing():
    schedule = DraftLengthSchedule(4, "adaptive")
    assert schedule.next(3, 0, 0) == 3


def test_adaptive_walks_down_then_back_up():
    schedule = DraftLengthSchedule(4, "adaptive")
    length = schedule.initial()
    seen = []
    for accepted_all in [False, False, False, False, True, True]:
        length = schedule.next(length, length, length if accepted_all else 0)
        seen.append(length)
    assert seen == [3, 2, 1, 1, 2, 3]


def _run(schedule: DraftLengthSchedule, state: DraftLength, accepts: list[bool]) -> list[int]:
    """Proposal sizes over steps where each proposal is accepted whole or rejected whole."""
    sizes = []
    for accept in accepts:
        size = schedule.proposal_size(state)
        sizes.append(size)
        schedule.update(state, size, size if accept else 0)
    return sizes


def test_adaptive_pauses_after_a_rejected_single_token_then_backs_off():
    schedule = DraftLengthSchedule(3, "adaptive")
    state = schedule.start()
    assert (state.tokens, state.paused) == (3, 0)
    sizes = _run(schedule, state, [False] * (3 + MIN_PAUSE + 1 + 2 * MIN_PAUSE + 1))
    # 3, 2, 1 rejected: a pause of MIN_PAUSE plain steps, one token again, rejected: twice as long.
    assert sizes == [3, 2, 1] + [0] * MIN_PAUSE + [1] + [0] * (2 * MIN_PAUSE) + [1]
    assert state.pause == 4 * MIN_PAUSE and state.paused == 4 * MIN_PAUSE


def test_adaptive_pause_is_capped_and_an_accepted_proposal_ends_the_backoff():
    schedule = DraftLengthSchedule(2, "adaptive")
    state = DraftLength(tokens=1, pause=MAX_PAUSE)
    schedule.update(state, 1, 0)
    assert state.paused == MAX_PAUSE  # doubling stops at the cap
    sizes = _run(schedule, state, [False] * MAX_PAUSE + [True, True, False])
    assert sizes == [0] * MAX_PAUSE + [1, 2, 2]
    assert state.pause == 0 and state.paused == 0  # accepted: the next failure pauses MIN_PAUSE
    assert state.tokens == 1  # 2 rejected: shorter, but only a one-token failure pauses
    schedule.update(state, 1, 0)
    assert state.paused == MIN_PAUSE


def test_a_proposal_cut_to_one_token_does_not_pause_a_longer_schedule():
    schedule = DraftLengthSchedule(4, "adaptive")
    state = DraftLength(tokens=3)
    schedule.update(state, 1, 0)  # max_tokens left room for one token only
    assert (state.tokens, state.paused) == (2, 0)


def _run_timed(
    schedule: DraftLengthSchedule, state: DraftLength, kept: list[int], cost: float
) -> list[int]:
    """Proposal sizes over steps that keep ``kept[i]`` tokens of a proposal (at most all)."""
    sizes = []
    for keep in kept:
        size = schedule.proposal_size(state)
        sizes.append(size)
        schedule.update(state, size, min(size, keep), cost)
    return sizes


def test_timed_rule_pauses_a_draft_that_is_often_right_but_does_not_pay():
    """Two of three tokens kept each step: never a rejected one-token proposal, so the counted
    rule never pauses; at 3.5 plain steps a speculative step, 3 tokens a step do not pay."""
    schedule = DraftLengthSchedule(3, "adaptive")
    counted = _run(schedule, schedule.start(), [True, True] * 4)
    assert 0 not in counted
    state = schedule.start()
    sizes = _run_timed(schedule, state, [2] * (1 + MIN_PAUSE + 1), cost=3.5)
    # A pause, then one token (kept: 2 tokens, still a loss): a pause twice as long.
    assert sizes == [3] + [0] * MIN_PAUSE + [1]
    assert state.paused == 2 * MIN_PAUSE == state.pause
    assert state.profit == 2 - 3.5  # the step after a pause started the average afresh
    assert state.tokens == 1


def test_timed_rule_follows_the_moving_average_and_a_paying_step_ends_the_backoff():
    schedule = DraftLengthSchedule(4, "adaptive")
    state = DraftLength(tokens=4, profit=-1.0)
    schedule.update(state, 4, 3, cost=2.0)  # 4 tokens for 2 plain steps: +2
    assert state.profit == pytest.approx(-1.0 + AVERAGE_WEIGHT * 3.0)
    assert state.profit < 0 and state.paused == MIN_PAUSE and state.tokens == 1
    for _ in range(MIN_PAUSE):
        schedule.update(state, 0, 0, cost=2.0)
    schedule.update(state, 1, 1, cost=1.5)  # the probe: 2 tokens for 1.5 plain steps
    assert state.profit == 0.5 and (state.pause, state.paused) == (0, 0)
    assert state.tokens == 2  # kept whole: one longer
    schedule.update(state, 2, 0, cost=2.0)  # 1 token for 2: a loss the average absorbs
    assert state.profit == pytest.approx(0.5 + AVERAGE_WEIGHT * -1.5)
    assert state.profit >= 0 and state.paused == 0
    # A long pause's backoff is capped.
    state = DraftLength(tokens=2, pause=MAX_PAUSE, profit=-1.0)
    schedule.update(state, 2, 0, cost=100.0)
    assert state.paused == MAX_PAUSE


def test_timed_rule_before_a_plain_step_was_timed_pauses_where_a_proposal_failed():
    schedule = DraftLengthSchedule(3, "adaptive")
    state = schedule.start()
    schedule.update(state, 3, 3, cost=math.inf)
    assert state.paused == 0 and state.profit is None
    schedule.update(state, 3, 2, cost=math.inf)
    assert state.paused == MIN_PAUSE and state.tokens == 1
    for _ in range(MIN_PAUSE):
        schedule.update(state, 0, 0, cost=math.inf)
    schedule.update(state, 1, 1, cost=math.inf)  # kept whole: the backoff ends
    assert (state.pause, state.paused, state.tokens) == (0, 0, 2)


def test_timed_rule_leaves_fixed_schedules_and_plain_steps_alone():
    fixed = DraftLengthSchedule(2, "fixed")
    state = fixed.start()
    assert _run_timed(fixed, state, [0] * 6, cost=50.0) == [2] * 6
    assert state.profit is None
    adaptive = DraftLengthSchedule(2, "adaptive")
    state = DraftLength(tokens=2, paused=3, profit=-1.0)
    adaptive.update(state, 0, 0, cost=50.0)  # a paused step counts down, nothing more
    assert (state.paused, state.profit) == (2, -1.0)


def test_step_costs():
    costs = StepCosts()
    assert costs.cost(0.004) == math.inf  # no plain step timed yet
    costs.add_plain(1.0)  # the first (cold) plain step is dropped
    assert costs.plain is None
    costs.add_plain(0.002)
    costs.add_plain(0.001)  # a moving average, not the last step
    assert costs.plain == pytest.approx(0.002 - AVERAGE_WEIGHT * 0.001)
    assert costs.cost(0.007) == pytest.approx(0.007 / costs.plain)


def test_fixed_never_pauses():
    schedule = DraftLengthSchedule(2, "fixed")
    state = schedule.start()
    assert _run(schedule, state, [False] * 10) == [2] * 10


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
def test_maximum_must_be_a_positive_int(schedule, value):
    with pytest.raises(
        ValueError, match=f"num_speculative_tokens must be an int >= 1, got {value!r}"
    ):
        DraftLengthSchedule(value, schedule)


def test_unknown_schedule_names_the_choices():
    with pytest.raises(ValueError, match="'greedy'.*adaptive, fixed"):
        DraftLengthSchedule(4, "greedy")


def test_every_entry_point_shares_the_default_maximum():
    import inspect

    from brisklm import LLM
    from brisklm.cli import build_parser
    from brisklm.llm import speculative_tokens
    from brisklm.speculative import DEFAULT_NUM_SPECULATIVE_TOKENS, NgramProposer

    # None unless given (it needs a draft), meaning the default, as the CLI's flag below.
    signature = inspect.signature(LLM.from_pretrained)
    assert signature.parameters["num_speculative_tokens"].default is None
    assert speculative_tokens(None) == DEFAULT_NUM_SPECULATIVE_TOKENS
    # The CLI's flag stays None unless given (it needs --draft) and means the same default.
    assert build_parser().parse_args(["generate", "hi"]).num_speculative_tokens is None
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    (flag,) = [a for a in generate._actions if a.dest == "num_speculative_tokens"]
    assert f"(default {DEFAULT_NUM_SPECULATIVE_TOKENS})" in flag.help
    assert NgramProposer().num_speculative_tokens == DEFAULT_NUM_SPECULATIVE_TOKENS
