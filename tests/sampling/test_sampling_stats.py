"""Statistical tests: sampled token frequencies match the expected renormalised distributions."""

import pytest
import torch

from brisklm.sampling import SamplingParams, make_generator, sample

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
VOCAB_SIZE = LOGITS.numel()
NUM_SAMPLES = 20_000
# With 20k draws over 8 tokens the expected total variation of the empirical distribution is
# under 0.008; every "wrong" distribution below is at least 0.05 away from the right one, so an
# implementation of it would land about 0.04 from the right one, twice the bound.
TV_BOUND = 0.02
WRONG_MARGIN = 0.05


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p - q).abs().sum().item()


def renormalised(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum()


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Smallest set of most likely tokens with mass >= top_p (tie-free probs)."""
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass = 0.0
    for token in order.tolist():
        keep[token] = True
        mass += probs[token].item()
        if mass >= top_p:
            break
    return keep


def empirical(params: SamplingParams, build_md, num_samples: int = NUM_SAMPLES) -> torch.Tensor:
    torch.manual_seed(1234)
    md = build_md([params] * num_samples, VOCAB_SIZE)
    tokens = sample(LOGITS.expand(num_samples, -1), md)
    return torch.bincount(tokens, minlength=VOCAB_SIZE).float() / num_samples


def expected_and_wrong(params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The right distribution for params, computed directly, and a plausible wrong one."""
    t = params.temperature
    scaled = (LOGITS / t).softmax(-1)
    if params.top_k:
        keep = LOGITS >= LOGITS.sort(descending=True).values[params.top_k - 1]
        wrong_keep = LOGITS >= LOGITS.sort(descending=True).values[params.top_k]  # off by one
        return renormalised(scaled, keep), renormalised(scaled, wrong_keep)
    if params.top_p < 1.0:
        right = renormalised(scaled, nucleus(scaled, params.top_p))
        # Nucleus taken before temperature instead of after.
        return right, renormalised(scaled, nucleus(LOGITS.softmax(-1), params.top_p))
    if params.min_p > 0.0:
        right = renormalised(scaled, scaled >= params.min_p * scaled.max())
        base = LOGITS.softmax(-1)
        return right, renormalised(scaled, base >= params.min_p * base.max())  # before temperature
    return scaled, (LOGITS * t).softmax(-1)  # multiplied instead of divided


CASES = [
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=1.7),
    SamplingParams(top_k=3),
    SamplingParams(top_k=5, temperature=1.5),
    SamplingParams(top_p=0.7, temperature=0.6),
    SamplingParams(top_p=0.9, temperature=1.4),
    SamplingParams(min_p=0.2, temperature=2.0),
]


@pytest.mark.parametrize(
    "params", CASES, ids=lambda p: repr((p.temperature, p.top_k, p.top_p, p.min_p))
)
def test_sampled_distribution_matches(params: SamplingParams, build_md) -> None:
    expected, wrong = expected_and_wrong(params)
    assert total_variation(expected, wrong) > WRONG_MARGIN  # the test can tell them apart
    got = empirical(params, build_md)
    assert total_variation(got, expected) < TV_BOUND
    assert got[expected == 0].sum().item() == 0.0  # filtered tokens never drawn


def test_seeded_rows_sample_the_same_distribution(build_md) -> None:
    num_rows = 4000
    params = [SamplingParams(temperature=0.8, seed=seed) for seed in range(num_rows)]
    md = build_md(params, VOCAB_SIZE)
    assert len(md.generators) == num_rows
    tokens = sample(LOGITS.expand(num_rows, -1), md)
    got = torch.bincount(tokens, minlength=VOCAB_SIZE).float() / num_rows
    expected = (LOGITS / 0.8).softmax(-1)
    # 4000 draws: expected TV under 0.02.
    assert total_variation(got, expected) < 0.045
    assert total_variation(expected, LOGITS.softmax(-1)) > 0.045 + 0.02


def test_random_rows_in_a_mixed_batch(build_md) -> None:
    torch.manual_seed(99)
    params = [SamplingParams.greedy(), SamplingParams(top_k=4)] * (NUM_SAMPLES // 2)
    md = build_md(params, VOCAB_SIZE)
    assert md.default_rng_rows is not None and not md.all_greedy and not md.all_random
    tokens = sample(LOGITS.expand(len(params), -1), md)
    assert (tokens[0::2] == 0).all()
    got = torch.bincount(tokens[1::2], minlength=VOCAB_SIZE).float() / (NUM_SAMPLES // 2)
    expected = renormalised(LOGITS.softmax(-1), LOGITS >= LOGITS[3])
    assert total_variation(got, expected) < TV_BOUND * 1.5


def test_make_generator_only_for_seeded_random_rows() -> None:
    assert make_generator(SamplingParams(), "cpu") is None
    assert make_generator(SamplingParams.greedy(seed=3), "cpu") is None
    generator = make_generator(SamplingParams(seed=3), "cpu")
    assert generator is not None and generator.initial_seed() == 3
