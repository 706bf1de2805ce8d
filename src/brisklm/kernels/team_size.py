"""How many threads the native forward pass runs: torch's thread count, or fewer while other work
takes the machine's cores.

The pass's threads meet at about nine barriers a layer. Where other processes (or the program's
own threads) keep the cores busy, the OS now and then preempts one of them for a time slice, and
its teammates wait at the next barrier until it runs again, then again at the barrier after. The
bundled model's one-token pass, 0.44 ms on an idle 2-vCPU machine, took up to 19 ms beside one
busy process (a sixth of its passes slept most of their time), and chat calls with tools ran 3-4x
slower with two threads than with one (docs/benchmarks.md).

The kernels add up the nanoseconds their threads sleep at barriers waiting for a late teammate
(``brisk_barrier_sleep_ns``). On an idle machine that is a few percent of the passes' time at
most (a thread sleeps only after spinning ~50 us); where a teammate is preempted it is most of
it. When it reaches ``BUSY_SHARE`` of the passes' time over ``WINDOW_S`` seconds of passes, the
team runs one thread fewer for a pause, then tries one more again: a retry that finds the cores
still busy doubles the next pause (from ``MIN_PAUSE_S`` up to ``MAX_PAUSE_S``), a retry that runs
clear ends the backoff. A pass's bits do not depend on its team's size
(tests/models/test_native_forward.py), so outputs stay the same; only speed changes.

Only the native pass's team changes. Torch's ops keep torch's thread count, because their bits
can depend on it: ``F.silu`` over a row split between threads at a point that is not a multiple of
its vector width takes the split's ends through scalar code, and a sum over one row of more than
32,768 elements (a 128k vocabulary's softmax normaliser) is split into per-thread parts. A count
that followed the machine's load would make a seeded request's tokens vary from run to run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

BUSY_SHARE = 0.25
WINDOW_S = 0.1
MIN_PAUSE_S = 0.5
MAX_PAUSE_S = 32.0


class TeamSize:
    """The team size of each native pass (``size``), from what the passes before it saw
    (``observe``). Shared by every pass of the process: the cores are the machine's. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.cap: int | None = None  # at most this many threads; None: torch's count
        self._retry_at = 0.0  # when a capped team tries one thread more
        self._pause = MIN_PAUSE_S  # how long the cap holds after the next busy window
        # When the thread the window being measured runs was added by a retry; None: no retry.
        self._retried_at: float | None = None
        self._slept_ns = 0
        self._wall_ns = 0
        self._told = False

    def reset(self) -> None:
        """Forget what the passes so far saw: no cap, no backoff (tests)."""
        with self._lock:
            self.cap = None
            self._retried_at = None
            self._pause = MIN_PAUSE_S
            self._slept_ns = self._wall_ns = 0

    def size(self, wanted: int) -> int:
        """The team for the next pass, where torch's thread count is ``wanted``."""
        with self._lock:
            now = self._clock()
            if self.cap is not None and self._retried_at is None and now >= self._retry_at:
                self.cap += 1
                self._retried_at = now
                self._slept_ns = self._wall_ns = 0
                logger.debug("native pass: trying %d threads again", self.cap)
            if self.cap is not None and self.cap >= wanted:
                self.cap = None  # a retry reached torch's count (or it was lowered)
            return wanted if self.cap is None else self.cap

    def observe(self, team: int, slept_ns: int, wall_ns: int) -> None:
        """A pass of ``team`` threads took ``wall_ns`` nanoseconds, in which its threads slept
        ``slept_ns`` at barriers (summed over the threads; a window is busy when the threads
        but one slept ``BUSY_SHARE`` of it each)."""
        if team < 2:
            return
        with self._lock:
            # The team's other threads wait for a late one together: per waiting thread.
            self._slept_ns += slept_ns // (team - 1)
            self._wall_ns += wall_ns
            if self._wall_ns < WINDOW_S * 1e9:
                return
            share = self._slept_ns / self._wall_ns
            self._slept_ns = self._wall_ns = 0
            if share >= BUSY_SHARE:
                # A retry found the cores still busy: a longer pause. (A retry whose window filled
                # only long after, the engine idle between, says nothing of now.)
                now = self._clock()
                recent = self._retried_at is not None and now - self._retried_at <= MAX_PAUSE_S
                self._pause = min(2 * self._pause, MAX_PAUSE_S) if recent else MIN_PAUSE_S
                self.cap = team - 1
                self._retry_at = now + self._pause
                self._retried_at = None
                log = logger.debug if self._told else logger.info
                self._told = True
                log(
                    "native pass: its threads slept %.0f%% of the last passes' time waiting for "
                    "preempted teammates (other work on the CPUs): one thread fewer (%d of %d) "
                    "for %.1f s",
                    100 * share,
                    self.cap,
                    team,
                    self._pause,
                )
            elif self._retried_at is not None:  # the added thread ran clear: keep it, try the next
                self._retried_at = None
                self._pause = MIN_PAUSE_S
                self._retry_at = self._clock()


# The one every native pass of the process consults.
TEAM = TeamSize()
