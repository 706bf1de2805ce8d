"""The lossless rejection sampler: accept or replace draft tokens so output follows the target exactly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from brisklm.kernels.omp import on_one_cpu_thread
from brisklm.sampling.categorical import inverse_cdf, uniforms_for_rows
from brisklm.sampling.sampler import greedy_tokens


@on_one_cpu_thread  # as the sampler's ops (brisklm.sampling.sampler)
def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft: Sequence[int] | torch.Tensor,
    draft_probs: torch.Tensor | None,
    is_greedy: Sequence[bool] | torch.Tensor,
    generators: Sequence[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify B rows of draft proposals against the target; returns ``(output_token_ids, num_accepted)``.

    - ``target_probs`` (B, K+1, V): the target's processed distribution (``processed_probs``, so
      greedy rows are one-hot) at each proposal position, then one more for the bonus token. Row b
      reads only positions ``0..num_draft[b]``.
    - ``draft_token_ids`` (B, K) int64: row b proposed its first ``num_draft[b]`` entries, each in
      ``[0, V)``; the rest is padding (any value).
    - ``draft_probs`` (B, K, V) or None: the distribution q each proposal was drawn from. None means
      deterministic proposals (n-gram lookup): q is one-hot on the proposal.
    - ``is_greedy`` (B,): greedy rows accept while the proposal is the target's argmax and then
      append the argmax, so their output is token-for-token the target's own greedy output.
    - ``generators``: per row, its own generator (all of its randomness comes from it: ``num_draft[b]``
      uniforms for the acceptance tests, then one for the final draw, so it is reproducible
      whatever the batch) or None
      for the default generator.

    Random rows accept proposal x_j with probability min(1, p_j(x)/q_j(x)); at the first rejection
    they draw from normalise(max(0, p_j - q_j)) (falling back to p_j should rounding leave that
    empty); if all are accepted they draw a bonus token from p at position ``num_draft[b]``.

    ``output_token_ids`` (B, K+1) int64 holds the accepted proposals followed by one drawn token,
    then -1 padding; ``num_accepted`` (B,) int64 counts accepted proposals, so row b emits
    ``num_accepted[b] + 1`` tokens. Both live on ``target_probs``' device.

    On the CPU, where the native kernels run, one C call takes every row (``_native_rows``), with
    the same uniforms and the same decisions. The last draw sums its weights in another order, so
    a uniform within rounding of a step of the cumulative sum can draw the next token: a review
    found 1 draw in 14,400 at 32k-152k tokens (about V x 1e-8 of them), none at small
    vocabularies. A seeded request can then differ between a CPU with the native kernels and one
    without, as ``sample`` can.
    """
    batch_size, width, vocab_size = target_probs.shape
    num_positions = width - 1  # K
    device = target_probs.device
    _check_shapes(target_probs, draft_token_ids, draft_probs, generators)
    draft_counts = _host_ints(num_draft, batch_size)
    greedy_flags = _host_bools(is_greedy, batch_size)
    if any(not 0 <= n <= num_positions for n in draft_counts):
        raise ValueError(f"num_draft must be in [0, K={num_positions}], got {draft_counts}")
    proposals = draft_token_ids.tolist()
    outside = [
        token
        for row, count in zip(proposals, draft_counts, strict=True)
        for token in row[:count]
        if not 0 <= token < vocab_size
    ]
    if outside:
        raise ValueError(f"proposed token ids must be in [0, V={vocab_size}), got {outside[:8]}")
    native = _native_rows(target_probs, draft_token_ids, draft_probs)
    if native is not None:
        return _rejection_in_native_pass(
            native, target_probs, proposals, draft_counts, draft_probs, greedy_flags, generators
        )
    all_greedy = all(greedy_flags)
    greedy = torch.tensor(greedy_flags, dtype=torch.bool, device=device)  # (B,)
    num_draft_t = torch.tensor(draft_counts, dtype=torch.int64, device=device)  # (B,)
    rows = torch.arange(batch_size, device=device)

    positions = torch.arange(num_positions, device=device)
    proposed = positions[None, :] < num_draft_t[:, None]  # (B, K)
    tokens = draft_token_ids.to(device=device, dtype=torch.int64).masked_fill(~proposed, 0)
    target_argmax = greedy_tokens(target_probs)  # (B, K+1); NO_TOKEN where a NaN is largest

    accepted = tokens == target_argmax[:, :num_positions]  # (B, K) greedy rule
    if not all_greedy:
        uniforms = _uniforms(greedy_flags, draft_counts, num_positions, generators, device)
        p_x = target_probs[:, :num_positions].gather(2, tokens.unsqueeze(-1)).squeeze(-1)
        if draft_probs is None:
            q_x = torch.ones_like(p_x)
        else:
            q_x = draft_probs.gather(2, tokens.unsqueeze(-1)).squeeze(-1)  # (B, K)
        accepted = torch.where(greedy[:, None], accepted, _accept(uniforms, p_x, q_x))
    accepted &= proposed
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # (B,) leading run of acceptances

    final = target_argmax[rows, num_accepted]  # (B,) greedy: argmax after the run
    if not all_greedy:
        p_final = target_probs[rows, num_accepted]  # (B, V) bonus or rejected position
        rejected = num_accepted < num_draft_t  # (B,)
        at = num_accepted.clamp(max=max(num_positions - 1, 0))
        if num_positions == 0:
            dist = p_final
        else:
            if draft_probs is None:
                q_final = torch.zeros_like(p_final).scatter_(1, tokens[rows, at, None], 1.0)
            else:
                q_final = draft_probs[rows, at]  # (B, V)
            dist = _recovery_distribution(p_final, q_final, rejected)
        draws = uniforms_for_rows(greedy_flags, generators, device)  # one per row
        sampled = inverse_cdf(dist, draws)  # scale-free: dist need not be normalised
        final = torch.where(greedy, final, sampled)

    output = torch.where(
        positions[None, :] < num_accepted[:, None], tokens, torch.full_like(tokens, -1)
    )
    output = torch.cat([output, output.new_full((batch_size, 1), -1)], dim=1)  # (B, K+1)
    output.scatter_(1, num_accepted[:, None], final[:, None])
    return output, num_accepted


def _native_rows(
    target_probs: torch.Tensor, draft_token_ids: torch.Tensor, draft_probs: torch.Tensor | None
) -> Any:
    """The native kernels' ``brisk_rejection_rows`` where it takes these tensors: float32 on the
    CPU (int64 proposals there), else None."""
    tensors = [target_probs] if draft_probs is None else [target_probs, draft_probs]
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    if draft_token_ids.device.type != "cpu":
        return None
    from brisklm.kernels import native

    return native.function("brisk_rejection_rows")


def _rejection_in_native_pass(
    run: Any,
    target_probs: torch.Tensor,
    proposals: list[list[int]],
    draft_counts: list[int],
    draft_probs: torch.Tensor | None,
    greedy_flags: list[bool],
    generators: Sequence[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample`` by one ``brisk_rejection_rows`` call, with the torch path's uniforms
    drawn in the same order (the acceptance tests', then one per row for the last draw).
    ``proposals``: the (B, K) draft tokens as lists, row b's first ``draft_counts[b]`` proposed."""
    batch_size, width, vocab_size = target_probs.shape
    num_positions = width - 1
    probs = target_probs.contiguous()
    q = draft_probs.contiguous() if draft_probs is not None else None
    # Row-major, as the C side reads it; the padding past a row's proposals 0, as the torch path
    # reads it.
    proposed = [row[:count] for row, count in zip(proposals, draft_counts, strict=True)]
    tokens = torch.tensor(
        [row + [0] * (num_positions - len(row)) for row in proposed], dtype=torch.int64
    ).view(batch_size, num_positions)
    if all(greedy_flags):
        uniforms = torch.zeros((batch_size, num_positions), dtype=torch.float32)
        draws = torch.full((batch_size,), 0.5, dtype=torch.float64)
    else:
        uniforms = _uniforms(greedy_flags, draft_counts, num_positions, generators, probs.device)
        draws = uniforms_for_rows(greedy_flags, generators, probs.device).to(torch.float64)
    counts = torch.tensor(draft_counts, dtype=torch.int64)
    greedy = torch.tensor(greedy_flags, dtype=torch.uint8)
    scratch = torch.empty(vocab_size, dtype=torch.float32)
    num_accepted = torch.empty(batch_size, dtype=torch.int64)
    final = torch.empty(batch_size, dtype=torch.int64)
    run(
        probs.data_ptr(),
        q.data_ptr() if q is not None else None,
        tokens.data_ptr(),
        counts.data_ptr(),
        greedy.data_ptr(),
        uniforms.contiguous().data_ptr(),
        draws.contiguous().data_ptr(),
        batch_size,
        width,
        vocab_size,
        scratch.data_ptr(),
        num_accepted.data_ptr(),
        final.data_ptr(),
    )
    accepted, finals = num_accepted.tolist(), final.tolist()
    output = [
        proposed[b][: accepted[b]] + [finals[b]] + [-1] * (num_positions - accepted[b])
        for b in range(batch_size)
    ]
    return torch.tensor(output, dtype=torch.int64).view(batch_size, width), num_accepted


def _accept(uniforms: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """Accept with probability min(1, p/q): u < p/q for u in [0, 1), written without division so
    q = 0 (a proposal its own draft could not draw) accepts whenever p > 0 and p = 0 never does."""
    return uniforms * q_x < p_x


def _recovery_distribution(
    p_final: torch.Tensor, q_final: torch.Tensor, rejected: torch.Tensor
) -> torch.Tensor:
    """Unnormalised (B, V) distribution of the drawn token: max(0, p - q) where the row rejected a
    proposal, p where it accepted them all. The residual's mass equals the rejection probability,
    so it is empty only by rounding (p and q equal up to float error): fall back to p there."""
    residual = (p_final - q_final).clamp_min_(0.0)
    use_residual = rejected & (residual.sum(dim=-1) > 0)
    return torch.where(use_residual[:, None], residual, p_final)


def _uniforms(
    greedy: list[bool],
    num_draft: list[int],
    num_positions: int,
    generators: Sequence[torch.Generator | None],
    device: torch.device,
) -> torch.Tensor:
    """(B, K) uniforms in [0, 1) for the acceptance tests; a seeded row draws exactly num_draft[b]."""
    out = torch.zeros((len(greedy), num_positions), dtype=torch.float32, device=device)
    default_rows = [b for b, g in enumerate(greedy) if not g and generators[b] is None]
    if default_rows:
        index = torch.tensor(default_rows, dtype=torch.int64, device=device)
        out[index] = torch.rand((len(default_rows), num_positions), device=device)
    for b, generator in enumerate(generators):
        if generator is not None and not greedy[b] and num_draft[b]:
            draws = torch.rand(num_draft[b], generator=generator, device=generator.device)
            out[b, : num_draft[b]] = draws.to(device)
    return out


def _check_shapes(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generators: Sequence[torch.Generator | None],
) -> None:
    if target_probs.dim() != 3 or target_probs.shape[1] < 1 or target_probs.shape[2] < 1:
        raise ValueError(f"target_probs must be (B, K+1, V), got {tuple(target_probs.shape)}")
    batch_size, width, vocab_size = target_probs.shape
    if tuple(draft_token_ids.shape) != (batch_size, width - 1):
        raise ValueError(
            f"draft_token_ids must be (B, K) = {(batch_size, width - 1)}, "
            f"got {tuple(draft_token_ids.shape)}"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (batch_size, width - 1, vocab_size):
        raise ValueError(
            f"draft_probs must be (B, K, V) = {(batch_size, width - 1, vocab_size)}, "
            f"got {tuple(draft_probs.shape)}"
        )
    if len(generators) != batch_size:
        raise ValueError(
            f"need one generator (or None) per row: {len(generators)} for B={batch_size}"
        )


def _host_ints(values: Sequence[int] | torch.Tensor, batch_size: int) -> list[int]:
    result = values.tolist() if isinstance(values, torch.Tensor) else [int(v) for v in values]
    if len(result) != batch_size:
        raise ValueError(f"num_draft has {len(result)} entries for B={batch_size}")
    return result


def _host_bools(values: Sequence[bool] | torch.Tensor, batch_size: int) -> list[bool]:
    result = values.tolist() if isinstance(values, torch.Tensor) else [bool(v) for v in values]
    if len(result) != batch_size:
        raise ValueError(f"is_greedy has {len(result)} entries for B={batch_size}")
    return result
