"""Per-request seeds are reproducible whatever the batch; logprobs of the model distribution."""

import pytest
import torch

from brisklm.sampling import SamplingParams, compute_logprobs, make_generator, sample

VOCAB_SIZE = 50
NUM_STEPS = 25


def step_logits(num_steps: int) -> torch.Tensor:
    return torch.randn(num_steps, VOCAB_SIZE, generator=torch.Generator().manual_seed(7)) * 2


def run_in_batches(
    target: SamplingParams, others: list[SamplingParams], position: int, build_md
) -> list[int]:
    """Decode NUM_STEPS tokens for ``target`` at ``position`` among ``others``; return its tokens."""
    params = others[:position] + [target] + others[position:]
    generators = [make_generator(p, "cpu") for p in params]  # one per request, kept across steps
    outputs: list[list[int]] = [[] for _ in params]
    noise = torch.Generator().manual_seed(len(params))
    target_logits = step_logits(NUM_STEPS)
    for step in range(NUM_STEPS):
        logits = torch.randn(len(params), VOCAB_SIZE, generator=noise)  # unrelated other rows
        logits[position] = target_logits[step]
        md = build_md(params, VOCAB_SIZE, outputs=outputs, generators=generators)
        for row, token in enumerate(sample(logits, md).tolist()):
            outputs[row].append(token)
    return outputs[position]


def test_seeded_row_is_independent_of_batch(build_md) -> None:
    target = SamplingParams(temperature=0.9, top_p=0.95, seed=123, frequency_penalty=0.3)
    torch.manual_seed(0)
    alone = run_in_batches(target, [], 0, build_md)
    torch.manual_seed(1)  # the default generator's state must not matter either
    batch_a = run_in_batches(
        target,
        [SamplingParams.greedy(), SamplingParams(), SamplingParams(seed=5, top_k=3)],
        2,
        build_md,
    )
    batch_b = run_in_batches(target, [SamplingParams(min_p=0.1, seed=9)] * 6, 0, build_md)
    assert alone == batch_a == batch_b
    assert len(set(alone)) > 5  # really random, not stuck on one token


def test_different_seeds_give_different_tokens(build_md) -> None:
    runs = [
        run_in_batches(SamplingParams(temperature=1.0, seed=s), [], 0, build_md) for s in (1, 2, 3)
    ]
    assert runs[0] != runs[1] and runs[1] != runs[2] and runs[0] != runs[2]
    assert runs[0] == run_in_batches(SamplingParams(temperature=1.0, seed=1), [], 0, build_md)


def test_seeded_and_greedy_rows_leave_default_rng_alone(build_md) -> None:
    torch.manual_seed(0)
    params = [SamplingParams(seed=1), SamplingParams.greedy(), SamplingParams(seed=2, top_k=5)]
    md = build_md(params, VOCAB_SIZE)
    assert md.default_rng_rows is not None and md.default_rng_rows.numel() == 0
    state = torch.get_rng_state()
    sample(torch.randn(3, VOCAB_SIZE, generator=torch.Generator().manual_seed(0)), md)
    assert torch.equal(torch.get_rng_state(), state)


def test_unseeded_rows_follow_the_default_generator(build_md) -> None:
    logits = step_logits(64)
    md = build_md([SamplingParams()] * 64, VOCAB_SIZE)
    torch.manual_seed(42)
    first = sample(logits, md)
    torch.manual_seed(42)
    assert torch.equal(sample(logits, md), first)
    assert not torch.equal(sample(logits, md), first)  # state advanced


def test_logprobs_match_log_softmax_with_sorted_top_and_rank() -> None:
    torch.manual_seed(3)
    logits = torch.randn(5, 30) * 3
    token_ids = torch.tensor([0, 7, 29, 3, 12])
    out = compute_logprobs(logits, token_ids, num_top=4)
    reference = torch.log_softmax(logits.double(), dim=-1)
    torch.testing.assert_close(out.chosen.double(), reference[torch.arange(5), token_ids])
    assert out.chosen.dtype == torch.float32
    assert out.top_ids.shape == out.top_logprobs.shape == (5, 4)
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()
    assert torch.equal(out.top_ids, reference.topk(4, dim=-1).indices)
    torch.testing.assert_close(out.top_logprobs.double(), reference.gather(1, out.top_ids))
    for row in range(5):
        order = reference[row].argsort(descending=True).tolist()
        assert out.rank[row].item() == order.index(token_ids[row].item()) + 1


def test_logprobs_edge_cases() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]], dtype=torch.bfloat16)
    out = compute_logprobs(logits, torch.tensor([2]), num_top=0)
    assert out.top_ids.shape == (1, 0) and out.rank.item() == 1  # ties share the better rank
    out = compute_logprobs(logits, torch.tensor([3]), num_top=10)  # capped at V
    assert out.top_ids.shape == (1, 4) and out.rank.item() == 4
    assert out.top_logprobs.dtype == torch.float32
    torch.testing.assert_close(out.top_logprobs.exp().sum(), torch.tensor(1.0))
    with pytest.raises(ValueError, match="num_top"):
        compute_logprobs(logits, torch.tensor([0]), num_top=-1)
