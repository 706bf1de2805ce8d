"""Speculative decoding core: proposers (draft model, n-gram lookup) and the lossless rejection sampler."""

from brisklm.speculative.draft import DraftModelProposer, check_compatible, make_draft_generator
from brisklm.speculative.draft_length import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    SCHEDULES,
    DraftLength,
    DraftLengthSchedule,
)
from brisklm.speculative.ngram import NgramProposer
from brisklm.speculative.proposer import DraftBatch, DraftRow, Proposal, Proposer, batch_proposals
from brisklm.speculative.rejection import rejection_sample
from brisklm.speculative.verify import (
    accept_greedy,
    greedy_verification,
    pad_positions,
    target_metadata,
    target_probs,
    verification_counts,
)

__all__ = [
    "DEFAULT_NUM_SPECULATIVE_TOKENS",
    "SCHEDULES",
    "accept_greedy",
    "DraftBatch",
    "DraftLength",
    "DraftLengthSchedule",
    "DraftModelProposer",
    "DraftRow",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "batch_proposals",
    "check_compatible",
    "greedy_verification",
    "make_draft_generator",
    "pad_positions",
    "rejection_sample",
    "target_metadata",
    "target_probs",
    "verification_counts",
]
