"""Blocking work awaited from a coroutine on a worker thread, without blocking the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_off_loop(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on a worker thread (as ``asyncio.to_thread``), awaited.

    Once the main thread has ended, interpreter shutdown has begun and asyncio's default executor
    refuses new work, while non-daemon threads may still run event loops (an async call made from
    one failed with "cannot schedule new futures after interpreter shutdown"): then a plain thread
    runs it.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:  # what asyncio.to_thread does; a refusal is raised here, before anything runs
        pending = loop.run_in_executor(None, functools.partial(context.run, function, *args))
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown" and the like
        pending = None
    if pending is not None:
        return await pending  # the function's own errors come from here, never run twice
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[Any], None], value: Any) -> None:
        if not future.done():  # the awaiting task may have been cancelled
            outcome(value)

    def hand_over(outcome: Callable[[Any], None], value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, outcome, value)
        except RuntimeError:  # the loop has closed (the awaiting call timed out or was cancelled)
            pass

    def run() -> None:
        try:
            result = context.run(function, *args)
        except BaseException as error:  # handed to the awaiting task
            hand_over(future.set_exception, error)
        else:
            hand_over(future.set_result, result)

    threading.Thread(target=run, name="brisklm-offload", daemon=True).start()
    return await future
