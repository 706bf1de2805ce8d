"""End-to-end statistics on a vocabulary of 4: draft model + verification + rejection sampling give
exactly the target's distribution over the first generated tokens, with temperature, top-k and a
presence penalty that must see the proposals (a wrong variant is the negative control). The draft
also stops drafting after its eos (token 1), which must not bias anything either."""

from __future__ import annotations

import pytest
import torch

from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.loader import load_model
from brisklm.sampling import SamplingMetadata, SamplingParams, processed_probs
from brisklm.speculative import DraftModelProposer, verify
from tests.hf_models import build_hf_model, save_hf_model
from tests.speculative.loop import speculative_generate
from tests.speculative.test_rejection import Check

V = 4
NUM_ROWS = 8_000
PROMPT = [1, 2, 3]
# A strong presence penalty with top-k: at position j the target must count proposals 0..j-1.
PARAMS = SamplingParams(temperature=1.5, top_k=3, presence_penalty=2.0)
SMALL = {
    "vocab_size": V,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 16,
    "initializer_range": 0.3,
}


@pytest.fixture(scope="module")
def small_models(tmp_path_factory):
    models = []
    for seed in (0, 1):
        directory = tmp_path_factory.mktemp(f"small-{seed}")
        save_hf_model(build_hf_model("llama", seed=seed, **SMALL), directory)
        models.append(load_model(directory, device="cpu", dtype="float32", show_progress=False))
    return models


@torch.inference_mode()
def _exact_laws(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's own p(t1) (V,) and p(t2 | t1) (V, V), processed like plain decoding."""
    runner = ModelRunner(model, V + 1, 8)
    contexts = [PROMPT] + [PROMPT + [t] for t in range(V)]
    outputs = [[]] + [[t] for t in range(V)]
    logits = runner.forward(
        ForwardBatch(list(range(V + 1)), [0] * (V + 1), contexts, [1] * (V + 1))
    )
    md = SamplingMetadata.build(
        [PARAMS] * (V + 1), [PROMPT] * (V + 1), outputs, [None] * (V + 1), V, "cpu"
    )
    probs = processed_probs(logits, md)
    return probs[0], probs[1:]


def _pair_check(models) -> Check:
    target, draft = models
    p1, p2 = _exact_laws(target)
    proposer = DraftModelProposer(draft, NUM_ROWS, 8, 3)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        outputs, stats = speculative_generate(
            target, proposer, [PROMPT] * NUM_ROWS, [PARAMS] * NUM_ROWS, 3, V, max_seq_len=8
        )
    assert stats.num_accepted > 0.3 * NUM_ROWS  # many rows accept a proposal at position 0
    tokens = torch.tensor([out[:2] for out in outputs])
    return Check(tokens[:, 0] * V + tokens[:, 1], (p1[:, None] * p2).flatten())


def test_first_two_tokens_follow_the_target(small_models):
    check = _pair_check(small_models)
    assert check.tv < check.bound, check


def _metadata_without_proposals(rows, proposals, vocab_size, device, eos_token_ids=()):
    """Wrong: every verified position sees only the output before the step, not the proposals."""
    params, prompts, outputs = [], [], []
    for row, proposal in zip(rows, proposals):
        for _ in range(len(proposal) + 1):
            params.append(row.params)
            prompts.append(row.prompt_token_ids)
            outputs.append(list(row.output_token_ids))
    return SamplingMetadata.build(
        params, prompts, outputs, [None] * len(params), vocab_size, device, eos_token_ids
    )


def test_penalties_that_ignore_proposals_fail(small_models, monkeypatch):
    monkeypatch.setattr(verify, "target_metadata", _metadata_without_proposals)
    check = _pair_check(small_models)
    assert check.tv > 2 * check.bound, check
