"""The pure sampler: logits and SamplingMetadata in, token ids / processed distribution / logprobs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from brisklm.kernels.omp import on_one_cpu_thread
from brisklm.sampling.categorical import NO_TOKEN, inverse_cdf, row_uniforms
from brisklm.sampling.metadata import SamplingMetadata

# Top-p first tries the nucleus inside this many most likely tokens (a partial top-k), and sorts
# the whole row only when they hold less than top_p of the mass. A trained model's top 256 tokens
# hold 0.9-0.95 of the mass at almost every step; sorting 128k logits costs ~9.6 ms on CPU, the
# top 256 ~0.16 ms.
_TOP_P_PREFIX = 256
_FLOAT32_MAX = torch.finfo(torch.float32).max

# On the CPU the sampler's ops run on one thread (``on_one_cpu_thread``), whatever torch's count.
# A step's rows are small: a parallel region costs about what it saves there, and on cores that
# other work keeps busy a preempted helper thread stalls it (chat calls with tools on the bundled
# model beside one busy process: 80 -> 56-64 ms; docs/benchmarks.md). And a row's bits then do
# not depend on the thread count: a sum over one row of more than 32,768 logits (the top-p
# normaliser at a 128k vocabulary) is split between threads, and rounds otherwise at each count.


@on_one_cpu_thread
def sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Pick one token per row: (B, V) logits -> (B,) int64 token ids.

    Applies, in order: logit bias, the min_tokens mask, penalties, temperature, top-k / top-p /
    min-p; the engine applies any grammar mask to ``logits`` before calling. Greedy rows take the
    argmax and never touch a random generator. Random rows draw from :func:`processed_probs` by
    inverse CDF (``brisklm.sampling.categorical``), an exact categorical draw from one uniform per
    row; a row with its own generator draws that uniform from it alone, so its tokens do not
    depend on the rest of the batch; the other rows share the default generator in one batched op.
    On the CPU, where the native kernels run, temperature, the filters and the draw are one C
    pass over each row instead (:func:`native_draws`): the same kept tokens (but where a top-p or
    min-p threshold meets rounding, at the edge of a nearly flat row), probabilities within float32
    rounding of :func:`processed_probs`'.

    Every row must have at least one finite logit. ``logits`` is not modified.
    """
    x = _adjust_logits(logits, md)  # (B, V)
    if md.all_greedy:
        return greedy_tokens(x)
    uniforms = row_uniforms(x.shape[0], x.device, md.default_rng_rows, md.generators)
    tokens = native_draws(x, md, uniforms)
    if tokens is None:
        return inverse_cdf(_probs_from_adjusted(x, md), uniforms)
    if md.is_greedy is not None:
        tokens = torch.where(md.is_greedy, greedy_tokens(x), tokens)
    return tokens


@on_one_cpu_thread
def sample_with_probs(
    logits: torch.Tensor, md: SamplingMetadata, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, probs)``: ``inverse_cdf(processed_probs(logits, md), uniforms)`` and the
    distribution it drew from, ``processed_probs(logits, md)`` (speculative decoding's draft needs
    both). On the CPU, where the native kernels run, one C pass over each row gives both (as in
    :func:`native_draws`); ``md``'s generators are not read: ``uniforms`` are the draws."""
    x = _adjust_logits(logits, md)
    if md.all_greedy:
        tokens = greedy_tokens(x)
        return tokens, _one_hot(x, tokens)
    draw = _native_sampler(x, md)
    if draw is None:
        probs = _probs_from_adjusted(x, md)
        return inverse_cdf(probs, uniforms), probs
    probs = torch.empty(x.shape, dtype=torch.float32)
    tokens = torch.empty(x.shape[0], dtype=torch.int64)
    _run_native_sampler(draw, x, md, uniforms, tokens, probs)
    if md.is_greedy is not None:
        greedy = greedy_tokens(x)
        tokens = torch.where(md.is_greedy, greedy, tokens)
        probs = torch.where(md.is_greedy.unsqueeze(1), _one_hot(x, greedy), probs)
    return tokens, probs


def native_draws(
    x: torch.Tensor,
    md: SamplingMetadata,
    uniforms: torch.Tensor,
    probs: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """(B,) int64 tokens drawn from the rows of adjusted logits ``x`` (B, V) with ``uniforms``
    (B,) by the native kernels (``brisk_sample_rows`` in cpu_forward.c): temperature, top-k,
    top-p and min-p as :func:`processed_probs` applies them, then the draw of
    :func:`~brisklm.sampling.categorical.inverse_cdf`, ``NO_TOKEN`` where a row has nothing to
    draw. Greedy rows are drawn as random ones at temperature 1 (the caller replaces them).
    ``probs`` (B, V) float32, if given, receives each row's distribution. None where it does not
    run: not float32 logits on the CPU with rows of unit stride, or no native kernels.

    One C call for the batch: after a forward pass the torch ops took ~0.2 ms a step of one row of
    4,096 logits with a temperature alone, ~0.35 ms with top-p (docs/benchmarks.md)."""
    draw = _native_sampler(x, md)
    if draw is None:
        return None
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _run_native_sampler(draw, x, md, uniforms, out, probs)
    return out


def native_probs(x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor | None:
    """(B, V) float32: the distributions of :func:`native_draws` (temperature and the filters on
    the rows of adjusted logits ``x``), NaN in a row with nothing to draw, as torch's softmax gives
    it; greedy rows as random ones at temperature 1. None where the native kernels do not run."""
    compute = _native_sampler(x, md)
    if compute is None:
        return None
    probs = torch.empty(x.shape, dtype=torch.float32)
    _run_native_sampler(compute, x, md, None, None, probs)
    return probs


def _native_sampler(x: torch.Tensor, md: SamplingMetadata) -> Any:
    """The native kernels' ``brisk_sample_rows`` where it can take ``x`` and ``md``: float32
    logits on the CPU with rows of unit stride and md's vocabulary; else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
        return None
    if md.vocab_size != x.shape[1]:  # filter_rows marks top-k off with md's vocabulary size
        return None
    from brisklm.kernels import native

    return native.function("brisk_sample_rows")


def _run_native_sampler(
    draw: Any,
    x: torch.Tensor,
    md: SamplingMetadata,
    uniforms: torch.Tensor | None,
    out: torch.Tensor | None,
    probs: torch.Tensor | None,
) -> None:
    """One ``brisk_sample_rows`` call: ``out`` (B,) int64 gets the draws with ``uniforms`` (B,)
    (both or neither), ``probs`` the distributions."""
    rows, vocab = x.shape
    if uniforms is not None:
        uniforms = uniforms.to(torch.float64).contiguous()
    if probs is not None and (
        probs.shape != x.shape or probs.dtype != torch.float32 or not probs.is_contiguous()
    ):
        raise ValueError(f"probs must be a contiguous float32 tensor of shape {tuple(x.shape)}")
    temperature, top_k, top_p, min_p = md.filter_rows
    failed = draw(
        x.data_ptr(),
        x.stride(0),
        rows,
        vocab,
        temperature.data_ptr(),
        top_k.data_ptr(),
        top_p.data_ptr(),
        min_p.data_ptr(),
        uniforms.data_ptr() if uniforms is not None else None,
        out.data_ptr() if out is not None else None,
        probs.data_ptr() if probs is not None else None,
    )
    if failed:
        raise MemoryError(f"no memory for the sampler's scratch rows ({4 * vocab} floats)")


@on_one_cpu_thread
def processed_probs(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """The (B, V) float32 distribution that :func:`sample` draws from; each row sums to 1.

    Greedy rows are a one-hot of their argmax. Speculative decoding's rejection sampler uses this
    for both target and draft so both go through exactly the same transforms. On the CPU, where
    the native kernels run, one C pass over each row computes it (:func:`native_probs`), to float32
    rounding of the torch ops (the kept tokens as :func:`sample` says); a row with nothing to draw
    is NaN either way."""
    x = _adjust_logits(logits, md)
    if md.all_greedy:
        return _one_hot_argmax(x)
    probs = native_probs(x, md)
    if probs is None:
        return _probs_from_adjusted(x, md)
    if md.is_greedy is not None:
        probs = torch.where(md.is_greedy.unsqueeze(1), _one_hot_argmax(x), probs)
    return probs


@on_one_cpu_thread
def torch_processed_probs(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """:func:`processed_probs` by torch's ops on any device: what it runs where the native kernels
    do not, and the reference the native pass is tested against."""
    return _probs_from_adjusted(_adjust_logits(logits, md), md)


@dataclass
class LogprobsTensors:
    """Logprobs of one step for B rows with K alternatives each."""

    chosen: torch.Tensor  # (B,) float32 logprob of the sampled token
    top_ids: torch.Tensor  # (B, K) int64, most likely first
    top_logprobs: torch.Tensor  # (B, K) float32, descending
    rank: torch.Tensor  # (B,) int64, 1 = most likely; 1 + number of strictly likelier tokens


@on_one_cpu_thread
def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, num_top: int
) -> LogprobsTensors:
    """Log-softmax (in float32) of ``logits`` (B, V) at ``token_ids`` (B,), with the top
    ``num_top`` alternatives per row (capped at V) and the rank of each chosen token.

    The engine passes the raw model logits, so these are logprobs of the model's own distribution
    before bias, penalties, temperature and filters, which is vLLM's default too.
    """
    if num_top < 0:
        raise ValueError(f"num_top={num_top} is invalid: must be >= 0")
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
    chosen = logprobs.gather(1, token_ids.long().unsqueeze(1)).squeeze(1)  # (B,)
    rank = (logprobs > chosen.unsqueeze(1)).sum(dim=-1) + 1  # (B,)
    top_logprobs, top_ids = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)  # (B, K)
    return LogprobsTensors(chosen=chosen, top_ids=top_ids, top_logprobs=top_logprobs, rank=rank)


def _adjust_logits(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Logit bias, min_tokens mask and penalties: the steps greedy rows share with random ones."""
    x = logits.float()
    if md.no_logit_bias and md.no_min_tokens and md.no_penalties:
        return x  # the common case costs nothing, not even a copy
    if x is logits:
        x = x.clone()  # the caller's logits stay untouched
    if md.logit_bias_rows is not None:
        x.index_put_((md.logit_bias_rows, md.logit_bias_ids), md.logit_bias_values, accumulate=True)
    if md.min_tokens_rows is not None:
        x.index_put_((md.min_tokens_rows, md.min_tokens_ids), x.new_tensor(float("-inf")))
    if md.repetition_penalty is not None:
        penalty = md.repetition_penalty.unsqueeze(1)  # (B, 1)
        # A tiny penalty overflows x / penalty to inf, and inf - inf is NaN once the row max is
        # subtracted: the largest finite float is the same "far above every other token".
        penalised = torch.where(x > 0, x / penalty, x * penalty).clamp_(max=_FLOAT32_MAX)
        x = torch.where(md.seen_mask, penalised, x)
    if md.output_counts is not None:
        counts = md.output_counts  # (B, V)
        x = x - md.frequency_penalty.unsqueeze(1) * counts
        x = x - md.presence_penalty.unsqueeze(1) * (counts > 0).float()
    return x


def _probs_from_adjusted(x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Temperature and filters on adjusted logits (B, V) -> the (B, V) sampling distribution."""
    if md.all_greedy:
        return _one_hot_argmax(x)
    greedy_one_hot = None if md.is_greedy is None else _one_hot_argmax(x)
    # Shifting by the row max first keeps x / T finite for tiny T (no inf - inf = NaN later).
    x = (x - x.amax(dim=-1, keepdim=True)).div_(md.temperature.unsqueeze(1))
    if md.top_k is not None or md.top_p is not None:
        x = _apply_top_k_top_p(x, md)
    if md.min_p is not None:
        x = _apply_min_p(x, md.min_p)
    probs = x.softmax(dim=-1)
    if greedy_one_hot is not None:
        probs = torch.where(md.is_greedy.unsqueeze(1), greedy_one_hot, probs)
    return probs


def greedy_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B,) int64: each row's argmax (the first largest value), ``NO_TOKEN`` for a row holding a
    NaN (argmax would take the first NaN as the largest: a model whose logits were all NaN wrote
    token 0 again and again, where a sampled row's request fails saying so).

    On CPU through ``max(dim=-1)``, whose indices are ``argmax``'s: torch's CPU argmax compares one
    element at a time (41 us for a row of 32,000 logits, 160 us at 128,256, on a 2-vCPU Xeon)
    where ``max`` takes 15 and 62 us; its values say whether the largest is NaN."""
    if x.device.type == "cpu":
        values, tokens = x.max(dim=-1)
    else:
        tokens = x.argmax(dim=-1)
        values = x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(values.isnan(), NO_TOKEN, tokens)


def _one_hot_argmax(x: torch.Tensor) -> torch.Tensor:
    return _one_hot(x, greedy_tokens(x))


def _one_hot(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each row one-hot at its token; NaN for ``NO_TOKEN`` (nothing to draw, as a sampled row's
    distribution says it)."""
    hot = torch.zeros_like(x).scatter_(1, tokens.clamp(min=0).unsqueeze(1), 1.0)
    none = (tokens < 0).unsqueeze(1)
    # On CPU the test is cheaper than the fill; on CUDA it would read back to the host each step.
    if hot.device.type == "cpu" and not bool(none.any()):
        return hot
    return hot.masked_fill_(none, float("nan"))


def _apply_top_k_top_p(x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Mask to -inf everything outside each row's top-k, then outside its top-p nucleus.

    Both filters become one threshold per row, compared against the logits, so every token tied
    with the last kept one is kept too: which of several equal tokens a sort puts first is
    arbitrary (and differs across devices), so keeping some and not others would be too. Top-p
    keeps the smallest prefix whose probability (renormalised after top-k) reaches p, at least one
    token, plus its ties.
    """
    if md.top_k is None:
        assert md.top_p is not None
        threshold = _nucleus_threshold(x, md.top_p.unsqueeze(1))
        return x.masked_fill(x < threshold, float("-inf"))
    # With top-p as well, one value past the largest k tells whether ties run past the list.
    top_values, threshold = _top_k_threshold(x, md, extra=0 if md.top_p is None else 1)
    if md.top_p is not None:
        top_p = md.top_p.unsqueeze(1)
        nucleus = _nucleus_within_top_k(top_values, threshold, top_p, x.shape[-1])
        if nucleus is None:  # the list may not hold every kept token: renormalise over the row
            nucleus = _nucleus_threshold(x.masked_fill(x < threshold, float("-inf")), top_p)
        threshold = torch.maximum(threshold, nucleus)
    return x.masked_fill(x < threshold, float("-inf"))


def _top_k_threshold(
    x: torch.Tensor, md: SamplingMetadata, extra: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K) each row's ``max_top_k + extra`` largest logits, descending, and (B, 1) its k-th
    largest (-inf where top-k is off): only the largest values are needed, not a full sort."""
    assert md.top_k is not None
    top_values = largest_values(x, min(md.max_top_k + extra, x.shape[-1]))  # (B, K)
    top_k = md.top_k.unsqueeze(1)  # (B, 1), V where disabled
    kth = top_values.gather(1, top_k.clamp(max=md.max_top_k) - 1)  # (B, 1)
    return top_values, kth.masked_fill(top_k >= x.shape[-1], float("-inf"))


def _nucleus_within_top_k(
    top_values: torch.Tensor, kth: torch.Tensor, top_p: torch.Tensor, vocab_size: int
) -> torch.Tensor | None:
    """(B, 1) top-p thresholds computed on the listed top values alone; None where not exact.

    After top-k a row's mass lies in its tokens at or above its k-th largest logit. The list holds
    them all when its last value is below that (or it covers the whole vocabulary); a row without
    top-k, or whose k-th value ties the last listed one, needs the whole row, and then the caller
    falls back. At a 128k vocabulary this skips four passes over the row.
    """
    if top_values.shape[-1] < vocab_size:
        unlisted = (top_values[:, -1:] >= kth) & (top_p < 1.0)
        if bool(unlisted.any()):
            return None
    kept = top_values.masked_fill(top_values < kth, float("-inf"))
    cumulative = (kept - kept[:, :1]).exp().cumsum(dim=-1)  # descending: the first is the max
    cumulative = cumulative / cumulative[:, -1:]
    return _last_kept(top_values, cumulative, top_p, top_p >= 1.0)


def _nucleus_threshold(x: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """(B, 1) logit of the last token of each row's nucleus (-inf where top_p >= 1: keep all)."""
    vocab_size = x.shape[-1]
    row_max = x.amax(dim=-1, keepdim=True)
    total = (x - row_max).exp().sum(dim=-1, keepdim=True)  # softmax normaliser, -inf -> 0
    keep_all = top_p >= 1.0  # rounding can leave the cumulative sum just under 1
    if _TOP_P_PREFIX < vocab_size:
        values = largest_values(x, _TOP_P_PREFIX)  # (B, P), descending
        cumulative = (values - row_max).exp().cumsum(dim=-1) / total
        if bool((keep_all | (cumulative[:, -1:] >= top_p)).all()):
            return _last_kept(values, cumulative, top_p, keep_all)
    values = largest_values(x, vocab_size)  # (B, V): the whole row sorted
    cumulative = (values - row_max).exp().cumsum(dim=-1) / total
    return _last_kept(values, cumulative, top_p, keep_all)


def largest_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k) each row of ``x`` (B, V)'s k largest values in descending order, the values of
    ``x.topk(k)`` (NaN counts as the largest, as there). On CPU through numpy's partition and
    sort, 2-3x faster than torch's topk and sort there (8 rows of 32k logits: 0.44 ms against
    1.38 ms for the top 256)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.dim() != 2:
        return x.topk(k, dim=-1).values
    rows = x.detach().numpy()
    vocab_size = rows.shape[-1]
    if k < vocab_size:  # the k largest, unordered, then ordered
        rows = np.partition(rows, vocab_size - k, axis=-1)[:, vocab_size - k :]
    return torch.from_numpy(np.sort(rows, axis=-1)[:, ::-1].copy())


def _last_kept(
    values: torch.Tensor, cumulative: torch.Tensor, top_p: torch.Tensor, keep_all: torch.Tensor
) -> torch.Tensor:
    """The value at the smallest prefix of ``values`` whose ``cumulative`` mass reaches top_p."""
    num_keep = (cumulative < top_p).sum(dim=-1, keepdim=True) + 1  # (B, 1), at least one
    threshold = values.gather(1, num_keep.clamp_(max=values.shape[-1]) - 1)
    return threshold.masked_fill(keep_all, float("-inf"))


def _apply_min_p(x: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below min_p times the row's largest probability."""
    probs = x.softmax(dim=-1)  # (B, V)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)  # (B, 1)
    return x.masked_fill(probs < threshold, float("-inf"))
