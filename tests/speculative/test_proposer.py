"""Interface plumbing: DraftRow slicing, batching proposals, per-position target metadata, padding."""

from __future__ import annotations

import pytest
import torch

from brisklm.sampling import SamplingParams, processed_probs
from brisklm.speculative import (
    DraftRow,
    Proposal,
    batch_proposals,
    greedy_verification,
    pad_positions,
    target_metadata,
    target_probs,
    verification_counts,
)
from brisklm.speculative.rejection import rejection_sample


def test_draft_row_token_slices():
    row = DraftRow(0, [1, 2, 3], [4, 5], 2)
    assert row.num_tokens == 5 and row.token_ids() == [1, 2, 3, 4, 5]
    for start in range(6):
        for stop in range(start, 7):
            assert row.token_slice(start, stop) == [1, 2, 3, 4, 5][start:stop]
    assert row.params.is_greedy


def test_batch_proposals_pads_and_mixes_deterministic_rows():
    q = torch.softmax(torch.randn(2, 5), dim=-1)
    batch = batch_proposals([Proposal([1, 2], q), Proposal([]), Proposal([3])], 5, "cpu")
    assert batch.token_ids.tolist() == [[1, 2], [-1, -1], [3, -1]]
    assert batch.num_draft == [2, 0, 1] and batch.num_positions == 2
    assert torch.equal(batch.probs[0], q)
    assert batch.probs[1].eq(0).all()
    assert batch.probs[2, 0].tolist() == [0, 0, 0, 1, 0] and batch.probs[2, 1].eq(0).all()
    deterministic = batch_proposals([Proposal([1]), Proposal([])], 5, "cpu")
    assert deterministic.probs is None
    assert batch_proposals([Proposal([]), Proposal([])], 5, "cpu").token_ids.shape == (2, 0)
    with pytest.raises(ValueError, match="outside"):
        batch_proposals([Proposal([5])], 5, "cpu")
    with pytest.raises(ValueError, match="shape"):
        batch_proposals([Proposal([1], torch.ones(2, 5))], 5, "cpu")


def test_target_metadata_counts_proposals_before_each_position():
    params = SamplingParams(temperature=1.0, presence_penalty=2.0)
    rows = [DraftRow(0, [0], [1], 3, params), DraftRow(1, [0], [], 3, params)]
    proposals = [Proposal([2, 2]), Proposal([])]
    assert verification_counts(proposals) == [3, 1]
    md = target_metadata(rows, proposals, 4, "cpu")
    assert md.batch_size == 4
    assert md.output_counts.tolist() == [
        [0, 1, 0, 0],  # position 0: output only
        [0, 1, 1, 0],  # position 1: output + first proposal
        [0, 1, 2, 0],
        [0, 0, 0, 0],  # the second row's only (bonus) position
    ]
    logits = torch.zeros(4, 4)
    probs = target_probs(logits, rows, proposals)
    assert probs.shape == (2, 3, 4)
    torch.testing.assert_close(probs[0], processed_probs(logits, md)[:3])
    assert probs[1, 1:].eq(0).all()


def test_pad_positions():
    flat = torch.arange(12.0).reshape(6, 2)
    out = pad_positions(flat, [2, 1, 3], 3)
    assert out.tolist() == [
        [[0, 1], [2, 3], [0, 0]],
        [[4, 5], [0, 0], [0, 0]],
        [[6, 7], [8, 9], [10, 11]],
    ]
    with pytest.raises(ValueError, match="sum"):
        pad_positions(flat, [2, 2], 3)
    # No row padded: the rows as they are.
    assert pad_positions(flat, [3, 3], 3).tolist() == flat.reshape(2, 3, 2).tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams.greedy(),
        SamplingParams.greedy(repetition_penalty=1.8, presence_penalty=0.5),
        SamplingParams.greedy(logit_bias={3: 4.0}, frequency_penalty=1.0),
    ],
    ids=["plain", "penalties", "bias"],
)
def test_greedy_verification_matches_the_rejection_sampler(params):
    """The all-greedy shortcut returns exactly what target_probs + rejection_sample return, over
    random logits, proposal lengths and agreement; penalties see the proposals before each
    position, so they can change which proposal the target accepts."""
    gen = torch.Generator().manual_seed(5)
    vocab = 7
    for _ in range(200):
        batch = int(torch.randint(1, 5, (1,), generator=gen))
        rows, proposals = [], []
        for b in range(batch):
            output = torch.randint(
                vocab, (int(torch.randint(0, 4, (1,), generator=gen)),), generator=gen
            )
            rows.append(DraftRow(b, [0, 1], output.tolist(), 4, params))
            length = int(torch.randint(0, 5, (1,), generator=gen))
            proposals.append(Proposal(torch.randint(vocab, (length,), generator=gen).tolist()))
        counts = verification_counts(proposals)
        logits = torch.randn(sum(counts), vocab, generator=gen) * 2
        # Make the proposals agree often: raise the proposed token at most positions.
        offset = 0
        for proposal in proposals:
            for j, token in enumerate(proposal.token_ids):
                if float(torch.rand(1, generator=gen)) < 0.7:
                    logits[offset + j, token] += 6.0
            offset += len(proposal) + 1
        batched = batch_proposals(proposals, vocab, "cpu")
        out, accepted = rejection_sample(
            target_probs(logits, rows, proposals),
            batched.token_ids,
            batched.num_draft,
            batched.probs,
            [True] * batch,
            [None] * batch,
        )
        got_rows, got_accepted = greedy_verification(logits, rows, proposals)
        assert got_accepted == accepted.tolist()
        assert got_rows == [out[b, : n + 1].tolist() for b, n in enumerate(got_accepted)]


def test_greedy_verification_refuses_random_rows():
    rows = [DraftRow(0, [0], [], 2, SamplingParams(temperature=1.0))]
    with pytest.raises(ValueError, match="greedy"):
        greedy_verification(torch.zeros(1, 4), rows, [Proposal([])])
