"""Engine fixtures: one tiny checkpoint and one loaded LLM shared by the module's tests."""

from __future__ import annotations

import pytest

from brisklm import LLM
from tests.tiny import make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def llm(tiny_dir):
    model = LLM.from_pretrained(
        tiny_dir, device="cpu", max_batch_size=4, max_seq_len=128, show_progress=False
    )
    yield model
    model.close()
