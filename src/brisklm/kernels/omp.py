"""The calling thread's OpenMP thread count for a stretch of work.

Torch's CPU ops on a thread split their work between as many threads as that thread's OpenMP
count (libgomp keeps one per thread; ``torch.set_num_threads`` sets the caller's and the default
for threads that start later). ``one_thread`` sets the calling thread's alone and puts it back:
other threads, and the count new threads take, stay as they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch's ops run on (loaded with torch: the same library), or None."""
    try:
        lib = ctypes.CDLL("libgomp.so.1")
    except OSError:
        return None
    lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    lib.omp_set_num_threads.restype = None
    return lib


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch's CPU ops on the calling thread run on it alone inside the block."""
    lib = _libgomp()
    before = torch.get_num_threads()  # also sets the thread's count up first, as torch does
    if lib is None or before == 1:
        yield
        return
    lib.omp_set_num_threads(1)
    try:
        yield
    finally:
        lib.omp_set_num_threads(before)


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
