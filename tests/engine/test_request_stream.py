"""A stream names its request: another thread or task stops that one stream alone
(``stream.abort()``, ``llm.abort(stream.request_id)``), and the requests beside it go on."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from brisklm import LLM, SamplingParams
from brisklm.request_stream import AsyncRequestStream, RequestStream
from tests.engine.test_async import slow_steps
from tests.engine.test_engine_thread import wait_until

LONG = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
SHORT = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def test_a_stream_stopped_from_another_thread_ends_alone(llm, monkeypatch):
    full = llm.generate("Hello", LONG)
    beside_alone = llm.generate("The quick", SHORT)
    slow_steps(llm, monkeypatch)
    stream = llm.stream_chunks("Hello", LONG)
    assert isinstance(stream, RequestStream) and stream.request_id.startswith("req-")
    beside: list[list[int]] = []
    started = threading.Event()

    def other() -> None:  # a stream in another thread, running beside the one stopped
        ids = []
        for chunk in llm.stream_chunks("The quick", SHORT):
            started.set()
            ids += chunk.token_ids
        beside.append(ids)

    thread = threading.Thread(target=other)
    thread.start()
    chunks = [next(stream)]
    assert started.wait(10)
    threading.Thread(target=stream.abort).start()  # from a thread that does not iterate it
    chunks += list(stream)
    thread.join(10)
    ids = [t for c in chunks for t in c.token_ids]
    assert chunks[-1].finish_reason == "abort" and 0 < len(ids) < 100
    assert ids == full.token_ids[: len(ids)]
    assert {c.request_id for c in chunks} == {stream.request_id}
    assert beside == [beside_alone.token_ids]  # the stream beside it was not stopped
    assert wait_until(lambda: not llm.engine.has_unfinished)


def test_abort_by_the_streams_request_id(llm, monkeypatch):
    slow_steps(llm, monkeypatch)
    stream = llm.stream("Hello", LONG)
    text = next(stream)
    llm.abort(stream.request_id)
    text += "".join(stream)
    assert text == llm.generate("Hello", LONG).text[: len(text)]
    assert len(text) < len(llm.generate("Hello", LONG).text)


def test_a_second_reader_of_a_stream_is_told_it_has_one(llm, monkeypatch):
    # The second thread got Python's "ValueError: generator already executing".
    slow_steps(llm, monkeypatch)
    stream = llm.stream("Hello", LONG)
    next(stream)
    inside = threading.Event()
    release = threading.Event()
    items = stream._items

    def held():  # the first reader, waiting inside the stream's generator
        inside.set()
        release.wait(10)
        yield from items

    stream._items = held()
    first = threading.Thread(target=lambda: next(stream))
    first.start()
    assert inside.wait(10)
    with pytest.raises(RuntimeError, match="another thread is reading this stream"):
        next(stream)
    release.set()
    first.join(10)
    stream.close()
    assert wait_until(lambda: not llm.engine.has_unfinished)


@pytest.mark.parametrize("chunks", [False, True])
def test_a_stream_stopped_before_it_starts_yields_nothing(llm, chunks):
    stream = (llm.stream_chunks if chunks else llm.stream)("Hello", LONG)
    stream.abort()
    got = list(stream)
    if chunks:
        assert [(c.text, c.token_ids, c.finish_reason) for c in got] == [("", [], "abort")]
        assert got[0].request_id == stream.request_id
    else:
        assert got == []
    assert wait_until(lambda: not llm.engine.has_unfinished)
    assert llm.generate("Hello", SHORT).finish_reason == "length"  # the engine goes on


def test_closing_a_stream_stops_its_request(llm, monkeypatch):
    slow_steps(llm, monkeypatch)
    aborted: list[str] = []
    abort = llm._loop.abort
    monkeypatch.setattr(llm._loop, "abort", lambda rid: (aborted.append(rid), abort(rid)))
    with llm.stream("Hello", LONG) as stream:
        next(stream)
    assert aborted == [stream.request_id]  # at once, not when the generator is collected
    assert wait_until(lambda: not llm.engine.has_unfinished)


def test_chat_streams_name_their_request(llm):
    stream = llm.stream_chat([{"role": "user", "content": "Hi"}], SHORT)
    assert isinstance(stream, RequestStream)
    stream.abort()
    assert list(stream) == []


async def test_an_async_stream_stopped_from_another_task(llm, monkeypatch):
    full = llm.generate("Hello", LONG)
    slow_steps(llm, monkeypatch)
    stream = llm.astream_chunks("Hello", LONG)
    assert isinstance(stream, AsyncRequestStream)
    first = await stream.__anext__()

    async def stop() -> None:
        stream.abort()

    await asyncio.create_task(stop())
    chunks = [first] + [c async for c in stream]
    ids = [t for c in chunks for t in c.token_ids]
    assert chunks[-1].finish_reason == "abort" and 0 < len(ids) < 100
    assert ids == full.token_ids[: len(ids)]


async def test_an_async_text_stream_stopped_before_it_starts(llm):
    stream = llm.astream("Hello", LONG)
    stream.abort()
    assert [t async for t in stream] == []
    async with llm.astream("Hello", SHORT) as again:  # aclose on leaving
        assert "".join([t async for t in again]) == llm.generate("Hello", SHORT).text


@pytest.mark.parametrize("from_a_coroutine", [False, True])
def test_close_stops_the_grammar_worker_only_once_a_long_step_ends(
    tiny_dir, monkeypatch, from_a_coroutine
):
    """A step that outlasts close's wait still masks through the grammar worker: the worker
    stops as the engine thread ends, not under the step."""
    llm = LLM.from_pretrained(tiny_dir, device="cpu", max_seq_len=64, show_progress=False)
    closed: list[float] = []
    close_worker = llm.engine.structured.close
    monkeypatch.setattr(
        llm.engine.structured, "close", lambda: (closed.append(time.monotonic()), close_worker())
    )
    slow_steps(llm, monkeypatch, 0.5)
    stream = llm.stream("Hello", LONG)
    failed: list[BaseException] = []

    def read() -> None:
        try:
            list(stream)
        except RuntimeError as error:
            failed.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    assert wait_until(lambda: llm.engine.has_unfinished)
    time.sleep(0.1)  # inside a 0.5 s step
    if from_a_coroutine:
        asyncio.run(llm.aclose(timeout=0.01))
    else:
        llm.close(timeout=0.01)
    assert closed == []  # the step still runs
    thread_done = llm._loop._thread_done
    assert wait_until(thread_done.is_set) and wait_until(lambda: len(closed) == 1)
    reader.join(10)
    assert [str(e) for e in failed] == ["the engine was closed"]
    llm.close()  # again: nothing to wait for
