"""Exact categorical draws by inverse CDF: one uniform per row instead of one exponential per token.

The exponential race (argmax of p / q, q ~ Exp(1) per token) is exact too, but it needs V random
numbers per row, and torch's CPU ``exponential_`` costs ~15 ns each: 0.5 ms per token at a 32k
vocabulary, 2 ms at 128k, more than a small model's whole forward pass. Inverse CDF needs one
uniform, a cumulative sum and a binary search: 26 us at 32k and 81 us at 128k on this project's
2-vCPU machine (docs/benchmarks.md). Used by the sampler and by both halves of speculative
decoding, so every path draws the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from brisklm.kernels.omp import on_one_cpu_thread

# What inverse_cdf draws from a row with nothing to draw (see there).
NO_TOKEN = -1


@on_one_cpu_thread  # as the sampler's ops (brisklm.sampling.sampler)
def inverse_cdf(dist: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(B,) int64 token ids drawn from the rows of ``dist`` (B, V) with ``uniforms`` (B,) in [0, 1),
    and ``NO_TOKEN`` for a row without a finite positive mass (logits holding NaN or +inf, or
    every token masked): there is nothing to draw, and its caller fails that row alone.

    ``dist`` is non-negative with positive mass in every row; it need not sum to 1. Row b returns
    the first token whose cumulative mass exceeds ``uniforms[b]`` times the row's total, so a token
    is drawn with probability exactly its share of the mass, and a token of zero mass never (its
    cumulative sum equals its predecessor's). The sums are float64: in float32 a 128k-token row's
    rounding would move the tail tokens' probabilities by up to ~V * 2^-24 of the total.
    """
    batch_size, vocab_size = dist.shape
    # One cumulative sum per row, each over its contiguous run: float64 cumsum along the last dim
    # of a (B, V) tensor is ~10x slower on CPU, and one flat sum rebased per row would round a
    # row differently from the same row alone (a seeded draw must not depend on its batch). In
    # place: at 8 x 128k every new temporary of this size costs more in page faults than its
    # arithmetic.
    cdf = dist.to(torch.float64, copy=True).contiguous()  # never the caller's tensor
    for row in cdf:
        row.cumsum_(0)
    targets = uniforms.to(device=dist.device, dtype=torch.float64)[:, None] * cdf[:, -1:]
    index = torch.searchsorted(cdf, targets, right=True).squeeze(1)  # (B,)
    # u * total can round up to the total itself, past the last token: take the row's last token
    # with mass instead. A NaN total searches past the end too, and a zero one finds token 0.
    total = cdf[:, -1]
    empty = ~(torch.isfinite(total) & (total > 0))
    overflow = index >= vocab_size
    if bool((overflow | empty).any()):
        last = vocab_size - 1 - (dist > 0).flip(-1).to(torch.float32).argmax(dim=-1)
        index = torch.where(overflow, last, index)
        index = torch.where(empty, torch.full_like(index, NO_TOKEN), index)
    return index


def row_uniforms(
    batch_size: int,
    device: torch.device | str,
    default_rows: Sequence[int] | torch.Tensor | None,
    generators: Mapping[int, torch.Generator],
) -> torch.Tensor:
    """(B,) float64 uniforms in [0, 1), one per row, for :func:`inverse_cdf`.

    ``default_rows`` draw from the default generator in one batched call (None: every row does);
    each row in ``generators`` draws exactly one number from its own generator, so its tokens do
    not depend on the rest of the batch. Other rows (greedy: a one-hot distribution) draw nothing
    and get 0.5.
    """
    if default_rows is None:
        return torch.rand(batch_size, dtype=torch.float64, device=device)
    if torch.device(device).type == "cpu" and all(
        g.device.type == "cpu" for g in generators.values()
    ):
        # The same draws as below, gathered as Python floats into one tensor: a step's five small
        # tensor ops a seeded row cost ~40 us after a forward pass (the bundled model).
        if batch_size == 1 and generators and not len(default_rows):  # one seeded row: its draw
            return torch.rand(1, dtype=torch.float64, generator=generators[0])
        values = [0.5] * batch_size
        if len(default_rows):
            rows = default_rows.tolist() if torch.is_tensor(default_rows) else list(default_rows)
            drawn = torch.rand(len(rows), dtype=torch.float64).tolist()
            for row, value in zip(rows, drawn, strict=True):
                values[row] = value
        for row, generator in generators.items():
            values[row] = torch.rand(1, dtype=torch.float64, generator=generator).item()
        return torch.tensor(values, dtype=torch.float64)
    out = torch.full((batch_size,), 0.5, dtype=torch.float64, device=device)
    if len(default_rows):
        index = torch.as_tensor(default_rows, dtype=torch.int64, device=device)
        out[index] = torch.rand(index.numel(), dtype=torch.float64, device=device)
    for row, generator in generators.items():
        draw = torch.rand(1, dtype=torch.float64, generator=generator, device=generator.device)
        out[row] = draw.to(device)[0]
    return out


def uniforms_for_rows(
    greedy: Sequence[bool],
    generators: Sequence[torch.Generator | None],
    device: torch.device | str,
) -> torch.Tensor:
    """:func:`row_uniforms` for rows given as greedy flags and per-row generators (None: default)."""
    default_rows = [row for row, g in enumerate(greedy) if not g and generators[row] is None]
    seeded = {
        row: generator
        for row, (generator, g) in enumerate(zip(generators, greedy, strict=True))
        if generator is not None and not g
    }
    return row_uniforms(len(greedy), device, default_rows, seeded)
