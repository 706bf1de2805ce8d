"""Fixtures for the LangChain adapter: one tiny chat checkpoint and its engine, shared by every test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from langchain_brisklm import ChatBrisk, close_engines
from tests.integrations.langchain.bundled import BUNDLED_MODEL_REASON, bundled_model_available
from tests.integrations.langchain.tiny_chat import make_tiny_chat_checkpoint

# Engine limits of every tiny-model test (one shared engine: same model, device, dtype and limits).
TINY_ENGINE = {"device": "cpu", "max_batch_size": 4, "max_seq_len": 1536}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if bundled_model_available():
        return
    skip = pytest.mark.skip(reason=BUNDLED_MODEL_REASON)
    for item in items:
        if "bundled_model" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_chat_checkpoint(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="session", autouse=True)
def _close_shared_engines() -> Iterator[None]:
    yield
    close_engines()


@pytest.fixture
def chat(tiny_chat_dir: Path) -> ChatBrisk:
    """Greedy ChatBrisk on the tiny random model (engine loaded once per session)."""
    return ChatBrisk(model=str(tiny_chat_dir), temperature=0, max_tokens=96, **TINY_ENGINE)
