"""A background thread that drives the engine and hands each request's chunks to its consumer.

Every API (sync, async, streaming, many callers at once) submits requests here, so requests from
different callers share forward passes: that is what batches concurrent LangChain calls.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import numbers
import os
import queue
import threading
import weakref
from collections.abc import Callable

import torch

from brisklm.engine.llm_engine import LLMEngine, own_exception
from brisklm.engine.request import Request
from brisklm.engine.scratch_thread import wait_through_interrupts
from brisklm.outputs import StreamChunk

logger = logging.getLogger(__name__)

Sink = Callable[[Request, "StreamChunk | BaseException"], None]

# Seconds interpreter exit waits for an engine thread to finish the step it is in.
EXIT_JOIN_S = 10.0


def check_request_list(requests: object) -> None:
    """TypeError unless ``requests`` is a list (or tuple); its items are checked as Requests as
    they are submitted."""
    if not isinstance(requests, list | tuple):
        raise TypeError(
            "requests must be a list of Request objects (LLM.make_request), got "
            f"{type(requests).__name__}"
        )


class EngineLoop:
    """Owns the engine thread. ``submit`` and ``abort`` may be called from any thread.

    The thread exits after ``idle_exit_s`` seconds with nothing to do and is started again by the
    next ``submit``: an idle engine then holds no OpenMP thread pool, so other engines in the
    process (and the caller's own torch work) run at full speed (see
    ``brisklm.engine.scratch_thread`` for why a second pool slows every parallel kernel down).
    """

    def __init__(self, engine: LLMEngine, idle_exit_s: float = 1.0) -> None:
        self.engine = engine
        self.idle_exit_s = idle_exit_s
        self._inbox: queue.SimpleQueue[tuple[str, object, Sink | None]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._sinks: dict[str, Sink] = {}
        self._thread: threading.Thread | None = None
        # Set by the engine thread as it ends: waited for instead of joining it (an interrupted
        # join on Python 3.11 marks the thread stopped while it still runs: see scratch_thread).
        self._thread_done = threading.Event()
        self._start_lock = threading.Lock()
        self._fail_lock = threading.Lock()
        self._closed = False
        self._then: Callable[[], None] | None = None  # close()'s, once the thread has stopped
        # The process whose thread serves this loop: a forked child has a copy of the loop but
        # not of its thread (nor of the requests' consumers), so it may not use it.
        self._pid = os.getpid()
        # False once the interpreter is exiting: requests still open then are dropped, not
        # failed (their callers, daemon threads by then, end with the process as they would have).
        self._fail_on_close = True
        _open_loops.add(self)

    def submit(self, requests: list[Request], sink: Sink) -> None:
        """Queue requests (admitted together, so they can share a prefill); ``sink`` gets their chunks."""
        check_request_list(requests)
        self._check_process()  # before the lock, which the fork may have copied held
        with self._start_lock:  # no request slips in after close() has failed the pending ones
            if self._closed:
                raise RuntimeError("the engine is closed")
            seen: set[int] = set()
            for request in requests:
                if not isinstance(request, Request):
                    raise TypeError(
                        f"requests must be Request objects (LLM.make_request), got "
                        f"{type(request).__name__}"
                    )
                if request.submitted or id(request) in seen:
                    raise ValueError(
                        f"request {request.request_id} was already submitted: a request runs "
                        "once; make a new one (LLM.make_request) to run its prompt again"
                    )
                seen.add(id(request))
            for request in requests:
                request.submitted = True
            self._inbox.put(("add", requests, sink))
            self._ensure_thread_locked()
        self._wakeup.set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def _forked(self) -> bool:
        """Whether this is a forked child's copy of the loop (see ``_pid``)."""
        return os.getpid() != self._pid

    def _check_process(self) -> None:
        if self._forked:
            raise RuntimeError(
                f"this LLM was made in process {self._pid} and cannot serve requests in process "
                f"{os.getpid()}, forked from it (its engine thread does not exist here): make the "
                "LLM in the child process, or start workers with multiprocessing's 'spawn' method"
            )

    def abort(self, request_id: str | None) -> None:
        """Stop the request ``request_id`` (None: every request submitted so far)."""
        if self._forked:
            return  # nothing of this loop runs here
        self._inbox.put(("abort", request_id, None))
        self._wakeup.set()

    def close(self, timeout: float = 30.0, then: Callable[[], None] | None = None) -> None:
        """Stop the engine thread (waiting up to ``timeout`` seconds for the step it is in); every
        request still queued or running fails with an error. ``then`` runs once the thread has
        stopped: here, or as the thread ends where its step outlasts the timeout."""
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, numbers.Real)
            or not math.isfinite(timeout)
            or timeout < 0
        ):  # (before anything closes: a str failed inside the wait, the engine closed)
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        if self._forked:  # no thread to stop here, and the requests' callers are the parent's
            self._closed = True
            _open_loops.discard(self)
            if then is not None:
                then()
            return
        with self._start_lock:
            self._closed = True
            if then is not None:  # (a later close without one keeps an earlier's)
                self._then = then
            thread, done = self._thread, self._thread_done
        _open_loops.discard(self)
        self._wakeup.set()
        waits = thread is not None and thread is not threading.current_thread()
        if waits:
            done.wait(timeout=timeout)
        if thread is None or done.is_set():
            self._fail_pending()  # what the thread did not get to (or there was no thread)
            self._after_close()
        elif waits and timeout > 0:  # (at exit, where none is waited for here, no one to tell)
            logger.warning(
                "the engine's step is still running after %g s: it stops when the step ends",
                timeout,
            )

    def _after_close(self) -> None:
        with self._start_lock:
            then, self._then = self._then, None
        if then is not None:
            then()

    def _ensure_thread_locked(self) -> None:
        if self._thread is None or self._thread_done.is_set():
            done = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(done,), name="brisklm-engine", daemon=True
            )
            self._thread_done = done
            _engine_threads[self._thread] = done
            self._thread.start()

    def _run(self, done: threading.Event) -> None:
        try:
            with torch.inference_mode():  # once for the thread, not in each step (LLMEngine.step)
                self._serve()
        finally:
            done.set()
            if self._closed:  # (close() runs it too where it saw the thread end)
                self._after_close()

    def _serve(self) -> None:
        while not self._closed:
            self._drain_inbox()
            if not self.engine.has_unfinished:
                if not self._wakeup.wait(self.idle_exit_s) and self._retire_if_idle():
                    return
                self._wakeup.clear()
                continue
            try:
                results = self.engine.step()
            except Exception as exc:  # engine.step handles model errors; this is a bug guard
                logger.exception("engine loop step raised")
                results = self._fail_everything(exc)
            for request, result in results:
                self._deliver(request, result)
        self._fail_pending()

    def _fail_pending(self) -> None:
        """After close: fail every queued and running request, and tell each one's consumer."""
        if not self._fail_on_close:
            return
        with self._fail_lock:
            self._drain_inbox()  # requests still queued join the engine's, to fail with them
            for request, result in self._fail_everything(RuntimeError("the engine was closed")):
                self._deliver(request, result)

    def _retire_if_idle(self) -> bool:
        """Forget this thread if nothing is queued; ``submit`` then starts a new one."""
        with self._start_lock:
            if self._closed or not self._inbox.empty() or self.engine.has_unfinished:
                return False
            self._thread = None
            return True

    def _drain_inbox(self) -> None:
        # One thread at a time takes from the inbox (this one, or close() once it is gone), so
        # what empty() says is there stays there. (Not get_nowait until queue.Empty: an
        # exception raised every decode step.)
        while not self._inbox.empty():
            kind, payload, sink = self._inbox.get_nowait()
            if kind == "add":
                assert sink is not None
                for request in payload:  # type: ignore[attr-defined]
                    self._sinks[request.request_id] = sink
                    self.engine.add_request(request)
                    if request.abort_requested:  # stopped before it got here: ends now
                        self._abort_one(request.request_id)
            elif kind == "abort":
                scheduler = self.engine.scheduler
                every = [r.request_id for r in [*scheduler.running, *scheduler.waiting]]
                for request_id in every if payload is None else [payload]:
                    self._abort_one(request_id)  # type: ignore[arg-type]

    def _abort_one(self, request_id: str) -> None:
        result = self.engine.abort_request(request_id)
        if result is not None:
            self._deliver(*result)

    def _fail_everything(
        self, exc: BaseException
    ) -> list[tuple[Request, StreamChunk | BaseException]]:
        scheduler = self.engine.scheduler
        failed: list[tuple[Request, StreamChunk | BaseException]] = []
        for request in [*scheduler.running, *scheduler.waiting]:
            request.abort("error")
            self.engine.release(request)  # the slot, and the draft's state for it
            failed.append((request, own_exception(exc)))
        return failed

    def _deliver(self, request: Request, result: StreamChunk | BaseException) -> None:
        finished = isinstance(result, BaseException) or result.finished
        sink = (
            self._sinks.pop(request.request_id, None)
            if finished
            else self._sinks.get(request.request_id)
        )
        if sink is None:
            return
        try:
            sink(request, result)
        except ConsumerGone:  # (no one reads it: stopped, as an abort stops it)
            if not finished:
                self._sinks.pop(request.request_id, None)
                self._inbox.put(("abort", request.request_id, None))
        except Exception:  # a consumer's failure is not the engine's
            logger.exception("delivering output of request %s failed", request.request_id)


class ConsumerGone(Exception):
    """Raised by a sink whose consumer can take nothing more (its event loop is closed): the
    engine stops its request (``EngineLoop._deliver``)."""


def _skipped(final_only: bool, result: StreamChunk | BaseException) -> bool:
    """Whether a final-only collector drops ``result``: a chunk that does not end its request."""
    return final_only and not isinstance(result, BaseException) and not result.finished


POLL_S = 0.05  # how soon a waiting caller notices an interrupt raised without a signal


class SyncCollector:
    """A sink for blocking consumers: chunks go into a thread-safe queue.

    ``final_only``: only a request's last chunk (or its error) is queued, for callers that wait for
    whole outputs. Each queued chunk wakes the waiting thread, which then takes the GIL from the
    engine thread between its steps; at ~1,000 tokens/s that is a wake-up a millisecond.
    """

    def __init__(self, final_only: bool = False) -> None:
        self.final_only = final_only
        self.queue: queue.SimpleQueue[tuple[Request, StreamChunk | BaseException]] = (
            queue.SimpleQueue()
        )
        self._pid = os.getpid()

    def __call__(self, request: Request, result: StreamChunk | BaseException) -> None:
        if _skipped(self.final_only, result):
            return
        self.queue.put((request, result))

    def get(self) -> tuple[Request, StreamChunk | BaseException]:
        """The next queued result, waiting for it in slices of ``POLL_S``.

        A blocking get wakes for a real signal (Ctrl-C) but not for ``_thread.interrupt_main()``
        (a watchdog thread, a notebook's or IDE's stop button), which Python raises only when the
        waiting thread runs again: without the slices, after the whole request.
        """
        while True:
            try:
                return self.queue.get(timeout=POLL_S)
            except queue.Empty:
                if os.getpid() != self._pid:  # a call in flight at a fork, waited for in the child
                    raise RuntimeError(
                        "this call was made in process "
                        f"{self._pid}; its output is delivered there, not in process "
                        f"{os.getpid()}, forked from it"
                    ) from None


class AsyncCollector:
    """A sink for asyncio consumers: chunks are handed to the event loop that made the collector.

    ``final_only`` as for :class:`SyncCollector`: each handed chunk wakes the event loop's thread.
    """

    def __init__(self, final_only: bool = False) -> None:
        self.final_only = final_only
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[Request, StreamChunk | BaseException]] = asyncio.Queue()

    def __call__(self, request: Request, result: StreamChunk | BaseException) -> None:
        if self.loop.is_closed():
            # The consumer is gone: asyncio.run returned after a cancel or timeout (its request
            # aborted, what is still in flight has no one to go to), or the loop was closed with
            # a stream unfinished, whose generator then never ran its cleanup to abort it.
            raise ConsumerGone
        if _skipped(self.final_only, result):
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (request, result))
        except RuntimeError:
            if not self.loop.is_closed():
                raise
            raise ConsumerGone from None  # closed between the check and the call


# Every loop not yet closed. At interpreter exit its thread, a daemon, could still be inside a
# forward pass (torch's or the native kernels' OpenMP region) while the runtime tears down, and the
# process then aborted ("terminate called without an active exception", exit status 134) after
# the program's own work had finished: seen for scripts that exit with a stream still open or a
# request running. Closing the loops first lets each thread finish its step and return.
_open_loops: weakref.WeakSet[EngineLoop] = weakref.WeakSet()
# Every engine thread still running. One that retired for want of work can hold the last reference
# to its loop (an LLM dropped without close(), as a script's last line may leave it), and then
# frees the loop, its engine, weights and cache on its way out; the loop has already left
# _open_loops. Tensors on huge pages (torch.frombuffer's, whose deleter takes the GIL) freed after
# interpreter exit has begun made that daemon thread exit mid-deallocation and the process abort
# ("terminate called without an active exception", exit status 134). So exit waits for them too.
# Each with the event it sets as it ends.
_engine_threads: weakref.WeakKeyDictionary[threading.Thread, threading.Event] = (
    weakref.WeakKeyDictionary()
)


def _forget_the_parents_threads() -> None:
    """In a forked child: the parent's engine threads do not exist here, so exit waits for none."""
    _engine_threads.clear()


os.register_at_fork(after_in_child=_forget_the_parents_threads)


@atexit.register
def _close_open_loops() -> None:
    # A Ctrl-C during these waits (pressed again to hurry the exit) would end them with the
    # threads still in a step, and the process aborted as above: they wait through it.
    for loop in list(_open_loops):
        loop._fail_on_close = False
        try:
            loop.close(timeout=0)  # no waiting here: below, through interrupts
        except Exception:  # exit goes on whatever one engine does
            logger.exception("closing an engine at exit failed")
        except BaseException:  # noqa: S110 - an interrupt: the waits below still run
            pass
    for thread, done in list(_engine_threads.items()):
        if thread is not threading.current_thread() and wait_through_interrupts(
            done, timeout=EXIT_JOIN_S
        ):
            try:
                thread.join(timeout=EXIT_JOIN_S)  # its last lines, after the event
            except BaseException:  # noqa: S110 - it has left the engine's code already
                pass
