"""Shared engines: each loads once, models load side by side, and async calls load off the loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from langchain_brisklm import BriskLLM, ChatBrisk, _engines
from tests.integrations.langchain.conftest import TINY_ENGINE
from tests.scripts import run_script

WAIT = 30  # seconds a blocked load waits before the test gives up on it (a failure, not a timing)


class BlockingLoads:
    """Stands in for LLM.from_pretrained: records loads and holds each until `release` is set."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.release = threading.Event()
        self.started = threading.Event()
        self.loads: list[int | None] = []
        self.timed_out = False
        self._lock = threading.Lock()

    def __call__(self, path: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.loads.append(kwargs["max_seq_len"])
        self.started.set()
        if not self.release.wait(WAIT):
            self.timed_out = True
        return self.original(path, **kwargs)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> BlockingLoads:
    blocking = BlockingLoads(_engines.LLM.from_pretrained)
    monkeypatch.setattr(_engines.LLM, "from_pretrained", blocking)
    return blocking


def settings(max_seq_len: int) -> dict[str, Any]:
    # A max_seq_len no other test uses: an engine of its own, loaded here.
    return {**TINY_ENGINE, "max_seq_len": max_seq_len}


def test_an_async_first_call_loads_off_the_event_loop(
    tiny_chat_dir: Path, loads: BlockingLoads
) -> None:
    # The load ran on the event loop, so nothing else could run until it ended.
    chat = ChatBrisk(model=str(tiny_chat_dir), max_tokens=2, **settings(1001))
    llm = BriskLLM(model=str(tiny_chat_dir), max_tokens=2, **settings(1002))

    async def other_task() -> None:
        await asyncio.to_thread(loads.started.wait, WAIT)
        loads.release.set()  # runs only if the loop is free while the load waits

    async def main() -> list[Any]:
        return await asyncio.gather(chat.ainvoke("Hi"), other_task(), llm.ainvoke("Hi"))

    reply, _, text = asyncio.run(main())
    assert not loads.timed_out
    assert reply.content is not None and isinstance(text, str)
    assert sorted(loads.loads) == [1001, 1002]


def test_models_load_side_by_side_and_each_once(tiny_chat_dir: Path, loads: BlockingLoads) -> None:
    # One lock was held across every load: a second model waited for the first to load.
    first = [ChatBrisk(model=str(tiny_chat_dir), **settings(1003)) for _ in range(3)]
    second = ChatBrisk(model=str(tiny_chat_dir), **settings(1004))
    engines: dict[int, Any] = {}

    def load(index: int, chat: ChatBrisk) -> None:
        engines[index] = chat._engine()

    threads = [threading.Thread(target=load, args=(i, c)) for i, c in enumerate(first)]
    for thread in threads:
        thread.start()
    loads.started.wait(WAIT)
    # The first model is loading (held); the second starts its own load meanwhile.
    second_loaded = threading.Thread(target=load, args=(3, second))
    second_loaded.start()
    while len(loads.loads) < 2 and not loads.timed_out:
        threading.Event().wait(0.01)
    loads.release.set()
    for thread in [*threads, second_loaded]:
        thread.join(WAIT)
    assert not loads.timed_out
    assert sorted(loads.loads) == [1003, 1004]  # three callers, one load
    assert len({id(engines[i]) for i in range(3)}) == 1 and engines[3] is not engines[0]


FORKED_WORKER_SCRIPT = """
import os, sys
from langchain_brisklm import ChatBrisk, _engines

chat = ChatBrisk(model=sys.argv[1], device="cpu", max_seq_len=256, max_tokens=3, temperature=0)
expected = chat.invoke("Hi").content  # the parent's shared engine, its thread alive at the fork
pid = os.fork()
if pid == 0:
    print("child: registry empty", not _engines._engines, flush=True)
    print("child: reply", chat.invoke("Hi").content == expected, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("parent: child exit", os.waitstatus_to_exitcode(status), flush=True)
print("parent: reply", chat.invoke("Hi").content == expected, flush=True)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_worker_loads_its_own_engine(tiny_chat_dir: Path, tmp_path: Path) -> None:
    # A preforking server's worker used the parent's engine, whose thread it does not have: its
    # calls now load an engine of its own.
    done = run_script(tmp_path, FORKED_WORKER_SCRIPT, str(tiny_chat_dir))
    assert done.stdout.splitlines() == [
        "child: registry empty True",
        "child: reply True",
        "parent: child exit 0",
        "parent: reply True",
    ], (done.stdout, done.stderr[-2000:])


AFTER_MAIN_SCRIPT = """
import sys, threading
from langchain_brisklm import ChatBrisk

chat = ChatBrisk(model=sys.argv[1], device="cpu", max_seq_len=256, max_tokens=3, temperature=0)
expected = [m.content for m in chat.batch(["Hi", "Yo"])]

def later():
    threading.main_thread().join()  # Python's exit hook has shut thread pools down
    print("after main:", [m.content for m in chat.batch(["Hi", "Yo"])] == expected, flush=True)

threading.Thread(target=later).start()  # not a daemon: the interpreter waits for it
"""


def test_a_batch_after_the_main_thread_ended(tiny_chat_dir: Path, tmp_path: Path) -> None:
    # batch ran its calls on a thread pool's thread, which Python refuses to start once the main
    # thread has ended ("cannot schedule new futures after interpreter shutdown").
    done = run_script(tmp_path, AFTER_MAIN_SCRIPT, str(tiny_chat_dir))
    assert done.stdout.splitlines() == ["after main: True"], (done.stdout, done.stderr[-2000:])
