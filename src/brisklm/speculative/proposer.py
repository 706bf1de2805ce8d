"""The proposer interface the engine drives each step, and the batching of proposals for verification."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from brisklm.sampling import SamplingParams


@dataclass
class DraftRow:
    """One running request to propose for this step.

    ``prompt_token_ids + output_token_ids`` is the whole context so far (the proposer never sees
    its own rejected proposals there). ``max_draft_tokens`` caps this row's proposals (the engine
    lowers it near max_tokens or the end of the cache); proposers may return fewer. ``params``,
    ``generator`` and ``matcher`` are read by the draft model only: the draft processes its logits
    with the request's own sampling transforms (and grammar, when ``matcher`` is the request's
    GrammarMatcher) and draws from ``generator``, a *draft* generator (:func:`make_draft_generator`),
    never the request's target generator.
    """

    slot: int
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    max_draft_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams.greedy)
    generator: torch.Generator | None = None
    matcher: Any = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self) -> list[int]:
        """The whole context, prompt then output, as a new list."""
        return [*self.prompt_token_ids, *self.output_token_ids]

    def token_slice(self, start: int, stop: int) -> list[int]:
        """``token_ids()[start:stop]`` without concatenating the whole context."""
        num_prompt = len(self.prompt_token_ids)
        head = list(self.prompt_token_ids[start:stop]) if start < num_prompt else []
        tail_start, tail_stop = max(start - num_prompt, 0), max(stop - num_prompt, 0)
        return head + list(self.output_token_ids[tail_start:tail_stop])


@dataclass
class Proposal:
    """A row's proposed continuation: ``token_ids`` in order, and ``probs`` (n, V) float32, the
    distribution each token was drawn from, or None for deterministic proposals (n-gram)."""

    token_ids: list[int]
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Proposer(Protocol):
    """What the engine calls: ``propose`` once per step for the rows it speculates on, ``rollback``
    when the target rejected some of a row's proposals, ``release`` when a request leaves its slot.

    ``rollback(slot, num_tokens)`` forgets the last ``num_tokens`` tokens of the proposer's view of
    the slot, which is the context it last saw followed by its proposals: after verifying k
    proposals of which n were accepted, call ``rollback(slot, k - n)``, mirroring
    ``GrammarMatcher.rollback``. Proposers that keep no per-slot state make both no-ops.

    A proposer with a cache of its own may also define ``prefill(rows)``: the engine then calls it
    with each prompt chunk before the target takes it (each row's context cut at the chunk's end,
    ``max_draft_tokens`` 0), so that the prompt is in the proposer's cache before its first step.
    """

    num_speculative_tokens: int

    def propose(self, rows: Sequence[DraftRow]) -> list[Proposal]:
        """One Proposal per row, in order, each at most ``row.max_draft_tokens`` long."""
        ...

    def rollback(self, slot: int, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` tokens (rejected proposals) of ``slot``."""
        ...

    def release(self, slot: int) -> None:
        """Drop everything about ``slot``; the next request there starts from scratch."""
        ...


@dataclass
class DraftBatch:
    """Proposals padded for :func:`rejection_sample`: K is the longest proposal of the batch."""

    token_ids: torch.Tensor  # (B, K) int64, -1 padding
    num_draft: list[int]  # (B,) proposals per row
    probs: torch.Tensor | None  # (B, K, V) float32, zero padding; None when all are deterministic

    @property
    def num_positions(self) -> int:
        """K: the verification pass scores K + 1 positions for the widest row."""
        return int(self.token_ids.shape[1])


def batch_proposals(
    proposals: Sequence[Proposal], vocab_size: int, device: torch.device | str
) -> DraftBatch:
    """Pad per-row proposals into tensors. When some rows carry draft probabilities and others are
    deterministic, the deterministic ones get a one-hot q, which is exactly what they mean."""
    if not proposals:
        raise ValueError("cannot batch an empty list of proposals")
    num_draft = [len(p.token_ids) for p in proposals]
    width = max(num_draft)
    for row, proposal in enumerate(proposals):
        if (
            proposal.token_ids
            and not 0 <= min(proposal.token_ids) <= max(proposal.token_ids) < vocab_size
        ):
            raise ValueError(
                f"row {row} proposes token ids outside [0, vocab_size={vocab_size}): "
                f"{proposal.token_ids}"
            )
        if proposal.probs is not None and tuple(proposal.probs.shape) != (
            len(proposal),
            vocab_size,
        ):
            raise ValueError(
                f"row {row} has probs of shape {tuple(proposal.probs.shape)}, expected "
                f"{(len(proposal), vocab_size)}"
            )
    padded = [p.token_ids + [-1] * (width - len(p)) for p in proposals]
    token_ids = torch.tensor(padded, dtype=torch.int64).reshape(len(proposals), width).to(device)
    probs = None
    if any(p.probs is not None and len(p) for p in proposals):
        rows = [
            p.probs.to(device=device, dtype=torch.float32)
            if p.probs is not None
            else _one_hot(p.token_ids, vocab_size, device)
            for p in proposals
        ]
        probs = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # (B, K, V) zero padding
    return DraftBatch(token_ids=token_ids, num_draft=num_draft, probs=probs)


def _one_hot(token_ids: list[int], vocab_size: int, device: torch.device | str) -> torch.Tensor:
    ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
    return torch.zeros((len(token_ids), vocab_size), device=device).scatter_(1, ids[:, None], 1.0)
