"""The engine end to end on a CUDA device (skipped without one): the same tokens as on the CPU in
float32, and bfloat16 (CUDA's default dtype) generating, streaming and seeding there."""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from tests.engine.test_generate import GREEDY, PROMPTS

pytestmark = pytest.mark.gpu


def cuda_llm(tiny_dir, max_seq_len: int = 128, **kwargs) -> LLM:
    return LLM.from_pretrained(
        tiny_dir,
        device="cuda",
        max_batch_size=4,
        max_seq_len=max_seq_len,
        show_progress=False,
        **kwargs,
    )


def test_float32_on_cuda_gives_the_cpu_tokens(tiny_dir, llm):
    gpu = cuda_llm(tiny_dir, dtype="float32")
    try:
        assert gpu.engine.device.type == "cuda"
        # One batch of ragged prompts on the GPU against the CPU engine's.
        got = [o.token_ids for o in gpu.generate(PROMPTS, GREEDY)]
        assert got == [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        streamed = "".join(gpu.stream(PROMPTS[0], GREEDY))
        assert streamed == llm.generate([PROMPTS[0]], GREEDY)[0].text
    finally:
        gpu.close()


def test_bfloat16_on_cuda_generates_and_seeds_reproducibly(tiny_dir):
    gpu = cuda_llm(tiny_dir)  # the default dtype on CUDA
    try:
        assert gpu.engine.model.model.embed_tokens.weight.dtype == torch.bfloat16
        outs = gpu.generate(PROMPTS, GREEDY)
        assert all(len(o.token_ids) == GREEDY.max_tokens for o in outs)
        assert all(o.finish_reason == "length" for o in outs)
        sampled = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=16, seed=7)
        first = gpu.generate(PROMPTS, sampled)
        # The same seed gives the same tokens, alone or beside other requests.
        again = gpu.generate([PROMPTS[2]], sampled)[0]
        assert again.token_ids == first[2].token_ids
    finally:
        gpu.close()


@pytest.mark.parametrize("backend", ["sdpa", "xformers"])
def test_chunked_prompts_beside_decoding_rows_give_the_cpu_tokens(tiny_dir, llm, backend):
    from brisklm.attention.xformers import probe_xformers

    if backend == "xformers":
        reason = probe_xformers(torch.device("cuda"))
        if reason is not None:
            pytest.skip(reason)
    # Chunks of 4 tokens: the longer prompts are fed over several passes while the shorter ones
    # already decode, so attention sees passes of one-token rows beside chunks.
    gpu = cuda_llm(tiny_dir, dtype="float32", prefill_chunk_size=4, attention_backend=backend)
    try:
        got = [o.token_ids for o in gpu.generate(PROMPTS, GREEDY)]
        assert got == [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        gpu.close()
