"""Engine fixtures: a tiny checkpoint, an LLM the tests share, and both CPU kernel paths."""

from __future__ import annotations

import pytest

from brisklm import LLM
from brisklm.kernels import native
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


@pytest.fixture(params=["native", "torch"])
def kernels(request, monkeypatch):
    """Both CPU paths: the native kernels (where they build) and torch's ops (oneDNN-packed)."""
    if request.param == "native" and not native.available():
        pytest.skip("the native CPU kernels do not build here")
    if request.param == "torch":
        monkeypatch.setenv(native.ENV_SWITCH, "0")
    native.library.cache_clear()
    yield request.param
    monkeypatch.undo()
    native.library.cache_clear()
