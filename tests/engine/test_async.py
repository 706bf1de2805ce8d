"""The async API: results equal the sync ones, and generation never blocks the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from brisklm import SamplingParams
from brisklm.engine.loop import AsyncCollector

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


async def test_agenerate_matches_generate(llm):
    expected = llm.generate(["Hello", "The quick"], GREEDY)
    got = await llm.agenerate(["Hello", "The quick"], GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    single = await llm.agenerate("Hello", GREEDY)
    assert single.token_ids == expected[0].token_ids


async def test_astream_matches_and_does_not_block_the_loop(llm, monkeypatch):
    # Each engine step takes at least 2 ms, so the stream lasts ~50 ms whatever the kernels'
    # speed: a tiny model can otherwise finish before the ticker first runs.
    step = llm.engine.step

    def slow_step():
        time.sleep(0.002)
        return step()

    monkeypatch.setattr(llm.engine, "step", slow_step)
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    pieces = [piece async for piece in llm.astream("Hello", GREEDY)]
    done.set()
    await task
    assert "".join(pieces) == llm.generate("Hello", GREEDY).text
    assert ticks > len(pieces)  # the loop kept running between chunks


async def test_concurrent_agenerate_calls(llm):
    prompts = ["Hello", "The quick", "def add", "Zürich"]
    expected = [llm.generate(p, GREEDY).token_ids for p in prompts]
    outs = await asyncio.gather(*(llm.agenerate(p, GREEDY) for p in prompts))
    assert [o.token_ids for o in outs] == expected


async def test_cancelled_stream_frees_its_slot(llm):
    agen = llm.astream_chunks(
        "Hello", SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    )
    await agen.__anext__()
    await agen.aclose()
    # Every slot is usable again: a full batch still runs.
    outs = await llm.agenerate(["a", "b", "c", "d"], GREEDY)
    assert all(len(o.token_ids) == 32 for o in outs)
    for _ in range(100):
        if not llm.engine.has_unfinished:
            break
        await asyncio.sleep(0.01)
    assert not llm.engine.has_unfinished


def test_leaving_asyncio_run_mid_stream_logs_no_errors(llm, caplog):
    # asyncio.run closes its loop right after the consumer breaks out; the engine thread still
    # had chunks (and the abort) in flight for that loop, and logged each failed delivery.
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def first_piece() -> str:
        async for piece in llm.astream("Hello", params):
            return piece
        return ""

    async def timed_out() -> None:
        try:
            await asyncio.wait_for(llm.agenerate("Hello", params), 0.05)
        except TimeoutError:
            pass

    with caplog.at_level("ERROR", logger="brisklm"):
        for _ in range(3):
            assert asyncio.run(first_piece())
            asyncio.run(timed_out())
        for _ in range(500):
            if not llm.engine.has_unfinished:
                break
            time.sleep(0.01)
    assert not llm.engine.has_unfinished
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    assert len(llm.generate("Hello", GREEDY).token_ids) == 32


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stream_left_open_by_a_closed_loop_is_stopped(tiny_dir):
    """A loop closed without shutting its async generators down (new_event_loop,
    run_until_complete, close: a sync app's pattern) never runs a stream's cleanup, which aborts
    its request: the request ran to max_tokens, holding its slot (an audit's)."""
    import gc

    from brisklm import LLM

    long = SamplingParams(temperature=0.0, max_tokens=16000, ignore_eos=True)
    with LLM.from_pretrained(
        tiny_dir, max_seq_len=16384, max_batch_size=1, show_progress=False
    ) as llm:
        for final_only in (False, True):
            loop = asyncio.new_event_loop()
            if final_only:  # (agenerate's collector, which takes a request's last chunk only)
                request = llm.make_request("Once upon a time", long)

                async def collector() -> AsyncCollector:
                    return AsyncCollector(final_only=True)

                llm._loop.submit([request], loop.run_until_complete(collector()))
                loop.run_until_complete(asyncio.sleep(0.2))
            else:
                stream = llm.astream("Once upon a time", long)
                loop.run_until_complete(stream.__anext__())
                del stream
                (request,) = list(llm.engine.scheduler.running)
            loop.close()
            gc.collect()  # (the closed loop's leftovers complain, as the mark allows)
            for _ in range(1000):
                if request.is_finished:
                    break
                time.sleep(0.01)
            assert request.finish_reason == "abort", final_only
            assert len(request.output_token_ids) < 8000
            assert len(llm.generate("Hello", GREEDY).token_ids) == 32


async def test_arun_requests_each_yields_each_request_as_it_finishes(llm):
    lengths = [24, 4, 12]
    requests = [
        llm.make_request(p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        for p, n in zip(["Hello", "The quick", "def add"], lengths)
    ]
    order = []
    async for index, output in llm.arun_requests_each(requests):
        order.append(index)
        assert len(output.token_ids) == lengths[index]
        assert output.token_ids == requests[index].output_token_ids
    assert order == [1, 2, 0]  # submitted together, finished shortest first


def slow_steps(llm, monkeypatch, seconds: float = 0.005) -> None:
    """Each engine step takes at least ``seconds``: a tiny model could otherwise finish a
    request before a test's abort reaches the engine (seen on a loaded CI machine)."""
    step = llm.engine.step

    def slow_step():
        time.sleep(seconds)
        return step()

    monkeypatch.setattr(llm.engine, "step", slow_step)


async def test_leaving_arun_requests_each_early_aborts_the_rest(llm, monkeypatch):
    slow_steps(llm, monkeypatch)
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    requests = [llm.make_request("Hello", short), llm.make_request("The quick", params)]
    results = llm.arun_requests_each(requests)
    index, _ = await results.__anext__()
    assert index == 0
    await results.aclose()
    for _ in range(300):
        if requests[1].is_finished:
            break
        await asyncio.sleep(0.01)
    assert requests[1].finish_reason == "abort"
    assert len(requests[1].output_token_ids) < 100


async def test_abort_stops_one_request_of_a_batch(llm, monkeypatch):
    slow_steps(llm, monkeypatch)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    requests = [llm.make_request("Hello", params), llm.make_request("The quick", params)]
    results = llm.arun_requests_each(requests)
    first = asyncio.ensure_future(results.__anext__())
    await asyncio.sleep(0)  # the generator has submitted both
    llm.abort(requests[1].request_id)
    got = dict([await first])
    async for index, output in results:
        got[index] = output
    assert got[1].finish_reason == "abort" and len(got[1].token_ids) < 64
    assert got[0].finish_reason == "length" and len(got[0].token_ids) == 64
    llm.abort("no-such-request")  # unknown ids are ignored
    assert (await llm.agenerate("Hello", GREEDY)).token_ids  # the engine goes on


async def test_abort_all_stops_every_request_queued_or_running(llm, monkeypatch):
    """A server stopping (a second Ctrl-C) ends every reply in flight at once."""
    slow_steps(llm, monkeypatch)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    # More requests than the engine's batch: some wait in the queue.
    prompts = ["Hello", "The quick", "Once upon", "A", "B", "C", "D", "E", "F"]
    requests = [llm.make_request(p, params) for p in prompts]
    results = llm.arun_requests_each(requests)
    first = asyncio.ensure_future(results.__anext__())
    await asyncio.sleep(0)  # the generator has submitted them all
    llm.abort_all()
    got = dict([await first])
    async for index, output in results:
        got[index] = output
    assert sorted(got) == list(range(len(prompts)))
    assert all(o.finish_reason == "abort" and len(o.token_ids) < 64 for o in got.values())
    assert (await llm.agenerate("Hello", GREEDY)).finish_reason == "length"  # later ones run


async def test_agenerate_and_achat_prepare_their_requests_off_the_loop(llm, monkeypatch):
    # Tokenizing, the chat template and compiling a grammar ran on the event loop: a new tool
    # grammar stalled it for 0.1-0.3 s.
    loop_thread = threading.current_thread()
    seen = []
    make_requests, prompt_ids = llm._make_requests, llm.chat_prompt_ids

    def recording_make_requests(*args, **kwargs):
        seen.append(("requests", threading.current_thread()))
        return make_requests(*args, **kwargs)

    def recording_prompt_ids(*args, **kwargs):
        seen.append(("template", threading.current_thread()))
        return prompt_ids(*args, **kwargs)

    monkeypatch.setattr(llm, "_make_requests", recording_make_requests)
    monkeypatch.setattr(llm, "chat_prompt_ids", recording_prompt_ids)
    out = await llm.agenerate("Hello", GREEDY)
    assert out.token_ids == llm.generate("Hello", GREEDY).token_ids
    reply = await llm.achat([{"role": "user", "content": "Hi"}], GREEDY)
    assert reply.content == llm.chat([{"role": "user", "content": "Hi"}], GREEDY).content
    async_calls = [seen[0], *seen[2:4]]  # agenerate; achat's template and requests
    assert [what for what, _ in async_calls] == ["requests", "template", "requests"]
    assert all(thread is not loop_thread for _, thread in async_calls)


async def test_aclose_and_async_with(tiny_dir):
    from brisklm import LLM

    async with LLM.from_pretrained(tiny_dir, show_progress=False) as llm:
        assert len((await llm.agenerate("Hello", GREEDY)).token_ids) == GREEDY.max_tokens
    with pytest.raises(RuntimeError, match="closed"):
        await llm.agenerate("Hello", GREEDY)
    await llm.aclose()  # closing again is harmless
