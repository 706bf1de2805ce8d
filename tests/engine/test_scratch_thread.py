"""call_in_scratch_thread: the result or exception comes back; the thread is gone afterwards, also
when the caller is interrupted (Ctrl-C while a model loads)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from brisklm.engine.scratch_thread import (
    ScratchWorkCancelled,
    call_in_scratch_thread,
    raise_if_cancelled,
)
from tests.tiny import make_tiny_checkpoint


def test_returns_the_result_computed_in_another_thread():
    caller = threading.get_ident()
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return threading.get_ident()

    assert call_in_scratch_thread(work) != caller
    assert seen[0].name == "brisklm-setup"
    assert not seen[0].is_alive()


def test_reraises_the_exception_itself():
    class LoadError(ValueError):
        pass

    error = LoadError("bad checkpoint: model.safetensors")

    def fail() -> None:
        raise error

    with pytest.raises(LoadError) as info:
        call_in_scratch_thread(fail)
    assert info.value is error


def _interrupt_main_thread() -> None:
    """What Ctrl-C does: SIGINT to the main thread, which Python turns into KeyboardInterrupt."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _steps_until_cancelled(steps: list[int], exited: threading.Event, started: threading.Event):
    def work() -> str:
        try:
            for step in range(500):
                if step == 3:
                    started.set()
                raise_if_cancelled()
                steps.append(step)
                time.sleep(0.01)
            return "finished"
        finally:
            exited.set()

    return work


def test_an_interrupted_caller_stops_the_work_and_waits_for_it_to_end():
    # Python 3.11's thread.join(), interrupted, marks the thread stopped while it still runs: a
    # daemon thread left in native code at interpreter exit aborted the process (exit 134).
    steps: list[int] = []
    exited, started = threading.Event(), threading.Event()
    work = _steps_until_cancelled(steps, exited, started)
    threading.Thread(target=lambda: (started.wait(), _interrupt_main_thread())).start()
    with pytest.raises(KeyboardInterrupt):
        call_in_scratch_thread(work, name="brisklm-interrupted")
    assert exited.is_set(), "the call returned while its work still ran"
    assert 3 <= len(steps) < 500, "the work did not stop at its cancellation point"
    assert "brisklm-interrupted" not in [t.name for t in threading.enumerate() if t.is_alive()]


def test_a_second_interrupt_while_the_work_winds_down_is_not_fatal():
    exited = threading.Event()
    cancelled = threading.Event()

    def work() -> None:
        try:
            time.sleep(0.05)  # the caller waits by then
            _interrupt_main_thread()
            while not cancelled.is_set():
                try:
                    raise_if_cancelled()
                except ScratchWorkCancelled:
                    cancelled.set()
                time.sleep(0.005)
            _interrupt_main_thread()  # pressed again while the step ends
            time.sleep(0.2)
        finally:
            exited.set()

    with pytest.raises(KeyboardInterrupt):
        call_in_scratch_thread(work)
    assert exited.is_set()


def test_cancellation_points_do_nothing_outside_a_scratch_thread_or_before_an_interrupt():
    raise_if_cancelled()
    assert call_in_scratch_thread(lambda: raise_if_cancelled() or "ran") == "ran"


def test_loading_a_model_stops_between_tensors_when_interrupted(tmp_path, monkeypatch):
    from brisklm import loader

    directory = make_tiny_checkpoint(tmp_path / "model")
    points: list[int] = []

    def counted() -> None:
        points.append(1)
        if len(points) == 2:
            _interrupt_main_thread()
            time.sleep(0.2)  # the main thread gets the signal and cancels
        raise_if_cancelled()

    monkeypatch.setattr(loader, "raise_if_cancelled", counted)
    with pytest.raises(KeyboardInterrupt):
        call_in_scratch_thread(lambda: loader.load_model(directory, show_progress=False))
    assert len(points) == 2, f"loading went on past its interruption ({len(points)} points)"
