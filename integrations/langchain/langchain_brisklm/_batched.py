"""The calls of one ChatBrisk batch reach the engine together.

LangChain's ``abatch`` runs one ``ainvoke`` per input. Each rendered its prompt on a worker thread
of its own and submitted its request alone; with eight inputs on two cores the renders competed
with each other and with the engine, which began decoding the first five or six while the rest
were still being rendered (they joined ~20 ms later). Inside a batch, the calls that start in the
same event-loop turn are now prepared one after another on one worker thread and their requests
submitted in one go: one prefill pass, then one decode batch. Each call still gets its own
request's output (or error) as soon as that request finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from brisklm.offload import run_off_loop
from brisklm.outputs import GenerationOutput

Prepared = Any  # chat_models._Call: .llm (the engine) and .requests (a completion each)
Outcome = tuple[Prepared, list[GenerationOutput]]
Waiting = tuple[Callable[[], Prepared], "asyncio.Future[Outcome]"]


class BatchStopped(RuntimeError):
    """A call of a batch stopped because another input of it failed
    (``BatchSubmission.stop_all``)."""


class BatchSubmission:
    """Groups the calls of one batch (see the module docstring). ``stop_on_error``: one call's
    error stops the others (a batch that raises, rather than returning each input's error)."""

    def __init__(self, stop_on_error: bool = False) -> None:
        self._waiting: list[Waiting] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._cancelled = False
        self.stop_on_error = stop_on_error
        self.error: Exception | None = None  # the call's error that stopped the batch

    def cancel_all(self) -> None:
        """Cancel every call of the batch not finished yet (their requests are aborted), and any
        call that starts later: for a batch that raised, whose other inputs would otherwise
        decode on for no one (``asyncio.gather`` leaves them running)."""
        self._cancelled = True
        for future in self._futures:
            if not future.done():
                future.cancel()

    def stop_all(self, error: Exception) -> None:
        """A call failed with ``error`` (the first to): every call not finished yet, and any that
        starts later, fails with a ``BatchStopped`` naming it, its requests aborted. Failed, not
        cancelled: each call's run reports its error to the callbacks (a cancelled one's run
        never ended, where ``batch`` ran the inputs on an event loop of its own)."""
        if self.error is not None:
            return
        self.error = error
        for future in self._futures:
            if not future.done():
                future.set_exception(self.stopped())

    def check_going(self) -> None:
        """BatchStopped once a call has stopped the batch: for a call that has not started (one
        ``max_concurrency`` held back) and a streamed one, which checks at each chunk (its
        request is aborted as the raise closes its stream)."""
        if self.error is not None:
            raise self.stopped()

    def stopped(self) -> BatchStopped:
        """The error of a call the batch's ``error`` stopped."""
        error = self.error
        return BatchStopped(
            f"another input of the batch failed ({type(error).__name__}: {error}); this one was "
            "stopped"
        )

    async def run(self, prepare: Callable[[], Prepared]) -> Outcome:
        """``prepare()`` run beside the other calls of this turn, then its requests' outputs.

        A call whose ``prepare`` raises, or one of whose requests fails in the engine, gets that
        error alone (its other requests aborted); a cancelled call's requests are aborted (or,
        not yet submitted, never made)."""
        if self._cancelled:
            raise asyncio.CancelledError
        self.check_going()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._futures.append(future)
        self._waiting.append((prepare, future))
        if len(self._waiting) == 1:
            loop.call_soon(self._start)
        return await future

    def _start(self) -> None:
        group, self._waiting = self._waiting, []
        task = asyncio.ensure_future(_run_group(group))
        futures = [future for _, future in group]

        def settle_the_rest(task: asyncio.Future[None]) -> None:
            # Whatever ended the group (an error outside any one call, a cancellation), no
            # caller is left waiting.
            error = None if task.cancelled() else task.exception()
            for future in futures:
                if future.done():
                    continue
                if error is None:
                    future.cancel()
                else:
                    future.set_exception(error)

        task.add_done_callback(settle_the_rest)

        def cancel_when_no_one_waits(_: asyncio.Future[Any]) -> None:
            if all(f.done() for f in futures):
                task.cancel()

        for future in futures:
            future.add_done_callback(cancel_when_no_one_waits)


async def _run_group(group: list[Waiting]) -> None:
    group = [(prepare, future) for prepare, future in group if not future.done()]

    def prepare_all() -> list[tuple[Prepared | None, Exception | None]]:
        results: list[tuple[Prepared | None, Exception | None]] = []
        for prepare, future in group:
            if future.done():  # cancelled meanwhile: nothing to render
                results.append((None, None))
                continue
            try:
                results.append((prepare(), None))
            except Exception as error:  # this call's own bad input: raised to it alone
                results.append((None, error))
        return results

    prepared = await run_off_loop(prepare_all)
    by_engine: dict[int, list[tuple[Prepared, asyncio.Future[Any]]]] = {}
    for (call, error), (_, future) in zip(prepared, group):
        if error is not None:
            _settle(future, error=error)
        elif call is not None and not future.done():
            by_engine.setdefault(id(call.llm), []).append((call, future))
    await asyncio.gather(*(_submit(items) for items in by_engine.values()))


async def _submit(items: list[tuple[Prepared, asyncio.Future[Any]]]) -> None:
    llm = items[0][0].llm

    def abort(call: Prepared) -> None:
        for request in call.requests:  # (one that has finished is ignored)
            llm.abort(request.request_id)

    owner = []  # the item of each request
    for item, (call, future) in enumerate(items):
        future.add_done_callback(
            lambda f, call=call: abort(call) if f.cancelled() or f.exception() else None
        )
        owner += [item] * len(call.requests)
    done: list[dict[int, GenerationOutput]] = [{} for _ in items]
    results = llm.arun_requests_each([request for call, _ in items for request in call.requests])
    try:
        async with contextlib.aclosing(results):
            async for index, result in results:
                item = owner[index]
                call, future = items[item]
                if isinstance(result, BaseException):
                    _settle(future, error=result)
                    abort(call)
                    continue
                done[item][index] = result
                if len(done[item]) == len(call.requests):
                    _settle(future, result=(call, [done[item][i] for i in sorted(done[item])]))
    except Exception as error:  # this engine's own failure (closed, say): its calls alone
        for _, future in items:
            _settle(future, error=error)


def _settle(
    future: asyncio.Future[Any], result: Any = None, error: BaseException | None = None
) -> None:
    if future.done():  # its caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
