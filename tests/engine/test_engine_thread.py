"""The engine thread exits when idle (releasing its OpenMP pool) and comes back on the next request."""

from __future__ import annotations

import os
import threading
import time

import pytest

from brisklm import LLM, SamplingParams
from tests.engine.test_async import slow_steps
from tests.scripts import run_script

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


LONG = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("drafted", [False, True])
def test_close_fails_every_running_and_queued_request(tiny_dir, drafted, monkeypatch):
    # It used to stop the thread and leave every caller waiting forever.
    # Threads of engines other tests left idle (exiting within a second) are not this one's.
    before = set(threading.enumerate())
    llm = LLM.from_pretrained(
        tiny_dir,
        device="cpu",
        max_batch_size=2,
        max_seq_len=512,
        show_progress=False,
        draft=tiny_dir if drafted else None,
    )
    llm.generate("x", GREEDY)
    # Steps of 50 ms: the first two replies (to the end of the 512-token context) would otherwise
    # finish before a loaded machine started the other two callers (seen in a CI run).
    slow_steps(llm, monkeypatch, 0.05)
    outcomes: list[str] = []

    def call(kind: str) -> None:
        try:
            if kind == "stream":
                for _ in llm.stream("Hello", LONG):
                    pass
            else:
                llm.generate("Hello", LONG)
            outcomes.append("finished")
        except RuntimeError as error:
            outcomes.append(str(error))

    # Four callers on two slots: two run, two wait in the scheduler.
    callers = [threading.Thread(target=call, args=(k,)) for k in ("generate", "stream") * 2]
    for caller in callers:
        caller.start()
    scheduler = llm.engine.scheduler
    # All four submitted before close (a caller submitting after it is told "is closed" instead).
    assert wait_until(lambda: len(scheduler.running) == 2 and len(scheduler.waiting) == 2)
    llm.close()
    for caller in callers:
        caller.join(timeout=10)
    assert not any(caller.is_alive() for caller in callers)
    assert outcomes == ["the engine was closed"] * 4
    assert not [
        t
        for t in threading.enumerate()
        if t not in before and t.name.startswith(("brisklm-engine", "brisklm-grammar"))
    ]
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate("x", GREEDY)
    if drafted:  # the draft's per-slot state went with the slots
        assert all(state is None for state in llm.engine.speculator.proposer._slots)


def test_a_request_still_in_the_inbox_at_close_fails(quick_idle_llm):
    from brisklm.engine.loop import SyncCollector

    llm = quick_idle_llm
    llm.generate("x", GREEDY)
    request = llm.make_request("Hello", GREEDY)
    collector = SyncCollector()
    llm._loop.submit([request], collector)
    llm.close()
    got_request, result = collector.queue.get(timeout=10)
    assert got_request is request
    assert isinstance(result, BaseException) or result.finished  # failed, or done before close


def test_a_failed_step_gives_each_caller_its_own_exception(tiny_dir, monkeypatch):
    llm = LLM.from_pretrained(tiny_dir, device="cpu", max_seq_len=64, show_progress=False)
    shared = RuntimeError("simulated kernel failure")

    def fail(batch, *greedy_columns):
        raise shared

    monkeypatch.setattr(llm.engine.runner, "forward", fail)
    monkeypatch.setattr(llm.engine.runner, "forward_greedy", fail)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            llm.generate("Hello", GREEDY)
        except RuntimeError as error:
            errors.append(error)

    callers = [threading.Thread(target=call) for _ in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=30)
    monkeypatch.undo()
    assert len(errors) == 3 and all(str(e) == "simulated kernel failure" for e in errors)
    assert len({id(e) for e in errors}) == 3  # one instance each: tracebacks do not mix
    assert all(e.__cause__ is shared for e in errors)
    assert len(llm.generate("Hello", GREEDY).token_ids) == 6
    llm.close()


def _final_only_cases():
    from types import SimpleNamespace

    partial, last, error = (
        SimpleNamespace(finished=False),
        SimpleNamespace(finished=True),
        RuntimeError("x"),
    )
    return partial, last, error


def test_a_final_only_collector_queues_finished_outputs_and_errors():
    from brisklm.engine.loop import SyncCollector

    collector = SyncCollector(final_only=True)
    request = object()
    partial, last, error = _final_only_cases()
    for result in (partial, partial, last, error):
        collector(request, result)  # type: ignore[arg-type]
    queued = [collector.queue.get_nowait()[1] for _ in range(collector.queue.qsize())]
    assert queued == [last, error]
    everything = SyncCollector()
    everything(request, partial)  # type: ignore[arg-type]
    assert everything.queue.qsize() == 1


async def test_a_final_only_async_collector_hands_over_finished_outputs_and_errors():
    import asyncio

    from brisklm.engine.loop import AsyncCollector

    collector = AsyncCollector(final_only=True)
    everything = AsyncCollector()
    request = object()
    partial, last, error = _final_only_cases()
    for result in (partial, partial, last, error):
        collector(request, result)  # type: ignore[arg-type]
        everything(request, result)  # type: ignore[arg-type]
    await asyncio.sleep(0)  # call_soon_threadsafe hands them over on the next loop turn
    queued = [collector.queue.get_nowait()[1] for _ in range(collector.queue.qsize())]
    assert queued == [last, error]
    assert everything.queue.qsize() == 4


EXIT_SCRIPT = """
import atexit, sys, threading, time

def report():  # registered before brisklm's own exit handler, so it runs after it
    alive = [t for t in threading.enumerate() if t.name == "brisklm-engine" and t.is_alive()]
    print("engine threads alive at exit:", len(alive), flush=True)

atexit.register(report)
from brisklm import LLM, SamplingParams

llm = LLM.from_pretrained(sys.argv[1], device="cpu", max_seq_len=512, show_progress=False)
params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
if sys.argv[2] == "stream":
    for index, _ in enumerate(llm.stream("a b c", params)):
        if index == 2:
            break  # the stream is left open: its request is still running
elif sys.argv[2] == "dropped":  # dropped without close(): its engine thread, retiring, frees it

    class SlowToFree:
        def __del__(self):
            time.sleep(1.0)

    llm._loop.idle_exit_s = 0.05
    llm.generate("a b c", SamplingParams(max_tokens=4))
    llm.engine.slow_to_free = SlowToFree()
    del llm
    time.sleep(0.5)  # the thread has retired and is freeing the engine
else:  # a caller on a daemon thread still waiting for its output
    threading.Thread(target=lambda: llm.generate(["a b c"] * 4, params), daemon=True).start()
    time.sleep(0.3)
print("leaving", flush=True)
"""


@pytest.mark.parametrize("how", ["stream", "daemon", "dropped"])
def test_exiting_with_a_request_running_stops_the_engine_thread_first(tiny_dir, tmp_path, how):
    # Before the engine closed its loops at exit, such a process could abort after its last line
    # (exit status 134, "terminate called without an active exception"): its engine thread was
    # still in a forward pass while the runtime tore down. "dropped": an LLM let go without
    # close() is freed by its engine thread when that retires, after its loop has left the ones
    # closed at exit; freeing its huge-page tensors once exit had begun aborted the same way
    # (tests/test_bundled_models.py alone, one run in three).
    done = run_script(tmp_path, EXIT_SCRIPT, str(tiny_dir), how)
    assert done.stdout.splitlines()[-2:] == ["leaving", "engine threads alive at exit: 0"]
    assert "Traceback" not in done.stderr and "terminate called" not in done.stderr


INTERRUPTED_EXIT_SCRIPT = """
import atexit, signal, sys, threading, time

in_step = []

def report():  # registered before brisklm's own exit handler, so it runs after it
    print("engine steps in progress after brisklm's exit handler:", len(in_step), flush=True)

atexit.register(report)
from brisklm import LLM, SamplingParams

llm = LLM.from_pretrained(sys.argv[1], device="cpu", max_seq_len=512, show_progress=False)
step = llm.engine.step

def slow_step():  # a step that takes a while, as a long prefill does
    in_step.append(1)
    time.sleep(0.4)
    try:
        return step()
    finally:
        in_step.pop()

llm.engine.step = slow_step
params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
threading.Thread(target=lambda: llm.generate(["a b c"] * 4, params), daemon=True).start()
time.sleep(0.2)

def interrupt_the_exit():  # registered after brisklm's handler, so it runs before it
    main = threading.main_thread().ident
    threading.Timer(0.1, lambda: signal.pthread_kill(main, signal.SIGINT)).start()

atexit.register(interrupt_the_exit)
print("leaving", flush=True)
"""


def test_a_ctrl_c_during_exit_does_not_cut_the_wait_for_the_engine_thread(tiny_dir, tmp_path):
    # Ctrl-C pressed again while the process exits interrupted the exit handler's join: the engine
    # thread was still in its step at teardown, and the process aborted (exit status 134, one run
    # in three with the bundled model and a long prefill).
    done = run_script(tmp_path, INTERRUPTED_EXIT_SCRIPT, str(tiny_dir))
    assert done.stdout.splitlines()[-2:] == [
        "leaving",
        "engine steps in progress after brisklm's exit handler: 0",
    ]
    assert "terminate called" not in done.stderr


def test_a_closed_loop_is_not_closed_again_at_exit(tiny_dir):
    from brisklm.engine import loop as loop_module

    llm = LLM.from_pretrained(tiny_dir, device="cpu", max_seq_len=64, show_progress=False)
    assert llm._loop in loop_module._open_loops
    llm.close()
    assert llm._loop not in loop_module._open_loops


@pytest.mark.parametrize("call", ["generate", "stream"])
def test_an_interrupt_without_a_signal_stops_a_waiting_call(tiny_dir, call):
    # _thread.interrupt_main() (a watchdog, a notebook's stop button) sets no signal: a blocking
    # queue get never woke for it, so generate noticed it only once the whole output was done.
    import _thread

    # A step a call: several a call ran the tiny model's 3,000 tokens before the interrupt.
    params = SamplingParams(temperature=0.0, max_tokens=3_000, ignore_eos=True)
    with LLM.from_pretrained(
        tiny_dir, max_seq_len=4_096, show_progress=False, max_decode_steps=1
    ) as llm:
        request = llm.make_request("Hello", params)
        stop = threading.Event()

        def interrupt_once_decoding() -> None:
            # Once the request decodes (a fixed delay lost the race on an idle machine, where
            # the tiny model ran all 3,000 tokens in under 0.2 s).
            while not stop.is_set() and len(request.output_token_ids) < 2:
                time.sleep(0.0005)
            if not stop.is_set():
                _thread.interrupt_main()

        watcher = threading.Thread(target=interrupt_once_decoding, daemon=True)
        watcher.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                if call == "generate":
                    llm.run_requests([request])
                else:
                    for _ in llm.stream_request(request):
                        pass
        finally:
            stop.set()
            watcher.join()
        # The abort is the engine thread's to carry out, before the next request's steps.
        after = llm.generate("Hello", SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(after.token_ids) == 4
        assert request.finish_reason == "abort"
        assert len(request.output_token_ids) < params.max_tokens


FORK_SCRIPT = """
import os, sys, time
from brisklm import LLM, SamplingParams

params = SamplingParams(max_tokens=4, temperature=0.0)
# A step a call: the stream below must still be running at the fork (several steps a call ran its
# 100 tiny-model tokens before it; a step a call, 100 of them, ~20 ms, did once in a busy run).
llm = LLM.from_pretrained(
    sys.argv[1], device="cpu", max_seq_len=512, show_progress=False, max_decode_steps=1
)
expected = llm.generate("a b c", params).token_ids  # the engine thread is alive at the fork
long = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)
in_flight = llm.stream("a b c", long)
next(in_flight)
pid = os.fork()
if pid == 0:
    try:
        list(in_flight)  # what was delivered before the fork, then nothing more will come
        print("child: the stream ended", flush=True)
    except RuntimeError as error:
        print("child: in flight:", error, flush=True)
    try:
        llm.generate("a b c", params)
        print("child: the parent's LLM served", flush=True)
    except RuntimeError as error:
        print("child:", error, flush=True)
    started = time.monotonic()
    llm.close()
    # (A hang guard, far from any load's noise: close, and the exit below, waited 10 s for the
    # parent's engine thread.)
    print("child: close took under 5 s", time.monotonic() - started < 5.0, flush=True)
    own = LLM.from_pretrained(sys.argv[1], device="cpu", max_seq_len=128, show_progress=False)
    print("child: own LLM", own.generate("a b c", params).token_ids == expected, flush=True)
    print("child: exiting at", time.time(), flush=True)
    sys.exit(0)  # interpreter exit: brisklm's exit handler waits for no parent thread
_, status = os.waitpid(pid, 0)
print("parent: child exit", os.waitstatus_to_exitcode(status), time.time(), flush=True)
print("parent: still serving", llm.generate("a b c", params).token_ids == expected, flush=True)
print("parent: its stream went on", len("".join(in_flight)) > 0, flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_a_clear_error_and_may_make_its_own_llm(tiny_dir, tmp_path):
    # A forked child inherited the loop but not its engine thread: its requests waited forever
    # (and its exit waited 10 s for the parent's thread).
    done = run_script(tmp_path, FORK_SCRIPT, str(tiny_dir))
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("child: this LLM was made in process") and "forked from it" in line
        for line in lines
    ), lines
    assert any(line.startswith("child: in flight: this call was made in process") for line in lines)
    for line in (
        "parent: its stream went on True",
        "child: own LLM True",
        "child: close took under 5 s True",
        "parent: still serving True",
    ):
        assert line in lines, lines
    # The child's exit: from its last line to the parent's wait returning (it waited 10 s).
    exiting = next(float(line.split()[-1]) for line in lines if line.startswith("child: exiting"))
    code, exited = next(
        line.split()[-2:] for line in lines if line.startswith("parent: child exit")
    )
    assert code == "0" and float(exited) - exiting < 5.0, lines


AFTER_MAIN_SCRIPT = """
import asyncio, sys, threading
from brisklm import LLM, SamplingParams

llm = LLM.from_pretrained(sys.argv[1], device="cpu", max_seq_len=128, show_progress=False)
params = SamplingParams(max_tokens=8, json_object=True, temperature=0.0)
expected = llm.generate("a b c", params).text

def later():
    main = threading.main_thread()
    main.join()  # the main thread has ended: Python's exit hook has shut thread pools down
    text = llm.generate("a b c", params).text
    print("after main:", text == expected, flush=True)
    # asyncio's default executor refuses work then too (the prompt is prepared off the loop)
    text = asyncio.run(llm.agenerate("a b c", params)).text
    print("after main, async:", text == expected, flush=True)

threading.Thread(target=later).start()  # not a daemon: the interpreter waits for it
"""


def test_constrained_requests_after_the_main_thread_ended(tiny_dir, tmp_path):
    # The grammar masks' thread pool refuses work once the main thread has ended ("cannot
    # schedule new futures after interpreter shutdown"): every constrained request of a
    # non-daemon thread then failed.
    done = run_script(tmp_path, AFTER_MAIN_SCRIPT, str(tiny_dir))
    assert done.stdout.splitlines() == ["after main: True", "after main, async: True"], (
        done.stdout,
        done.stderr[-2000:],
    )
    assert "Traceback" not in done.stderr
