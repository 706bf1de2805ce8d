"""Decode passes replayed from CUDA graphs (brisklm.engine.decode_graphs).

On the CPU the static pass that the graphs capture runs eagerly (``capture=False``) inside a real
engine: padding to a graph's batch size, key buckets crossed mid-generation, seeded batches kept
off it. On a CUDA device (``gpu`` marker) the captured graphs themselves, against eager passes.
"""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.engine.decode_graphs import DecodeGraphs, graph_batch_sizes, key_buckets
from brisklm.engine.llm_engine import EngineConfig
from tests.engine.test_cuda import cuda_llm
from tests.engine.test_generate import GREEDY, PROMPTS


def test_graph_batch_sizes_and_key_buckets():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(6) == [1, 2, 4, 6]
    assert key_buckets(64) == [64]
    assert key_buckets(256) == [256]
    assert key_buckets(600) == [256, 512, 600]
    assert key_buckets(4096) == [256, 512, 1024, 2048, 4096]


def test_cuda_graphs_must_be_a_bool(tiny_dir):
    with pytest.raises(ValueError, match="cuda_graphs must be True or False, got 'yes'"):
        EngineConfig(cuda_graphs="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cuda_graphs must be True or False"):
        LLM.from_pretrained(tiny_dir, device="cpu", cuda_graphs=1, show_progress=False)


def test_no_graphs_on_cpu(llm):
    assert llm.engine.runner.graphs is None


def static_pass_llm(tiny_dir, max_seq_len: int, **options) -> LLM:
    """An LLM on the CPU whose decode passes run the graphs' static pass eagerly."""
    llm = LLM.from_pretrained(
        tiny_dir,
        device="cpu",
        max_batch_size=4,
        max_seq_len=max_seq_len,
        show_progress=False,
        **options,
    )
    runner = llm.engine.runner
    runner.graphs = DecodeGraphs(llm.engine.model, runner.kv_cache, 4, max_seq_len, capture=False)
    return llm


def test_static_pass_crosses_key_buckets_in_padded_batches(tiny_dir):
    """Three prompts of 240-250 tokens decode past position 256 (from the 256-key bucket into
    the 512 one) in a batch padded to four, then two and one as requests finish: the tokens of a
    plain engine."""
    plain = LLM.from_pretrained(
        tiny_dir, device="cpu", max_batch_size=4, max_seq_len=600, show_progress=False
    )
    graphed = static_pass_llm(tiny_dir, 600)
    try:
        prompts = [[5 + (i * 7 + row) % 300 for i in range(240 + 5 * row)] for row in range(3)]
        params = [
            SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (30, 12, 22)
        ]
        expected = [o.token_ids for o in plain.generate(prompts, params)]
        assert [o.token_ids for o in graphed.generate(prompts, params)] == expected
        passes = graphed.engine.runner.graphs._passes  # type: ignore[union-attr]
        assert {(4, 256), (4, 512), (2, 512), (1, 512)} <= set(passes)
    finally:
        plain.close()
        graphed.close()


def test_seeded_batches_and_prompts_do_not_take_the_static_pass(tiny_dir, llm):
    # Without prefix caching: the prompts again would enter as one-token rows (all but their last
    # token reused), which a decode pass takes.
    graphed = static_pass_llm(tiny_dir, 128, prefix_caching=False)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None
    calls: list[int] = []
    forward = graphs.forward
    graphs.forward = lambda *args: calls.append(len(args[0])) or forward(*args)  # type: ignore[method-assign]
    try:
        seeded = SamplingParams(temperature=0.9, max_tokens=8, seed=3)
        first = graphed.generate(PROMPTS, seeded)
        assert calls == []  # a seeded request keeps its batch on the ordinary path
        assert [o.token_ids for o in first] == [o.token_ids for o in llm.generate(PROMPTS, seeded)]
        got = [o.token_ids for o in graphed.generate(PROMPTS, GREEDY)]
        assert calls and all(n <= len(PROMPTS) for n in calls)
        assert len(calls) == GREEDY.max_tokens - 1  # decode steps only, prefill not
        assert got == [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        graphed.close()


@pytest.mark.gpu
def test_cuda_graphs_give_the_eager_tokens(tiny_dir):
    """Captured graphs replayed for every decode step (batches of 4, then of 3, 2 and 1 as
    requests finish; prompts crossing a key bucket) give the eager engine's tokens in float32."""
    eager = cuda_llm(tiny_dir, 600, dtype="float32", cuda_graphs=False)
    graphed = cuda_llm(tiny_dir, 600, dtype="float32")
    try:
        assert eager.engine.runner.graphs is None
        graphs = graphed.engine.runner.graphs
        assert graphs is not None and graphs.capture
        prompts = [[5 + (i * 7 + row) % 300 for i in range(240 + 5 * row)] for row in range(4)]
        lengths = [30, 20, 10, 26]
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        got = [o.token_ids for o in graphed.generate(prompts, params)]
        assert got == [o.token_ids for o in eager.generate(prompts, params)]
        assert all(graph is not None for _, graph in graphs._passes.values())
        assert {(4, 256), (4, 512), (1, 512)} <= set(graphs._passes)
        # Replays of graphs captured before give the same again.
        assert [o.token_ids for o in graphed.generate(prompts, params)] == got
        streamed = "".join(graphed.stream(PROMPTS[0], GREEDY))
        assert streamed == eager.generate([PROMPTS[0]], GREEDY)[0].text
    finally:
        eager.close()
        graphed.close()


@pytest.mark.gpu
def test_cuda_graphs_in_bfloat16_stay_near_eager_logits(tiny_dir):
    """bfloat16 (CUDA's default): a graph's decode logits against the eager pass's, relative to
    their scale (masked keys up to a bucket sum in another order than the exact-length call)."""
    from brisklm.engine.model_runner import ForwardBatch, ModelRunner
    from brisklm.loader import load_model

    model = load_model(tiny_dir, device="cuda", dtype="bfloat16", show_progress=False)
    graphed = ModelRunner(model, num_slots=2, max_seq_len=300)
    eager = ModelRunner(model, num_slots=2, max_seq_len=300, cuda_graphs=False)
    prompt = list(range(5, 60))
    for runner in (graphed, eager):
        runner.forward(ForwardBatch([0, 1], [0, 0], [prompt, prompt[:20]], [1, 1]))
    tokens = [[7], [9]]
    for step in range(12):
        starts = [len(prompt) + step, 20 + step]
        batch = ForwardBatch([0, 1], starts, tokens, [1, 1])
        ours, theirs = graphed.forward(batch), eager.forward(batch)
        scale = theirs.abs().max().item()
        assert (ours - theirs).abs().max().item() <= 0.05 * scale, f"step {step}"
        tokens = [[int(t)] for t in theirs.argmax(-1)]
    assert graphed.graphs is not None and graphed.graphs._passes


@pytest.mark.gpu
def test_cuda_graphs_under_speculative_decoding(tiny_dir):
    """The draft's decode passes replay graphs too; greedy output stays the target's own."""
    plain = cuda_llm(tiny_dir, 600, dtype="float32", cuda_graphs=False)
    speculative = cuda_llm(tiny_dir, 600, dtype="float32", draft=str(tiny_dir))
    try:
        expected = [o.token_ids for o in plain.generate(PROMPTS, GREEDY)]
        assert [o.token_ids for o in speculative.generate(PROMPTS, GREEDY)] == expected
        draft_runner = speculative.engine.speculator.proposer.runner  # type: ignore[union-attr]
        assert draft_runner.graphs is not None and draft_runner.graphs._passes
    finally:
        plain.close()
        speculative.close()


@pytest.mark.gpu
def test_cuda_graphs_replay_gptq_int4_layers(tmp_path):
    """A GPTQ checkpoint's Triton int4 products captured in the graphs: the eager pass's greedy
    tokens and logits (float32 activations) at every decode step of a batch of two."""
    from brisklm.engine.model_runner import ForwardBatch, ModelRunner
    from brisklm.loader import load_model
    from brisklm.quant import linear_factory_for
    from tests.hf_models import build_hf_model
    from tests.quant.gptq_checkpoints import write_gptq_checkpoint

    directory = write_gptq_checkpoint(build_hf_model("llama"), tmp_path / "gptq", group_size=32)
    factory = linear_factory_for(directory, device=torch.device("cuda"))
    model = load_model(
        directory, device="cuda", dtype="float32", make_linear=factory, show_progress=False
    )
    graphed = ModelRunner(model, num_slots=2, max_seq_len=64)
    eager = ModelRunner(model, num_slots=2, max_seq_len=64, cuda_graphs=False)
    assert graphed.graphs is not None and eager.graphs is None
    prompts = [[1, 17, 93, 5, 44], [1, 120, 8]]
    for runner in (graphed, eager):
        runner.forward(ForwardBatch([0, 1], [0, 0], prompts, [1, 1]))
    tokens = [[7], [9]]
    for step in range(16):
        batch = ForwardBatch([0, 1], [5 + step, 3 + step], tokens, [1, 1])
        ours, theirs = graphed.forward(batch), eager.forward(batch)
        assert (ours - theirs).abs().max().item() <= 1e-3 * theirs.abs().max().item()
        assert ours.argmax(-1).tolist() == theirs.argmax(-1).tolist()
        tokens = [[int(t)] for t in theirs.argmax(-1)]
    assert graphed.graphs._passes


def test_a_failed_capture_leaves_its_shape_to_run_eagerly(tiny_dir, llm, monkeypatch, caplog):
    """A capture that raises (out of memory mid-serving, say) is logged once, and that shape's
    steps run the same pass eagerly instead of failing their requests."""
    graphed = LLM.from_pretrained(
        tiny_dir, device="cpu", max_batch_size=4, max_seq_len=128, show_progress=False
    )
    runner = graphed.engine.runner
    graphs = DecodeGraphs(graphed.engine.model, runner.kv_cache, 4, 128, capture=True)
    attempts: list[int] = []

    def failing_capture(static):
        attempts.append(1)
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(graphs, "_capture", failing_capture)
    runner.graphs = graphs
    try:
        with caplog.at_level("WARNING", logger="brisklm.engine.decode_graphs"):
            got = [o.token_ids for o in graphed.generate(PROMPTS, GREEDY)]
        assert got == [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert attempts == [1]  # one shape (4 rows, 128 keys), tried once
        assert graphs._passes[(4, 128)][1] is None
        assert "runs eagerly" in caplog.text and "simulated" in caplog.text
    finally:
        graphed.close()
