"""A KV cache whose dtype is not the model's (kv_cache_dtype, and the half-precision cache a
bfloat16 or float16 CPU model keeps): every path writes and reads it, the choice is checked, and
the draft model's cache follows it."""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.loader import load_model
from brisklm.models.native_forward import MAX_QUERY_LEN
from tests.hf_models import build_hf_model, save_hf_model
from tests.tiny import train_tokenizer

CACHE = 3 * MAX_QUERY_LEN


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    path = save_hf_model(build_hf_model("llama"), tmp_path_factory.mktemp("m"))
    train_tokenizer().save(str(path / "tokenizer.json"))
    return path


@pytest.mark.parametrize(
    "dtype,cache_dtype,backend",
    [
        ("float32", torch.bfloat16, "auto"),
        ("float32", torch.float16, "auto"),
        ("bfloat16", None, "auto"),  # the model's own half cache
        ("float32", torch.bfloat16, "reference"),  # torch's ops for every row
    ],
)
def test_a_batch_of_long_rows_writes_a_cache_of_another_dtype(
    directory, dtype, cache_dtype, backend
):
    """Rows longer than the native pass takes run through torch's ops as one batch, whose cache
    writes are a scatter (index_put, which does not convert dtypes: it raised for a half cache
    before session 36); each row's logits match the row run alone."""
    model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
    if cache_dtype is not None:
        model.kv_cache_dtype = cache_dtype
    generator = torch.Generator().manual_seed(2)
    rows = [
        torch.randint(3, 150, (n,), generator=generator).tolist()
        for n in (MAX_QUERY_LEN + 3, MAX_QUERY_LEN + 9)
    ]
    together = ModelRunner(model, 2, CACHE, backend)
    assert together.kv_cache.keys.dtype == (cache_dtype or getattr(torch, dtype))
    batched = together.forward(ForwardBatch([0, 1], [0, 0], rows, [2, 2]))
    for index, row in enumerate(rows):
        alone = ModelRunner(model, 1, CACHE, backend).forward(ForwardBatch([0], [0], [row], [2]))
        got = batched[2 * index : 2 * index + 2]
        scale = alone.abs().max().item()
        assert (got - alone).abs().max().item() <= 1e-3 * scale, index


def test_kv_cache_dtype_auto_is_the_models_and_a_long_batch_generates(directory):
    llm = LLM.from_pretrained(
        directory, dtype="bfloat16", kv_cache_dtype="auto", show_progress=False, max_seq_len=CACHE
    )
    try:
        assert llm.engine.runner.kv_cache.keys.dtype == torch.bfloat16
        params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
        prompts = [[3 + i % 150 for i in range(MAX_QUERY_LEN + n)] for n in (2, 7)]
        outputs = llm.generate(prompts, params)
        assert [len(o.token_ids) for o in outputs] == [3, 3]
    finally:
        llm.close()


@pytest.mark.parametrize("bad", [["bfloat16"], "fp8", torch.int8])
def test_a_bad_kv_cache_dtype_is_named(directory, bad):
    with pytest.raises(
        ValueError, match=r"kv_cache_dtype: unsupported dtype .*; supported: float32"
    ):
        LLM.from_pretrained(directory, kv_cache_dtype=bad, show_progress=False)


def test_the_draft_models_cache_takes_kv_cache_dtype(directory):
    llm = LLM.from_pretrained(
        directory,
        draft=str(directory),
        num_speculative_tokens=3,
        kv_cache_dtype="bfloat16",
        show_progress=False,
        max_seq_len=CACHE,
    )
    try:
        assert llm.engine.runner.kv_cache.keys.dtype == torch.bfloat16
        assert llm.engine.speculator.proposer.runner.kv_cache.values.dtype == torch.bfloat16
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        assert len(llm.generate([[1, 5, 9]], params)[0].token_ids) == 6
    finally:
        llm.close()
