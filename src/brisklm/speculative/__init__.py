"""Speculative decoding core: proposers (draft model, n-gram lookup) and the lossless rejection sampler."""

from typing import TYPE_CHECKING

from brisklm._lazy import lazy_attributes

if TYPE_CHECKING:
    from brisklm.speculative.draft import DraftModelProposer, check_compatible, make_draft_generator
    from brisklm.speculative.draft_length import (
        DEFAULT_NUM_SPECULATIVE_TOKENS,
        SCHEDULES,
        DraftLength,
        DraftLengthSchedule,
        StepCosts,
    )
    from brisklm.speculative.ngram import NgramProposer
    from brisklm.speculative.proposer import (
        DraftBatch,
        DraftRow,
        Proposal,
        Proposer,
        batch_proposals,
    )
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
    "StepCosts",
    "target_metadata",
    "target_probs",
    "verification_counts",
]

# Imported on first use: the CLI reads DEFAULT_NUM_SPECULATIVE_TOKENS without loading torch.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "DraftModelProposer": "brisklm.speculative.draft",
        "check_compatible": "brisklm.speculative.draft",
        "make_draft_generator": "brisklm.speculative.draft",
        "DEFAULT_NUM_SPECULATIVE_TOKENS": "brisklm.speculative.draft_length",
        "SCHEDULES": "brisklm.speculative.draft_length",
        "DraftLength": "brisklm.speculative.draft_length",
        "DraftLengthSchedule": "brisklm.speculative.draft_length",
        "StepCosts": "brisklm.speculative.draft_length",
        "NgramProposer": "brisklm.speculative.ngram",
        "DraftBatch": "brisklm.speculative.proposer",
        "DraftRow": "brisklm.speculative.proposer",
        "Proposal": "brisklm.speculative.proposer",
        "Proposer": "brisklm.speculative.proposer",
        "batch_proposals": "brisklm.speculative.proposer",
        "rejection_sample": "brisklm.speculative.rejection",
        "accept_greedy": "brisklm.speculative.verify",
        "greedy_verification": "brisklm.speculative.verify",
        "pad_positions": "brisklm.speculative.verify",
        "target_metadata": "brisklm.speculative.verify",
        "target_probs": "brisklm.speculative.verify",
        "verification_counts": "brisklm.speculative.verify",
    },
)
