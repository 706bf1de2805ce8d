"""The target side of verification: per-position sampling inputs and padded (B, K+1, V) probabilities."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from brisklm.sampling import SamplingMetadata, processed_probs, sample
from brisklm.speculative.proposer import DraftRow, Proposal


def verification_counts(proposals: Sequence[Proposal]) -> list[int]:
    """Logits the verification pass needs per row: one per proposal plus the bonus position. Use
    as ``ForwardBatch.num_logits`` for rows that feed ``[unfed context..., *proposal]``."""
    return [len(p) + 1 for p in proposals]


def target_metadata(
    rows: Sequence[DraftRow],
    proposals: Sequence[Proposal],
    vocab_size: int,
    device: torch.device | str,
    eos_token_ids: Sequence[int] = (),
) -> SamplingMetadata:
    """SamplingMetadata for the flat verification logits: row b contributes ``len(proposal b) + 1``
    consecutive positions, and position j is processed as if the proposals before it had already
    been generated (output = row's output + ``proposal[:j]``), so penalties and min_tokens see
    exactly what plain decoding would. No generators: only :func:`processed_probs` reads this."""
    params, prompts, outputs = [], [], []
    for row, proposal in zip(rows, proposals, strict=True):
        for j in range(len(proposal) + 1):
            params.append(row.params)
            prompts.append(row.prompt_token_ids)
            outputs.append([*row.output_token_ids, *proposal.token_ids[:j]])
    return SamplingMetadata.build(
        params, prompts, outputs, [None] * len(params), vocab_size, device, eos_token_ids
    )


def pad_positions(flat: torch.Tensor, counts: Sequence[int], width: int) -> torch.Tensor:
    """(sum(counts), V) rows grouped per batch row -> (B, width, V), zero padding after each group."""
    if sum(counts) != flat.shape[0]:
        raise ValueError(f"counts sum to {sum(counts)} but there are {flat.shape[0]} rows")
    if counts and max(counts) > width:
        raise ValueError(f"a row has {max(counts)} positions, more than width={width}")
    if all(count == width for count in counts):  # no padding (one row, say): a view of the rows
        return flat.view(len(counts), width, flat.shape[1])
    out = flat.new_zeros((len(counts), width, flat.shape[1]))
    counts_t = torch.tensor(list(counts), dtype=torch.int64)
    mask = torch.arange(width)[None, :] < counts_t[:, None]  # (B, width)
    out[mask.to(flat.device)] = flat
    return out


def target_probs(
    logits: torch.Tensor,
    rows: Sequence[DraftRow],
    proposals: Sequence[Proposal],
    eos_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """(B, K+1, V) target distributions for :func:`rejection_sample` from the verification pass's
    flat logits (sum(len(p) + 1), V), with K the longest proposal. Mask the logits first exactly as
    for plain decoding (ids past the tokenizer, grammar bitmask per position)."""
    metadata = target_metadata(rows, proposals, logits.shape[1], logits.device, eos_token_ids)
    probs = processed_probs(logits, metadata)  # (N, V)
    counts = verification_counts(proposals)
    return pad_positions(probs, counts, max(counts))


def greedy_verification(
    logits: torch.Tensor,
    rows: Sequence[DraftRow],
    proposals: Sequence[Proposal],
    eos_token_ids: Sequence[int] = (),
) -> tuple[list[list[int]], list[int]]:
    """What :func:`rejection_sample` returns when every row is greedy, without its tensors:
    ``(output_token_ids, num_accepted)`` per row, the output being the accepted proposals then the
    target's choice after them (no padding).

    A greedy row accepts proposals while each equals the target's choice at its position (the
    argmax after logit bias, min_tokens and penalties, exactly as plain decoding picks), then
    appends the choice at the first mismatch, or the bonus position. It needs no probabilities, so
    this skips the one-hot distributions, their (B, K+1, V) padding and the draft's q."""
    metadata = target_metadata(rows, proposals, logits.shape[1], logits.device, eos_token_ids)
    if not metadata.all_greedy:
        raise ValueError("greedy_verification needs every row to be greedy")
    return accept_greedy(proposals, sample(logits, metadata).tolist())


def accept_greedy(
    proposals: Sequence[Proposal], choices: Sequence[int]
) -> tuple[list[list[int]], list[int]]:
    """``(output_token_ids, num_accepted)`` per row from the target's greedy choice at every
    verified position (``len(proposal) + 1`` a row, rows in order): the proposals up to the first
    that differs from the choice at its position, then the choice there (or at the bonus
    position)."""
    outputs, accepted, offset = [], [], 0
    for proposal in proposals:
        tokens = proposal.token_ids
        n = 0
        while n < len(tokens) and tokens[n] == choices[offset + n]:
            n += 1
        outputs.append([*tokens[:n], choices[offset + n]])
        accepted.append(n)
        offset += len(tokens) + 1
    return outputs, accepted
