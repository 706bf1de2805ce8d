"""Run setup work in a short-lived thread, so the OpenMP thread pool it creates dies with it.

PyTorch's CPU kernels run on OpenMP (libgomp), which keeps one pool of worker threads per thread
that starts parallel work. The engine computes on its own thread; if the caller's thread also ran
parallel kernels (loading weights, allocating the KV cache), two pools live on, more OpenMP threads
than CPUs exist, and libgomp then makes idle workers sleep almost at once instead of spinning:
every one of the ~150 parallel kernels of a decode step pays a futex wake-up. Measured on the
2-vCPU VM, 125M-parameter model, float32: a decode forward pass took 15.3 ms on the engine thread
after loading on the caller's thread, 10.3 ms after loading in a scratch thread (11.9 ms with
everything on the main thread). ``LLM.from_pretrained`` loads through ``call_in_scratch_thread``.
The caller's own torch work in its thread can still create a second pool; nothing here prevents it.

An interrupted caller (Ctrl-C while a model loads) does not leave the thread behind: the thread,
a daemon, would still be inside native OpenMP code when the interpreter exits, and the process
aborted ("terminate called without an active exception", exit status 134) instead of ending on
KeyboardInterrupt. The caller asks the work to stop, waits for it, then raises the interrupt. Work
that may run long (the loader's loop over tensors) calls ``raise_if_cancelled`` between steps, so
that the wait is short.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ScratchWorkCancelled(Exception):
    """Raised in a scratch thread at a cancellation point once its caller was interrupted."""


# The cancel event of the scratch thread running now, where the current thread is one.
_scratch = threading.local()


def raise_if_cancelled() -> None:
    """A cancellation point: raises ScratchWorkCancelled in a scratch thread whose caller was
    interrupted; does nothing in any other thread."""
    cancel: threading.Event | None = getattr(_scratch, "cancel", None)
    if cancel is not None and cancel.is_set():
        raise ScratchWorkCancelled("the caller of this scratch thread was interrupted")


def call_in_scratch_thread(fn: Callable[[], T], name: str = "brisklm-setup") -> T:
    """``fn()`` run in a new thread that exits afterwards; its result or exception is the caller's.

    If the wait is interrupted (KeyboardInterrupt, or any exception a signal handler raises), the
    work is asked to stop at its next ``raise_if_cancelled``, waited for, and the interruption is
    raised."""
    outcome: dict[str, object] = {}
    cancel = threading.Event()
    done = threading.Event()

    def run() -> None:
        _scratch.cancel = cancel
        try:
            outcome["result"] = fn()
        # Everything, KeyboardInterrupt included: re-raised in the caller's thread, type and
        # traceback intact.
        except BaseException as error:
            outcome["error"] = error
        finally:
            done.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    # Waited for through an event the thread sets last, not thread.join(): on Python 3.11 a join
    # interrupted by KeyboardInterrupt releases the thread's state lock itself (bpo-45274's
    # handling), and the thread then counts as stopped, joins return at once, while it still runs.
    try:
        done.wait()
    except BaseException:
        cancel.set()
        wait_through_interrupts(done)
        raise
    thread.join()
    if "error" in outcome:
        error = outcome["error"]
        assert isinstance(error, BaseException)
        raise error
    return outcome["result"]  # type: ignore[return-value]


def wait_through_interrupts(done: threading.Event, timeout: float | None = None) -> bool:
    """Wait for ``done`` (at most ``timeout`` seconds); a Ctrl-C meanwhile is ignored, not fatal,
    since the thread that sets ``done`` is still in native code. Returns whether it was set."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not done.is_set():
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        try:
            done.wait(remaining)
        except BaseException:  # noqa: S110 - the caller has its own interruption to raise, or none
            pass
    return True
