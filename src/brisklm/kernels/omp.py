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
import os
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
def one_thread() -> Iterator[None]:
    """Torch's CPU ops on the calling thread run on it alone inside the block."""
    before = torch.get_num_threads()  # also sets the thread's count up first, as torch does
    if before == 1 or not one_thread_works():
        yield
        return
    setter = _set_num_threads()
    assert setter is not None  # one_thread_works found it
    setter(1)
    try:
        yield
    finally:
        setter(before)


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
