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


@pytest.fixture
def torch_ops_only(monkeypatch) -> None:
    """The sampler through torch's ops alone, as where the native kernels do not run (CUDA, or a
    CPU where they do not build): ``sample`` and ``processed_probs`` find no native pass."""
    from brisklm.sampling import sampler

    monkeypatch.setattr(sampler, "_native_sampler", lambda x, md: None)


@pytest.fixture(params=["native pass", "torch ops"])
def either_sampler_path(request) -> str:
    """Each test that asks for this runs twice: through the native pass where it builds, and
    through torch's ops (``torch_ops_only``)."""
    if request.param == "torch ops":
        request.getfixturevalue("torch_ops_only")
    return request.param
