"""The engine thread exits when idle (releasing its OpenMP pool) and comes back on the next request."""

from __future__ import annotations

import threading
import time

import pytest

from brisklm import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "brisklm-engine"]


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def quick_idle_llm(tiny_dir):
    llm = LLM.from_pretrained(tiny_dir, device="cpu", max_seq_len=64, show_progress=False)
    llm._loop.idle_exit_s = 0.05
    yield llm
    llm.close()


def test_idle_engine_thread_exits_and_restarts(quick_idle_llm):
    llm = quick_idle_llm
    before = set(engine_threads())
    first = llm.generate(["hello"], GREEDY)[0]
    started = [t for t in engine_threads() if t not in before]
    assert len(started) == 1
    assert wait_until(lambda: not started[0].is_alive())
    again = llm.generate(["hello"], GREEDY)[0]  # a new thread serves it
    assert again.token_ids == first.token_ids


def test_requests_from_many_threads_across_idle_exits(quick_idle_llm):
    llm = quick_idle_llm
    expected = llm.generate(["a b c"], GREEDY)[0].token_ids
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def call(delay: float) -> None:
        time.sleep(delay)
        try:
            results.append(llm.generate(["a b c"], GREEDY)[0].token_ids)
        except BaseException as error:  # collected and asserted below
            errors.append(error)

    # Delays straddle the 50 ms idle exit, so some submits race a retiring thread.
    callers = [threading.Thread(target=call, args=(0.01 * i,)) for i in range(12)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=60)
    assert not errors
    assert results == [expected] * 12


def test_close_after_idle_exit(quick_idle_llm):
    llm = quick_idle_llm
    llm.generate(["x"], GREEDY)
    assert wait_until(lambda: llm._loop._thread is None)
    llm.close()
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(["x"], GREEDY)
