"""Speculative fixtures: a tiny target checkpoint, a smaller disagreeing draft with the same tokenizer."""

from __future__ import annotations

import pytest
import torch

from brisklm.loader import load_model
from brisklm.models.layers import strided_dense_linear
from brisklm.tokenizer import Tokenizer
from tests.tiny import make_tiny_checkpoint


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("spec-target"), seed=0)


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("spec-draft"), seed=1, num_hidden_layers=1, hidden_size=32
    )


@pytest.fixture(scope="session")
def target_model(target_dir):
    return load_model(target_dir, device="cpu", dtype="float32", show_progress=False)


@pytest.fixture(scope="session")
def draft_model(draft_dir):
    return load_model(draft_dir, device="cpu", dtype="float32", show_progress=False)


@pytest.fixture(scope="session")
def tokenizer(target_dir):
    return Tokenizer.from_pretrained(target_dir)


@pytest.fixture(scope="session")
def prompts(tokenizer):
    texts = ["The quick brown fox", "def add(a, b):", 'Hello world! {"name": "Ada"']
    return [tokenizer.encode(t) for t in texts]


@pytest.fixture(scope="session")
def close_draft_model(target_dir):
    """The target with 10% noise on every weight: agrees often, not always."""
    # Strided layers: the noise is added in place, which packed CPU weights do not allow.
    model = load_model(
        target_dir,
        device="cpu",
        dtype="float32",
        make_linear=strided_dense_linear,
        show_progress=False,
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.1)
    return model
