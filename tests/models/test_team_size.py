"""The native pass's team size: one thread fewer while its threads sleep at barriers waiting for
preempted teammates, tried again after a pause that doubles while the cores stay busy."""

from __future__ import annotations

from brisklm.kernels.team_size import BUSY_SHARE, MAX_PAUSE_S, MIN_PAUSE_S, WINDOW_S, TeamSize

WINDOW_NS = int(WINDOW_S * 1e9)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def busy(team: TeamSize, threads: int) -> None:
    """A window of passes whose threads (but the late one) slept at barriers for most of it."""
    team.observe(threads, int(0.8 * WINDOW_NS) * (threads - 1), WINDOW_NS)


def clear(team: TeamSize, threads: int) -> None:
    team.observe(threads, int(0.01 * WINDOW_NS) * (threads - 1), WINDOW_NS)


def test_only_a_whole_window_of_passes_mostly_asleep_takes_a_thread_away() -> None:
    team = TeamSize(Clock())
    for _ in range(20):
        assert team.size(2) == 2
        clear(team, 2)
    team.observe(2, int((BUSY_SHARE - 0.01) * WINDOW_NS), WINDOW_NS)  # just under the share
    assert team.size(2) == 2 and team.cap is None
    team.observe(2, WINDOW_NS // 2, WINDOW_NS // 2)  # all asleep, but half a window: undecided
    assert team.size(2) == 2
    team.observe(1, 10 * WINDOW_NS, WINDOW_NS)  # one thread waits for nobody: not counted
    team.observe(2, WINDOW_NS // 2, WINDOW_NS // 2)  # the window: all asleep
    assert team.size(2) == 1


def test_busy_cores_take_a_thread_away_and_the_retries_back_off() -> None:
    clock = Clock()
    team = TeamSize(clock)
    busy(team, 2)
    assert team.size(2) == 1
    pauses = [MIN_PAUSE_S * 2**i for i in range(7)]
    assert pauses[-1] == MAX_PAUSE_S
    for pause in [*pauses, MAX_PAUSE_S]:  # each retry finds the cores busy: the pause doubles
        clock.now += pause - 0.01
        assert team.size(2) == 1
        clock.now += 0.01
        assert team.size(2) == 2  # the retry
        busy(team, 2)
        assert team.size(2) == 1
    clock.now += MAX_PAUSE_S
    assert team.size(2) == 2
    clear(team, 2)  # the retry ran clear: no cap, and the next busy window pauses briefly
    assert team.size(2) == 2 and team.cap is None
    busy(team, 2)
    clock.now += MIN_PAUSE_S
    assert team.size(2) == 2


def test_many_threads_step_down_and_up_one_at_a_time() -> None:
    clock = Clock()
    team = TeamSize(clock)
    for expected in (7, 6, 5):
        busy(team, team.size(8))
        assert team.size(8) == expected
    clock.now += MIN_PAUSE_S  # after the pause: one more, and each clear window one more again
    for expected in (6, 7, 8):
        assert team.size(8) == expected
        clear(team, expected)
    assert team.size(8) == 8 and team.cap is None
    busy(team, 8)
    assert team.size(4) == 4  # a count lowered under the cap is taken as it is


def test_the_share_is_per_waiting_thread() -> None:
    # Eight threads, one late: the seven others sleep together, 7 x 20% of the window in all,
    # which is 20% each, under the share; 7 x 30% is over it.
    team = TeamSize(Clock())
    team.observe(8, int(7 * 0.2 * WINDOW_NS), WINDOW_NS)
    assert team.size(8) == 8
    team.observe(8, int(7 * 0.3 * WINDOW_NS), WINDOW_NS)
    assert team.size(8) == 7


def test_reset_forgets_the_cap() -> None:
    team = TeamSize(Clock())
    busy(team, 2)
    assert team.size(2) == 1
    team.reset()
    assert team.size(2) == 2 and team.cap is None


def test_a_retry_whose_window_filled_long_after_does_not_lengthen_the_pause() -> None:
    clock = Clock()
    team = TeamSize(clock)
    busy(team, 2)
    clock.now += MIN_PAUSE_S
    assert team.size(2) == 2  # a retry; then the engine idles for an hour
    clock.now += 3600
    busy(team, 2)
    clock.now += MIN_PAUSE_S
    assert team.size(2) == 2  # the pause was the shortest again
