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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def call_in_scratch_thread(fn: Callable[[], T], name: str = "brisklm-setup") -> T:
    """``fn()`` run in a new thread that exits afterwards; its result or exception is the caller's."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        # Everything, KeyboardInterrupt included: re-raised in the caller's thread, type and
        # traceback intact.
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        error = outcome["error"]
        assert isinstance(error, BaseException)
        raise error
    return outcome["result"]  # type: ignore[return-value]
