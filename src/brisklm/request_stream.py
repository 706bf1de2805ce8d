"""Iterators over one request's output (``LLM.stream`` and its kin) that name the request, so
that another thread or task can stop that one stream: ``stream.abort()``, or
``llm.abort(stream.request_id)`` once it runs."""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
)
from typing import Generic, TypeVar

from brisklm.engine.request import Request

T = TypeVar("T")


class _Named:
    """What both streams share: the request they iterate over, and a way to stop it."""

    def __init__(self, request: Request, abort: Callable[[str], None]) -> None:
        self._request = request
        self._abort = abort

    @property
    def request_id(self) -> str:
        """The request's id (``LLM.abort`` takes it; outputs and chunks carry it)."""
        return self._request.request_id

    def abort(self) -> None:
        """Stop the request, from any thread: the stream ends with the text so far (its last
        chunk's finish reason is ``"abort"``). Before generation starts (the first ``next``) the
        request ends as it is submitted, and the stream yields no text."""
        self._request.abort_requested = True
        self._abort(self._request.request_id)


class RequestStream(_Named, Iterator[T], Generic[T]):
    """An iterator over one request's text deltas or chunks. ``close()`` (or leaving a ``with``
    block) stops the request from the thread that iterates; ``abort()`` from any other."""

    def __init__(
        self, items: Generator[T, None, None], request: Request, abort: Callable[[str], None]
    ) -> None:
        super().__init__(request, abort)
        self._items = items

    def __iter__(self) -> RequestStream[T]:
        return self

    def __next__(self) -> T:
        if self._items.gi_running:  # (Python's own "generator already executing" named no one)
            raise RuntimeError(
                "another thread is reading this stream: a RequestStream has one reader (other "
                "threads may stop it: stream.abort())"
            )
        return next(self._items)

    def close(self) -> None:
        self._items.close()

    def __enter__(self) -> RequestStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRequestStream(_Named, AsyncIterator[T], Generic[T]):
    """``RequestStream`` for ``async for``: ``aclose()`` (or leaving an ``async with`` block)
    stops the request; ``abort()`` from any thread or task."""

    def __init__(
        self, items: AsyncGenerator[T, None], request: Request, abort: Callable[[str], None]
    ) -> None:
        super().__init__(request, abort)
        self._items = items

    def __aiter__(self) -> AsyncRequestStream[T]:
        return self

    def __anext__(self) -> Awaitable[T]:  # (the generator's own awaitable: no coroutine a step)
        return self._items.__anext__()

    async def aclose(self) -> None:
        await self._items.aclose()

    async def __aenter__(self) -> AsyncRequestStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
