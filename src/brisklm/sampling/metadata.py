"""SamplingMetadata: per-batch sampling tensors built from each row's SamplingParams and token ids."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from brisklm.sampling.params import SamplingParams


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """A fresh generator seeded with ``params.seed`` on ``device``, or None when there is no seed
    or the request is greedy (greedy rows never draw random numbers).

    The engine keeps one per request for its whole life and passes it to every
    :meth:`SamplingMetadata.build`, so a seeded request's tokens do not depend on its batch."""
    if params.seed is None or params.is_greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


@dataclass
class SamplingMetadata:
    """The tensors the sampler needs for one batch of B rows over a vocabulary of V tokens.

    Every optional tensor is None when no row needs it, so the common batch (all greedy, or plain
    temperature) does no work for unused features. Build it with :meth:`build`.
    """

    batch_size: int
    vocab_size: int
    all_greedy: bool
    all_random: bool
    # (B,) float32, 1.0 on greedy rows (they never use it); None when all rows are greedy.
    temperature: torch.Tensor | None
    # (B,) bool; only set when the batch mixes greedy and random rows.
    is_greedy: torch.Tensor | None
    # (B,) int64 in [1, V], V where disabled; None when no random row uses top-k.
    top_k: torch.Tensor | None
    # Largest enabled top_k: lets top-k alone use torch.topk(max_top_k) instead of a full sort.
    max_top_k: int
    top_p: torch.Tensor | None  # (B,) float32, 1.0 where disabled
    min_p: torch.Tensor | None  # (B,) float32, 0.0 where disabled
    # Row -> its own generator, for seeded random rows only.
    generators: dict[int, torch.Generator]
    # (R,) int64 rows that draw from the default generator; None when that is every row.
    default_rng_rows: torch.Tensor | None
    # Sparse (row, token, bias) triples: a dense (B, V) bias would be 128 MB at B=256, V=128k.
    logit_bias_rows: torch.Tensor | None  # (N,) int64
    logit_bias_ids: torch.Tensor | None  # (N,) int64
    logit_bias_values: torch.Tensor | None  # (N,) float32
    # Sparse (row, token) pairs masked to -inf because the row has not reached min_tokens yet.
    min_tokens_rows: torch.Tensor | None  # (M,) int64
    min_tokens_ids: torch.Tensor | None  # (M,) int64
    repetition_penalty: torch.Tensor | None  # (B,) float32; None when every row uses 1.0
    presence_penalty: torch.Tensor | None  # (B,) float32; None when every row uses 0.0
    frequency_penalty: torch.Tensor | None  # (B,) float32; None when every row uses 0.0
    # (B, V) float32 count of each token in the output; set when presence/frequency is used.
    output_counts: torch.Tensor | None
    # (B, V) bool: token occurs in prompt or output; set when repetition penalty is used.
    seen_mask: torch.Tensor | None
    # Largest ``logprobs`` over the batch; None when no row asked for logprobs.
    max_num_logprobs: int | None

    @functools.cached_property
    def filter_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(temperature, top_k, top_p, min_p), each (B,) and contiguous: float32, int64, float32,
        float32, with a filter's off value where no row uses it (top-k V, top-p 1, min-p 0). For
        the native sampler (``sampler.native_draws``), built once per metadata, which the engine
        keeps across steps. Not for an all-greedy batch (no temperature)."""
        assert self.temperature is not None, "an all-greedy batch has no filters"
        rows, device = self.batch_size, self.temperature.device
        return (
            self.temperature.to(torch.float32).contiguous(),
            torch.full((rows,), self.vocab_size, dtype=torch.int64, device=device)
            if self.top_k is None
            else self.top_k.to(torch.int64).contiguous(),
            torch.ones(rows, device=device)
            if self.top_p is None
            else self.top_p.to(torch.float32).contiguous(),
            torch.zeros(rows, device=device)
            if self.min_p is None
            else self.min_p.to(torch.float32).contiguous(),
        )

    @property
    def no_top_k(self) -> bool:
        """No random row uses top-k."""
        return self.top_k is None

    @property
    def no_top_p(self) -> bool:
        """No random row uses top-p."""
        return self.top_p is None

    @property
    def no_min_p(self) -> bool:
        """No random row uses min-p."""
        return self.min_p is None

    @property
    def no_logit_bias(self) -> bool:
        """No row has a logit bias."""
        return self.logit_bias_rows is None

    @property
    def no_min_tokens(self) -> bool:
        """No row is masking stop ids for min_tokens this step."""
        return self.min_tokens_rows is None

    @property
    def no_penalties(self) -> bool:
        """No row uses a repetition, presence or frequency penalty."""
        return (
            self.repetition_penalty is None
            and self.presence_penalty is None
            and self.frequency_penalty is None
        )

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        generators: Sequence[torch.Generator | None],
        vocab_size: int,
        device: torch.device | str,
        eos_token_ids: Sequence[int] = (),
    ) -> SamplingMetadata:
        """Build the metadata for one decode step of B rows.

        ``output_token_ids[i]`` is every token row i has generated so far; penalties and min_tokens
        are recomputed from these lists each step (no incremental state to desync on rollback or
        speculative decoding). ``generators[i]`` is row i's own generator (see
        :func:`make_generator`), or None to share the default one. ``eos_token_ids`` are the model's
        end-of-sequence ids: together with each row's ``stop_token_ids`` (eos only when not
        ``ignore_eos``) they are masked while the row has fewer than ``min_tokens`` outputs.
        Token ids outside ``[0, vocab_size)`` raise ``ValueError``.
        """
        batch_size = len(params)
        if not (len(prompt_token_ids) == len(output_token_ids) == len(generators) == batch_size):
            raise ValueError(
                f"params, prompt_token_ids, output_token_ids and generators must all have "
                f"length B={batch_size}; got {len(prompt_token_ids)}, {len(output_token_ids)}, "
                f"{len(generators)}"
            )
        if batch_size == 0:
            raise ValueError("cannot build SamplingMetadata for an empty batch")
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} is invalid: must be >= 1")
        _check_ids("eos_token_ids", eos_token_ids, vocab_size)

        requested = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            batch_size=batch_size,
            vocab_size=vocab_size,
            **_random_fields(params, generators, vocab_size, device),
            **_logit_bias_fields(params, vocab_size, device),
            **_min_tokens_fields(params, output_token_ids, eos_token_ids, vocab_size, device),
            **_penalty_fields(params, prompt_token_ids, output_token_ids, vocab_size, device),
            max_num_logprobs=max(requested) if requested else None,
        )


def _floats(values: Sequence[float], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


# Temperatures and repetition penalties are divisors. A valid float64 value such as 1e-46 is 0 in
# float32, and x / 0 made the row NaN (sampled as the last token id); the smallest normal float32
# keeps the division finite or -inf, which is the limit the tiny value asks for. A value above
# float32's largest (1e300, say) is inf in float32, and -inf / inf (a masked logit) made the row NaN:
# the largest float32 keeps masked logits at -inf and the others near 0, the limit it asks for.
_SMALLEST_DIVISOR = torch.finfo(torch.float32).tiny
_LARGEST_DIVISOR = torch.finfo(torch.float32).max


def _divisors(values: Sequence[float], device: torch.device | str) -> torch.Tensor:
    return _floats(values, device).clamp_(_SMALLEST_DIVISOR, _LARGEST_DIVISOR)


def _ints(values: Sequence[int], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def _random_fields(
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    vocab_size: int,
    device: torch.device | str,
) -> dict[str, Any]:
    """Greedy/random split, temperature, filters and generators."""
    greedy = [p.is_greedy for p in params]
    fields: dict[str, Any] = {
        "all_greedy": all(greedy),
        "all_random": not any(greedy),
        "temperature": None,
        "is_greedy": None,
        "top_k": None,
        "max_top_k": vocab_size,
        "top_p": None,
        "min_p": None,
        "generators": {},
        "default_rng_rows": None,
    }
    if fields["all_greedy"]:
        return fields
    rows = list(zip(params, greedy, strict=True))
    fields["temperature"] = _divisors([1.0 if g else p.temperature for p, g in rows], device)
    if not fields["all_random"]:
        fields["is_greedy"] = torch.tensor(greedy, dtype=torch.bool, device=device)
    # Filters only matter for random rows: greedy rows take the argmax regardless.
    enabled_ks = [p.top_k for p, g in rows if not g and 0 < p.top_k < vocab_size]
    if enabled_ks:
        ks = [p.top_k if not g and 0 < p.top_k < vocab_size else vocab_size for p, g in rows]
        fields["top_k"] = _ints(ks, device)
        fields["max_top_k"] = max(enabled_ks)
    if any(p.top_p < 1.0 for p, g in rows if not g):
        fields["top_p"] = _floats([1.0 if g else p.top_p for p, g in rows], device)
    if any(p.min_p > 0.0 for p, g in rows if not g):
        fields["min_p"] = _floats([0.0 if g else p.min_p for p, g in rows], device)
    fields["generators"] = {
        row: gen
        for row, (gen, g) in enumerate(zip(generators, greedy, strict=True))
        if gen is not None and not g
    }
    default_rows = [row for row, g in enumerate(greedy) if not g and generators[row] is None]
    if len(default_rows) != len(params):
        fields["default_rng_rows"] = _ints(default_rows, device)
    return fields


def _logit_bias_fields(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str
) -> dict[str, Any]:
    rows = [row for row, p in enumerate(params) for _ in p.logit_bias]
    ids = [token_id for p in params for token_id, _ in p.logit_bias]
    values = [bias for p in params for _, bias in p.logit_bias]
    _check_ids("logit_bias", ids, vocab_size)
    if not rows:
        return {"logit_bias_rows": None, "logit_bias_ids": None, "logit_bias_values": None}
    return {
        "logit_bias_rows": _ints(rows, device),
        "logit_bias_ids": _ints(ids, device),
        "logit_bias_values": _floats(values, device),
    }


def _min_tokens_fields(
    params: Sequence[SamplingParams],
    output_token_ids: Sequence[Sequence[int]],
    eos_token_ids: Sequence[int],
    vocab_size: int,
    device: torch.device | str,
) -> dict[str, Any]:
    rows: list[int] = []
    ids: list[int] = []
    for row, (p, out) in enumerate(zip(params, output_token_ids, strict=True)):
        if len(out) >= p.min_tokens:
            continue
        # ignore_eos makes eos an ordinary token, so it is no stop to hold off.
        stops = set(p.stop_token_ids) if p.ignore_eos else {*p.stop_token_ids, *eos_token_ids}
        rows.extend([row] * len(stops))
        ids.extend(sorted(stops))
    _check_ids("stop_token_ids", ids, vocab_size)
    if not rows:
        return {"min_tokens_rows": None, "min_tokens_ids": None}
    return {"min_tokens_rows": _ints(rows, device), "min_tokens_ids": _ints(ids, device)}


def _penalty_fields(
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "repetition_penalty": None,
        "presence_penalty": None,
        "frequency_penalty": None,
        "output_counts": None,
        "seen_mask": None,
    }
    if any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params):
        fields["presence_penalty"] = _floats([p.presence_penalty for p in params], device)
        fields["frequency_penalty"] = _floats([p.frequency_penalty for p in params], device)
        fields["output_counts"] = _token_counts(output_token_ids, vocab_size, device)
    if any(p.repetition_penalty != 1.0 for p in params):
        fields["repetition_penalty"] = _divisors([p.repetition_penalty for p in params], device)
        seen = [
            [*prompt, *out] for prompt, out in zip(prompt_token_ids, output_token_ids, strict=True)
        ]
        fields["seen_mask"] = _token_counts(seen, vocab_size, device) > 0
    return fields


def _check_ids(name: str, ids: Sequence[int], vocab_size: int) -> None:
    # An out-of-range index on CUDA is a device-side assert that kills the whole context, so reject
    # it here, on the host, where it is only a ValueError for one request.
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(i for i in ids if not 0 <= i < vocab_size)
        raise ValueError(f"{name} contains token id {bad}: must be in [0, vocab_size={vocab_size})")


def _token_counts(
    token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """(B, V) float32 count of each token id per row, by one scatter_add over padded ids."""
    batch_size = len(token_ids)
    max_len = max((len(ids) for ids in token_ids), default=0)
    # Pad with an extra id V that lands in a spare column, dropped afterwards.
    padded = torch.tensor(
        [list(ids) + [vocab_size] * (max_len - len(ids)) for ids in token_ids], dtype=torch.int64
    ).reshape(batch_size, max_len)  # (B, L)
    lengths = torch.tensor([len(ids) for ids in token_ids], dtype=torch.int64)  # (B,)
    real = padded[torch.arange(max_len) < lengths[:, None]]  # (sum of lengths,)
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_size):
        raise ValueError(f"token ids must be in [0, vocab_size={vocab_size})")
    padded = padded.to(device)
    counts = torch.zeros((batch_size, vocab_size + 1), dtype=torch.float32, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.float32))
    return counts[:, :vocab_size]
