"""Inverse-CDF categorical draws, per-row uniforms, and the top-p prefix shortcut of the sampler."""

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from brisklm.sampling import SamplingParams, processed_probs, sample
from brisklm.sampling import sampler as sampler_module
from brisklm.sampling.categorical import NO_TOKEN, inverse_cdf, row_uniforms, uniforms_for_rows


def draw(dist: list[float], u: float) -> int:
    return int(inverse_cdf(torch.tensor([dist]), torch.tensor([u], dtype=torch.float64))[0])


def test_boundaries_and_zero_mass_tokens():
    dist = [0.25, 0.0, 0.5, 0.25]
    got = [draw(dist, u) for u in (0.0, 0.2499, 0.25, 0.7499, 0.75, 0.999999)]
    assert got == [0, 0, 2, 2, 3, 3]  # token 1 has no mass and is never drawn


def test_unnormalised_rows_draw_the_same():
    dist = [0.25, 0.0, 0.5, 0.25]
    for u in (0.1, 0.3, 0.8):
        assert draw([10 * p for p in dist], u) == draw(dist, u)


def test_rows_of_a_batch_are_drawn_independently():
    generator = torch.Generator().manual_seed(0)
    dist = torch.rand(6, 50, generator=generator) * (torch.rand(6, 50, generator=generator) > 0.5)
    dist[:, 0] += 0.1  # every row has mass
    uniforms = torch.rand(6, dtype=torch.float64, generator=generator)
    batched = inverse_cdf(dist, uniforms)
    for row in range(6):
        assert batched[row] == inverse_cdf(dist[row : row + 1], uniforms[row : row + 1])[0]
        assert dist[row, batched[row]] > 0


@pytest.mark.usefixtures("either_sampler_path")
def test_a_row_with_nothing_to_draw_gives_no_token_and_leaves_the_others_alone(build_md):
    # Logits holding NaN or +inf make NaN probabilities (x - max is NaN or inf - inf); a row whose
    # every token is masked has no mass. Drawing such a row used to return the last token, one of
    # zero probability (a padded vocabulary's non-token, say).
    nan = float("nan")
    good = [0.2, 0.3, 0.5, 0.0]
    dist = torch.tensor([good, [0.2, nan, 0.5, 0.0], good, [0.0] * 4, [nan] * 4, good])
    uniforms = torch.tensor([0.1, 0.5, 0.6, 0.5, 0.5, 0.99], dtype=torch.float64)
    got = inverse_cdf(dist, uniforms).tolist()
    assert got[1] == got[3] == got[4] == NO_TOKEN
    assert [got[0], got[2], got[5]] == [draw(good, 0.1), draw(good, 0.6), draw(good, 0.99)]
    assert NO_TOKEN < 0  # never a token id
    logits = torch.tensor([[1.0, 2.0, float("inf"), 0.0], [1.0, nan, 0.0, 0.0]])
    md = SamplingParams(temperature=1.0, seed=3)
    assert sample(logits, build_md([md, md], 4)).tolist() == [NO_TOKEN, NO_TOKEN]


def test_rounding_past_the_total_takes_the_last_token_with_mass():
    # u * total rounding up to the total is simulated with u = 1: tokens 2 and 3 have no mass.
    assert draw([0.5, 0.5, 0.0, 0.0], 1.0) == 1
    assert draw([0.5, 0.5, 0.25, 0.0], 1.0) == 2


def test_large_vocabulary_tail_keeps_its_mass():
    # 0.7 on two tokens, 0.3 spread over 4094: float32 sums would distort the tail's share.
    vocab, rows = 4096, 3000
    dist = torch.full((vocab,), 0.3 / (vocab - 2), dtype=torch.float32)
    dist[:2] = torch.tensor([0.4, 0.3])
    torch.manual_seed(5)
    tokens = inverse_cdf(dist.expand(rows, -1), torch.rand(rows, dtype=torch.float64))
    counts = torch.bincount(tokens, minlength=vocab).float() / rows
    # 3000 draws: the standard error of each share is at most 0.009.
    assert abs(counts[0] - 0.4) < 0.04 and abs(counts[1] - 0.3) < 0.04
    assert abs(counts[2:].sum() - 0.3) < 0.04


def test_row_uniforms_draw_once_per_seeded_row_and_never_for_others():
    seeded = torch.Generator().manual_seed(3)
    torch.manual_seed(9)
    out = row_uniforms(4, "cpu", [1, 3], {2: seeded})
    replay_default = torch.Generator().manual_seed(9)
    expected_default = torch.rand(2, dtype=torch.float64, generator=replay_default)
    replay_seeded = torch.Generator().manual_seed(3)
    expected_seeded = torch.rand(1, dtype=torch.float64, generator=replay_seeded)
    assert out[0] == 0.5  # greedy: draws nothing
    assert torch.equal(out[[1, 3]], expected_default)
    assert out[2] == expected_seeded[0]
    assert torch.equal(seeded.get_state(), replay_seeded.get_state())
    assert torch.equal(torch.get_rng_state(), replay_default.get_state())


def test_row_uniforms_take_default_rows_as_a_tensor():
    """SamplingMetadata keeps its default rows as a tensor: the same draws as from a list."""
    torch.manual_seed(4)
    from_list = row_uniforms(3, "cpu", [0, 2], {})
    torch.manual_seed(4)
    from_tensor = row_uniforms(3, "cpu", torch.tensor([0, 2]), {})
    assert from_tensor.dtype == torch.float64 and torch.equal(from_list, from_tensor)
    assert from_tensor[1] == 0.5


def test_row_uniforms_all_default_rows():
    torch.manual_seed(2)
    out = row_uniforms(3, "cpu", None, {})
    torch.manual_seed(2)
    assert torch.equal(out, torch.rand(3, dtype=torch.float64))


def reference_nucleus(logits: torch.Tensor, temperature: float, top_k: int, top_p: float):
    scores = TemperatureLogitsWarper(temperature)(None, logits[None].clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    return TopPLogitsWarper(top_p)(None, scores).softmax(-1)[0]


@pytest.fixture
def nucleus_widths(monkeypatch, torch_ops_only) -> list[int]:
    """How many sorted values each top-p threshold search of the torch ops looked at (a spy on
    _last_kept)."""
    widths: list[int] = []
    last_kept = sampler_module._last_kept

    def spy(values, *args):
        widths.append(values.shape[-1])
        return last_kept(values, *args)

    monkeypatch.setattr(sampler_module, "_last_kept", spy)
    return widths


PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=1.0, top_p=0.5, top_k=100),
    SamplingParams(temperature=1.0, top_p=1.0, top_k=0),  # filters off
    SamplingParams(temperature=1.0, top_p=0.9),
]


@pytest.mark.parametrize(
    ("rows", "searched"),
    # Peaked rows: every nucleus lies inside the top 256, which is all the sampler looks at. With a
    # flat row (nucleus of ~2700 tokens) the prefix does not reach p and the rows are sorted whole.
    [(3, 256), (4, 3000)],
    ids=["peaked-prefix", "flat-row-full-sort"],
)
def test_top_p_matches_transformers_on_both_paths(rows, searched, build_md, nucleus_widths):
    widths = nucleus_widths
    generator = torch.Generator().manual_seed(11)
    vocab = 3000
    peaked = torch.randn(3, vocab, generator=generator) * 6
    flat = torch.randn(1, vocab, generator=generator) * 0.1
    logits = torch.cat([peaked, flat])[:rows]
    probs = processed_probs(logits, build_md(PARAMS[:rows], vocab))
    assert widths == [searched]
    for row, p in enumerate(PARAMS[:rows]):
        expected = reference_nucleus(logits[row], p.temperature, p.top_k, p.top_p)
        assert torch.equal(probs[row] > 0, expected > 0), f"row {row}"
        torch.testing.assert_close(probs[row], expected, atol=1e-6, rtol=1e-5)


TOP_K_PARAMS = [
    SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=200, top_p=0.5),
    SamplingParams(temperature=1.0, top_k=7, top_p=1.0),  # top-k only
    SamplingParams(temperature=1.3, top_k=20, top_p=0.95),  # on the flat row
]


def test_top_k_with_top_p_finds_the_nucleus_among_the_top_k_values(build_md, nucleus_widths):
    widths = nucleus_widths
    generator = torch.Generator().manual_seed(12)
    vocab = 3000
    logits = torch.cat(
        [
            torch.randn(3, vocab, generator=generator) * 4,
            torch.randn(1, vocab, generator=generator) * 0.1,
        ]
    )
    probs = processed_probs(logits, build_md(TOP_K_PARAMS, vocab))
    assert widths == [201]  # the largest k plus one value, never the whole row
    for row, p in enumerate(TOP_K_PARAMS):
        expected = reference_nucleus(logits[row], p.temperature, p.top_k, p.top_p)
        assert torch.equal(probs[row] > 0, expected > 0), f"row {row}"
        torch.testing.assert_close(probs[row], expected, atol=1e-6, rtol=1e-5)


@pytest.mark.usefixtures("either_sampler_path")
def test_top_k_with_top_p_falls_back_to_the_row_when_ties_run_past_the_list(build_md):
    # Top-k 2 keeps the 2.0 and every 1.0 (ties with the 2nd value), more than the 3 values
    # listed; the nucleus is then computed on the whole row.
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 1.0, 0.0, -1.0]])
    md = build_md([SamplingParams(top_k=2, top_p=0.9)], 7)
    probs = processed_probs(logits, md)[0]
    assert (probs > 0).tolist() == [True] * 5 + [False] * 2
    kept = torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0]).softmax(-1)
    torch.testing.assert_close(probs[:5], kept)
    # A mixed batch with a row that has no top-k falls back too, and gives each row its own.
    # (Row 0: 2.0 holds 0.405 of the top-k mass; row 1: 0.376 of the row's, so the 1.0s join.)
    md = build_md([SamplingParams(top_k=2, top_p=0.3), SamplingParams(top_p=0.5)], 7)
    probs = processed_probs(logits.repeat(2, 1), md)
    assert (probs > 0).sum(-1).tolist() == [1, 5]


@pytest.mark.usefixtures("either_sampler_path")
def test_sampled_tokens_stay_inside_the_nucleus_at_a_large_vocabulary(build_md):
    generator = torch.Generator().manual_seed(4)
    vocab = 32000
    logits = torch.randn(8, vocab, generator=generator) * 5
    md = build_md([SamplingParams(temperature=0.7, top_p=0.8, seed=s) for s in range(8)], vocab)
    tokens = sample(logits, md)
    allowed = processed_probs(logits, md) > 0
    assert allowed.gather(1, tokens[:, None]).all()


def test_uniforms_for_rows_from_flags_and_generators():
    seeded = torch.Generator().manual_seed(6)
    torch.manual_seed(1)
    out = uniforms_for_rows([True, False, False], [None, None, seeded], "cpu")
    torch.manual_seed(1)
    expected_default = torch.rand(1, dtype=torch.float64)
    expected_seeded = torch.rand(1, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    assert out.tolist() == [0.5, expected_default.item(), expected_seeded.item()]
