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
        reason = probe_xformers(torch.device("cuda"), torch.float32)
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_models_on_the_second_gpu_give_the_cpu_tokens(tiny_dir, llm, tmp_path):
    """cuda:1 after an engine on cuda:0 captured its graphs: the graphs capture on a stream of
    cuda:1 (torch's default capture stream belongs to the first device that captured: empty graphs
    replaying stale logits), and Triton's int4 kernel launches on cuda:1 (it launches on the current
    device, cuda:0)."""
    from tests.hf_models import build_hf_model
    from tests.quant.gptq_checkpoints import write_gptq_checkpoint

    expected = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    first = LLM.from_pretrained(tiny_dir, device="cuda:0", dtype="float32", show_progress=False)
    second = LLM.from_pretrained(tiny_dir, device="cuda:1", dtype="float32", show_progress=False)
    try:
        assert [o.token_ids for o in first.generate(PROMPTS, GREEDY)] == expected
        assert [o.token_ids for o in second.generate(PROMPTS, GREEDY)] == expected
        assert second.engine.runner.graphs is not None and second.engine.runner.graphs._passes
    finally:
        first.close()
        second.close()
    directory = write_gptq_checkpoint(build_hf_model("llama"), tmp_path / "gptq", group_size=32)
    prompts = [[1, 17, 93, 5, 44], [1, 120, 8]]
    outputs = []
    for device in ("cuda:0", "cuda:1"):  # the same Triton products, so the same tokens
        gptq = LLM.from_pretrained(directory, device=device, dtype="float32", show_progress=False)
        try:
            outputs.append([o.token_ids for o in gptq.generate(prompts, GREEDY)])
        finally:
            gptq.close()
    assert outputs[0] == outputs[1]
