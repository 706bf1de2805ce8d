"""call_in_scratch_thread: the result or exception comes back; the thread is gone afterwards."""

from __future__ import annotations

import threading

import pytest

from brisklm.engine.scratch_thread import call_in_scratch_thread


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
