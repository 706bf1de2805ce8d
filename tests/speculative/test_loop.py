"""End to end on tiny models: speculative decoding reproduces the target's greedy output with any
proposer, and every row of a batch accepts its own number of tokens."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from brisklm.sampling import SamplingParams
from brisklm.speculative import DraftModelProposer, DraftRow, NgramProposer, Proposal
from tests.speculative.loop import plain_generate, speculative_generate

MAX_NEW = 24
GREEDY = SamplingParams.greedy()


@pytest.fixture(scope="module")
def setup(target_model, tokenizer, prompts):
    num_real = min(tokenizer.vocab_size, target_model.config.vocab_size)
    eos = tuple(tokenizer.eos_token_ids)
    expected = plain_generate(
        target_model, prompts, [GREEDY] * len(prompts), MAX_NEW, num_real, eos
    )
    return num_real, eos, expected


def _draft(model, target_model, tokenizer, k, num_slots=3):
    return DraftModelProposer(
        model, num_slots, 256, k, target_config=target_model.config, tokenizer=tokenizer
    )


def test_target_as_its_own_draft_accepts_everything(setup, target_model, tokenizer, prompts):
    num_real, eos, expected = setup
    proposer = _draft(target_model, target_model, tokenizer, k=4)
    outputs, stats = speculative_generate(
        target_model, proposer, prompts, [GREEDY] * 3, MAX_NEW, num_real, eos
    )
    assert outputs == expected
    assert stats.num_accepted == stats.num_proposed > 0
    # 24 tokens at up to 5 per step.
    assert stats.num_steps <= -(-MAX_NEW // 5) + 1


def test_disagreeing_draft_keeps_greedy_output(
    setup, target_model, draft_model, tokenizer, prompts
):
    num_real, eos, expected = setup
    proposer = _draft(draft_model, target_model, tokenizer, k=3)
    outputs, stats = speculative_generate(
        target_model, proposer, prompts, [GREEDY] * 3, MAX_NEW, num_real, eos
    )
    assert outputs == expected
    assert stats.num_accepted < stats.num_proposed


def test_ngram_proposer_keeps_greedy_output(setup, target_model, prompts):
    num_real, eos, expected = setup
    outputs, stats = speculative_generate(
        target_model, NgramProposer(3, 1, 4), prompts, [GREEDY] * 3, MAX_NEW, num_real, eos
    )
    assert outputs == expected


class AlwaysWrong:
    """Proposes k copies of a token the target never emits."""

    def __init__(self, token: int, k: int) -> None:
        self.token = token
        self.num_speculative_tokens = k

    def propose(self, rows: Sequence[DraftRow]) -> list[Proposal]:
        return [
            Proposal([self.token] * max(0, min(self.num_speculative_tokens, r.max_draft_tokens)))
            for r in rows
        ]

    def rollback(self, slot: int, num_tokens: int) -> None:
        pass

    def release(self, slot: int) -> None:
        pass


def test_draft_that_always_disagrees_still_emits_one_token_per_step(setup, target_model, prompts):
    num_real, eos, expected = setup
    never = next(t for t in range(num_real) if all(t not in out for out in expected))
    outputs, stats = speculative_generate(
        target_model, AlwaysWrong(never, 4), prompts, [GREEDY] * 3, MAX_NEW, num_real, eos
    )
    assert outputs == expected
    assert stats.num_accepted == 0
    assert stats.num_steps == max(len(out) for out in expected)


def test_rows_accept_their_own_counts_with_per_row_k(
    setup, target_model, close_draft_model, tokenizer, prompts
):
    num_real, eos, expected = setup
    proposer = _draft(close_draft_model, target_model, tokenizer, k=5)
    outputs, stats = speculative_generate(
        target_model,
        proposer,
        prompts,
        [GREEDY] * 3,
        MAX_NEW,
        num_real,
        eos,
        num_speculative_tokens=[1, 5, 3],
    )
    assert outputs == expected
    assert 0 < stats.num_accepted < stats.num_proposed
    assert any(len(set(step)) > 1 for step in stats.accepted_per_step)
    assert all(n <= 1 for step in stats.accepted_per_step for n in step[:1])  # row 0 has k = 1


def test_mixed_greedy_and_seeded_rows(setup, target_model, draft_model, tokenizer, prompts):
    num_real, eos, expected = setup
    sampled = SamplingParams(temperature=0.8, top_k=50, seed=11, presence_penalty=0.5)
    params = [GREEDY, sampled, GREEDY]

    def run(batch_params):
        proposer = _draft(draft_model, target_model, tokenizer, k=3)
        return speculative_generate(
            target_model, proposer, prompts, batch_params, MAX_NEW, num_real, eos
        )[0]

    outputs = run(params)
    assert outputs[0] == expected[0] and outputs[2] == expected[2]
    assert run(params)[1] == outputs[1]  # seeded: reproducible
    assert 1 <= len(outputs[1]) <= MAX_NEW
