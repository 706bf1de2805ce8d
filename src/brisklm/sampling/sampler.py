"""The pure sampler: logits and SamplingMetadata in, token ids / processed distribution / logprobs out."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from brisklm.sampling.metadata import SamplingMetadata

# Exponential draws are clamped to this so that p / q is never 0 / 0 (NaN wins argmax).
_MIN_EXPONENTIAL = torch.finfo(torch.float32).tiny


def sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Pick one token per row: (B, V) logits -> (B,) int64 token ids.

    Applies, in order: logit bias, the min_tokens mask, penalties, temperature, top-k / top-p /
    min-p; the engine applies any grammar mask to ``logits`` before calling. Greedy rows take the
    argmax and never touch a random generator. Random rows draw from :func:`processed_probs` by an
    exponential race (argmax of p / q with q ~ Exp(1)), which is an exact categorical draw; a row
    with its own generator draws all of its noise from that generator alone, so its tokens do not
    depend on the rest of the batch; the other rows share the default generator in one batched op.

    Every row must have at least one finite logit. ``logits`` is not modified.
    """
    x = _adjust_logits(logits, md)  # (B, V)
    if md.all_greedy:
        return x.argmax(dim=-1)
    probs = _probs_from_adjusted(x, md)  # (B, V)
    return _exponential_race(probs, md)


def processed_probs(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """The (B, V) float32 distribution that :func:`sample` draws from; each row sums to 1.

    Greedy rows are a one-hot of their argmax. Speculative decoding's rejection sampler uses this
    for both target and draft so both go through exactly the same transforms."""
    return _probs_from_adjusted(_adjust_logits(logits, md), md)


@dataclass
class LogprobsTensors:
    """Logprobs of one step for B rows with K alternatives each."""

    chosen: torch.Tensor  # (B,) float32 logprob of the sampled token
    top_ids: torch.Tensor  # (B, K) int64, most likely first
    top_logprobs: torch.Tensor  # (B, K) float32, descending
    rank: torch.Tensor  # (B,) int64, 1 = most likely; 1 + number of strictly likelier tokens


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
        penalised = torch.where(x > 0, x / penalty, x * penalty)
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
    x = (x - x.amax(dim=-1, keepdim=True)) / md.temperature.unsqueeze(1)
    if md.top_k is not None or md.top_p is not None:
        x = _apply_top_k_top_p(x, md)
    if md.min_p is not None:
        x = _apply_min_p(x, md.min_p)
    probs = x.softmax(dim=-1)
    if greedy_one_hot is not None:
        probs = torch.where(md.is_greedy.unsqueeze(1), greedy_one_hot, probs)
    return probs


def _one_hot_argmax(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)


def _apply_top_k_top_p(x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Mask to -inf everything outside each row's top-k, then outside its top-p nucleus.

    Both filters become one threshold per row, compared against the logits, so every token tied
    with the last kept one is kept too: which of several equal tokens a sort puts first is
    arbitrary (and differs across devices), so keeping some and not others would be too. Top-p
    keeps the smallest prefix whose probability (renormalised after top-k) reaches p, at least one
    token, plus its ties.
    """
    vocab_size = x.shape[-1]
    if md.top_p is None:
        # Top-k alone needs only the largest max_top_k values, not a full sort.
        top_values = x.topk(md.max_top_k, dim=-1).values  # (B, K)
        top_k = md.top_k.unsqueeze(1)  # (B, 1), V where disabled
        kth = top_values.gather(1, top_k.clamp(max=md.max_top_k) - 1)  # (B, 1)
        kth = kth.masked_fill(top_k >= vocab_size, float("-inf"))
        return x.masked_fill(x < kth, float("-inf"))

    sorted_x = x.sort(dim=-1, descending=True).values  # (B, V)
    threshold = None
    if md.top_k is not None:
        threshold = sorted_x.gather(1, md.top_k.unsqueeze(1) - 1)  # (B, 1)
        sorted_x = sorted_x.masked_fill(sorted_x < threshold, float("-inf"))
    cumulative = sorted_x.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
    top_p = md.top_p.unsqueeze(1)  # (B, 1)
    num_keep = (cumulative < top_p).sum(dim=-1, keepdim=True) + 1  # (B, 1)
    # Rounding can leave the total just under 1 (or reach it early): top_p == 1 keeps everything.
    num_keep = torch.where(top_p >= 1.0, vocab_size, num_keep).clamp_(max=vocab_size)
    p_threshold = sorted_x.gather(1, num_keep - 1)  # (B, 1)
    threshold = p_threshold if threshold is None else torch.maximum(threshold, p_threshold)
    return x.masked_fill(x < threshold, float("-inf"))


def _apply_min_p(x: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below min_p times the row's largest probability."""
    probs = x.softmax(dim=-1)  # (B, V)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)  # (B, 1)
    return x.masked_fill(probs < threshold, float("-inf"))


def _exponential_race(probs: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """One categorical draw per row from (B, V) probs: argmax(p / q) with q ~ Exp(1) i.i.d."""
    q = torch.empty_like(probs)  # (B, V)
    if md.default_rng_rows is None:
        q.exponential_()  # every row is random and unseeded: one batched draw
    else:
        q.fill_(1.0)  # greedy rows are one-hot, so p / 1 keeps their argmax without any RNG
        num_default = md.default_rng_rows.numel()
        if num_default:
            noise = torch.empty((num_default, q.shape[1]), dtype=q.dtype, device=q.device)
            q[md.default_rng_rows] = noise.exponential_()
        for row, generator in md.generators.items():
            q[row].exponential_(generator=generator)
    q.clamp_min_(_MIN_EXPONENTIAL)
    return (probs / q).argmax(dim=-1)
