"""Blocking work awaited from a coroutine on a worker thread, without blocking the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_off_loop(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on a worker thread (``asyncio.to_thread``), awaited.

    Once the main thread has ended, interpreter shutdown has begun and asyncio's default executor
    refuses new work, while non-daemon threads may still run event loops (an async call made from
    one failed with "cannot schedule new futures after interpreter shutdown"): then a plain thread
    runs it.
    """
    try:
        return await asyncio.to_thread(function, *args)
    except RuntimeError as error:  # refused before ``function`` ran
        if "interpreter shutdown" not in str(error):
            raise
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: Callable[[Any], None], value: Any) -> None:
        if not future.done():  # the awaiting task may have been cancelled
            outcome(value)

    def run() -> None:
        try:
            result = context.run(function, *args)
        except BaseException as error:  # handed to the awaiting task
            loop.call_soon_threadsafe(settle, future.set_exception, error)
        else:
            loop.call_soon_threadsafe(settle, future.set_result, result)

    threading.Thread(target=run, name="brisklm-offload", daemon=True).start()
    return await future
