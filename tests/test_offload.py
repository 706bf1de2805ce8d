"""run_off_loop: blocking work awaited from a coroutine, also once interpreter shutdown began."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from brisklm.offload import run_off_loop

VARIABLE: contextvars.ContextVar[str] = contextvars.ContextVar("variable", default="unset")


def test_the_function_runs_once_with_the_callers_context() -> None:
    calls = []

    def work(x: int) -> tuple[int, str]:
        calls.append(x)
        return x * 2, VARIABLE.get()

    async def main() -> tuple[int, str]:
        VARIABLE.set("set by the caller")
        return await run_off_loop(work, 21)

    assert asyncio.run(main()) == (42, "set by the caller") and calls == [21]


def test_its_own_runtime_error_is_raised_once_not_taken_for_a_refusal() -> None:
    # The fallback for an executor that refuses work caught the function's own RuntimeError
    # (one mentioning interpreter shutdown) and ran it a second time.
    calls = []

    def work() -> None:
        calls.append(1)
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    with pytest.raises(RuntimeError, match="interpreter shutdown"):
        asyncio.run(run_off_loop(work))
    assert calls == [1]


def test_a_refusing_executor_runs_it_on_a_plain_thread() -> None:
    from concurrent.futures import ThreadPoolExecutor

    class Refusing(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    async def main() -> str:
        asyncio.get_running_loop().set_default_executor(Refusing(max_workers=1))
        VARIABLE.set("carried")
        return await run_off_loop(VARIABLE.get)

    assert asyncio.run(main()) == "carried"
