"""The calls of one ChatBrisk batch reach the engine together.

LangChain's ``abatch`` runs one ``ainvoke`` per input. Each rendered its prompt on a worker thread
of its own and submitted its request alone; with eight inputs on two cores the renders competed
with each other and with the engine, which began decoding the first five or six while the rest
were still being rendered (they joined ~20 ms later). Inside a batch, the calls that start in the
same event-loop turn are now prepared one after another on one worker thread and their requests
submitted in one go: one prefill pass, then one decode batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from brisklm.outputs import GenerationOutput

Prepared = Any  # chat_models._Call: .llm (the engine) and .request


class BatchSubmission:
    """Groups the calls of one batch (see the module docstring)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[Callable[[], Prepared], asyncio.Future]] = []

    async def run(self, prepare: Callable[[], Prepared]) -> tuple[Prepared, GenerationOutput]:
        """``prepare()`` run beside the other calls of this turn, then its request's output.

        A call whose ``prepare`` raises gets that error alone. An error of the engine fails every
        request submitted with it. The group's requests still running are aborted once none of
        its callers waits for them (all cancelled or failed); a caller cancelled while others
        wait leaves its request to finish."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._waiting.append((prepare, future))
        if len(self._waiting) == 1:
            loop.call_soon(self._start)
        return await future

    def _start(self) -> None:
        group, self._waiting = self._waiting, []
        task = asyncio.ensure_future(_run_group(group))
        futures = [future for _, future in group]

        def on_done(_: asyncio.Future) -> None:
            if all(f.done() for f in futures):  # no caller waits: what still runs is aborted
                task.cancel()

        for future in futures:
            future.add_done_callback(on_done)


async def _run_group(group: list[tuple[Callable[[], Prepared], asyncio.Future]]) -> None:
    def prepare_all() -> list[tuple[Prepared | None, Exception | None]]:
        results: list[tuple[Prepared | None, Exception | None]] = []
        for prepare, _ in group:
            try:
                results.append((prepare(), None))
            except Exception as error:  # this call's own bad input: raised to it alone
                results.append((None, error))
        return results

    prepared = await asyncio.to_thread(prepare_all)
    by_engine: dict[int, list[tuple[Prepared, asyncio.Future]]] = {}
    for (call, error), (_, future) in zip(prepared, group):
        if error is not None:
            _settle(future, error=error)
        else:
            by_engine.setdefault(id(call.llm), []).append((call, future))
    await asyncio.gather(*(_submit(items) for items in by_engine.values()))


async def _submit(items: list[tuple[Prepared, asyncio.Future]]) -> None:
    llm = items[0][0].llm
    try:
        outputs = await llm.arun_requests([call.request for call, _ in items])
    except Exception as error:
        for _, future in items:
            _settle(future, error=error)
        return
    for (call, future), output in zip(items, outputs):
        _settle(future, result=(call, output))


def _settle(future: asyncio.Future, result: Any = None, error: Exception | None = None) -> None:
    if future.done():  # its caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
