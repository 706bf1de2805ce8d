"""Fixtures for the sampling tests: build SamplingMetadata from params with little ceremony."""

from collections.abc import Callable, Sequence

import pytest
import torch

from brisklm.sampling import SamplingMetadata, SamplingParams, make_generator

BuildMetadata = Callable[..., SamplingMetadata]


@pytest.fixture
def build_md() -> BuildMetadata:
    """build_md(params, vocab_size, prompts=None, outputs=None, eos=(), generators=None)."""

    def build(
        params: Sequence[SamplingParams],
        vocab_size: int,
        prompts: Sequence[Sequence[int]] | None = None,
        outputs: Sequence[Sequence[int]] | None = None,
        eos: Sequence[int] = (),
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> SamplingMetadata:
        batch_size = len(params)
        if generators is None:
            generators = [make_generator(p, "cpu") for p in params]
        return SamplingMetadata.build(
            params,
            prompts if prompts is not None else [[] for _ in range(batch_size)],
            outputs if outputs is not None else [[] for _ in range(batch_size)],
            generators,
            vocab_size,
            "cpu",
            eos_token_ids=eos,
        )

    return build
