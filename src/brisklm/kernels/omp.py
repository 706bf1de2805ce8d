"""The calling thread's OpenMP thread count for a stretch of work.

Torch's CPU ops on a thread split their work between as many threads as that thread's OpenMP
count (libgomp keeps one per thread; ``torch.set_num_threads`` sets the caller's and the default
for threads that start later). ``one_thread`` sets the calling thread's alone and puts it back:
other threads, and the count new threads take, stay as they are.

The count is set through the OpenMP runtime torch's own library is linked against (a lookup from
``libtorch_cpu``'s handle searches its dependencies), not a ``libgomp.so.1`` found by name: a wheel
bundling a renamed copy would otherwise load the system's, whose count torch never reads. Where
that lookup fails, or setting the count does not change torch's (another OpenMP runtime), the
block changes nothing, and ``one_thread_works`` says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

logger = logging.getLogger(__name__)


def available_cpus() -> int:
    """The logical CPUs this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@functools.cache
def _set_num_threads() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the runtime torch runs on, or None."""
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        function = library.omp_set_num_threads
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = None
    return function


@functools.cache
def one_thread_works() -> bool:
    """Whether ``one_thread`` takes effect here (checked once, on the calling thread)."""
    setter = _set_num_threads()
    if setter is None:
        logger.info("torch's OpenMP runtime not found: its ops on the sampler keep torch's count")
        return False
    before = torch.get_num_threads()
    probe = 2 if before == 1 else 1
    setter(probe)
    works = torch.get_num_threads() == probe
    setter(before)
    if not works:
        logger.info("torch does not read libgomp's count: its ops on the sampler keep its count")
    return works


@contextlib.contextmanager
def at_most_threads(count: int) -> Iterator[None]:
    """Torch's CPU ops on the calling thread run on at most ``count`` threads inside the block."""
    before = torch.get_num_threads()  # also sets the thread's count up first, as torch does
    if count >= before or not one_thread_works():
        yield
        return
    setter = _set_num_threads()
    assert setter is not None  # one_thread_works found it
    setter(max(1, count))
    try:
        yield
    finally:
        setter(before)


def one_thread() -> contextlib.AbstractContextManager[None]:
    """Torch's CPU ops on the calling thread run on it alone inside the block."""
    return at_most_threads(1)


class BusyCpus:
    """How many of this process's CPUs other processes keep busy, from ``/proc/stat``'s per-CPU
    times between ``BusyCpus()`` and ``measure()``, at least ``window_s`` apart (it sleeps the
    rest), less this process's own CPU time meanwhile (so the work between the two, reading a
    tokenizer, counts as none; other engines of this process count as none too). A load's many
    small parallel ops wait a time slice each for a thread the OS preempted: a GPTQ 250M model
    loaded in 15 s on two threads with one of two cores busy, 2.6 s on one."""

    def __init__(self, window_s: float = 0.04, read: Callable[[], str] | None = None) -> None:
        self._read = read or (lambda: Path("/proc/stat").read_text())
        self._window_s = window_s
        self._start = time.monotonic(), time.process_time(), self._sample()

    def _sample(self) -> dict[str, tuple[int, int]] | None:
        """Per CPU line ("cpu3"), its (busy, total) clock ticks; None where unreadable."""
        try:
            lines = self._read().splitlines()
            cpus = {}
            for line in lines:
                name, *fields = line.split() or [""]
                if name.startswith("cpu") and name != "cpu":
                    # user nice system idle iowait irq softirq steal (guest time is in user's)
                    ticks = [int(field) for field in fields[:8]]
                    cpus[name] = (sum(ticks[:3]) + sum(ticks[5:8]), sum(ticks))
        except (OSError, ValueError):
            return None
        return cpus or None

    def measure(self) -> float | None:
        """CPUs busy with other work over the window; None where it cannot be read."""
        started, own_started, first = self._start
        if first is None:
            return None
        rest = self._window_s - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)
        second = self._sample()
        if second is None:
            return None
        # The CPUs this process may run on, where /proc/stat numbers them as the affinity mask
        # does (a container's LXCFS view numbers its own from 0: then all of them), and in both
        # samples (one brought online between them would count its whole uptime).
        mine = (
            {f"cpu{i}" for i in os.sched_getaffinity(0)}
            if hasattr(os, "sched_getaffinity")
            else set()
        )
        names = (mine if mine and mine <= second.keys() else second.keys()) & first.keys()
        busy = sum(second[n][0] - first[n][0] for n in names)
        total = sum(second[n][1] - first[n][1] for n in names)
        if total <= 0:
            return None
        elapsed = max(time.monotonic() - started, 1e-9)
        own = (time.process_time() - own_started) / elapsed
        return max(0.0, busy / total * len(names) - own)


def threads_beside(busy: float | None, wanted: int) -> int:
    """Torch threads for work beside ``busy`` CPUs of other work (``BusyCpus``): one per CPU
    left, at least one, at most ``wanted``."""
    if busy is None:
        return wanted
    return max(1, min(wanted, math.floor(available_cpus() - busy + 0.5)))


F = TypeVar("F", bound=Callable[..., Any])


def on_one_cpu_thread(function: F) -> F:
    """``function`` (whose first argument is a tensor) run in ``one_thread`` where that tensor is
    on the CPU."""

    @functools.wraps(function)
    def run(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if tensor.device.type != "cpu":
            return function(tensor, *args, **kwargs)
        with one_thread():
            return function(tensor, *args, **kwargs)

    return run  # type: ignore[return-value]
