"""The native kernels' sampler (brisk_sample_rows through sampler.native_draws, native_probs and
sample_with_probs) against the torch ops it replaces on the CPU: torch_processed_probs for the
distribution, inverse_cdf for the draw."""

import pytest
import torch

from brisklm.kernels import native
from brisklm.sampling import SamplingParams, processed_probs, sample
from brisklm.sampling.categorical import NO_TOKEN, inverse_cdf
from brisklm.sampling.sampler import native_draws, sample_with_probs, torch_processed_probs

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")

FILTERS = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=40),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=200, top_p=0.8),
    SamplingParams(temperature=0.8, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.95, min_p=0.02),
    SamplingParams(temperature=1e-3, top_p=0.5),
    SamplingParams(temperature=5.0, top_p=0.99),
]


def count_calls(monkeypatch, name: str) -> list[int]:
    """A list that gets a 1 at each call of ``brisklm.sampling.sampler``'s function ``name``."""
    from brisklm.sampling import sampler

    calls: list[int] = []
    original = getattr(sampler, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(sampler, name, counted)
    return calls


def native_pass(logits: torch.Tensor, md) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.empty_like(logits)
    uniforms = torch.full((logits.shape[0],), 0.5, dtype=torch.float64)
    tokens = native_draws(logits, md, uniforms, probs)
    assert tokens is not None
    return tokens, probs


@pytest.mark.parametrize("vocab", [7, 300, 4096, 32000])
def test_the_distribution_is_processed_probs_own(build_md, vocab: int) -> None:
    """Each filter keeps the same tokens as the torch ops, with the same probabilities to float32
    rounding, on logits with masked (-inf) tokens as a grammar leaves them. At the edge of a flat
    row's nucleus (temperature 5, top-p 0.99 over 32,000 tokens) the float64 sums here and torch's
    float32 cumsum may keep one token more or less: at most one here, of little mass."""
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(len(FILTERS), vocab, generator=generator) * 3
    logits[:, ::5] = float("-inf")
    md = build_md(FILTERS, vocab)
    want = torch_processed_probs(logits, md)
    _, got = native_pass(logits, md)
    # Below e^-87 of the largest the C exp gives no mass (torch's gives up to 1e-38).
    kept_here, kept_there = got > 0, want > 1e-30
    assert not (kept_here & (want == 0)).any()
    for row in range(len(FILTERS)):
        differ = kept_here[row] != kept_there[row]
        assert differ.sum().item() <= (1 if FILTERS[row].top_p < 1.0 else 0), row
        assert (want[row][differ].sum() + got[row][differ].sum()).item() < 1e-4
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-6)
    assert torch.allclose(got.double().sum(-1), torch.ones(len(FILTERS), dtype=torch.float64))


def test_a_nucleus_past_the_first_256_tokens(build_md) -> None:
    """Flat logits whose nucleus needs most of the row: the search goes past its first prefix."""
    logits = torch.linspace(0.0, -0.5, 2000).unsqueeze(0)
    md = build_md([SamplingParams(temperature=1.0, top_p=0.9)], 2000)
    want = torch_processed_probs(logits, md)
    _, got = native_pass(logits, md)
    assert (want > 0).sum().item() > 1500
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("params", [SamplingParams(top_p=0.5), SamplingParams(top_k=20000)])
def test_a_row_shaped_as_a_v(build_md, params: SamplingParams) -> None:
    """Its smallest values in the middle, each twice: with the middle element as their pivot the
    quickselects took quadratic time here (seconds at 128k); the tokens kept are the torch ops'."""
    vocab = 65536
    index = torch.arange(vocab)
    logits = (torch.maximum(index, vocab - 1 - index) * (2.6 / vocab) - 2.6).unsqueeze(0)
    md = build_md([params], vocab)
    want = torch_processed_probs(logits, md)
    _, got = native_pass(logits, md)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-7)


def test_ties_with_the_last_kept_token_are_kept(build_md) -> None:
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]])
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.3)]
    md = build_md(params, 6)
    _, got = native_pass(logits, md)
    assert (got > 0).tolist() == [
        [True, True, True, True, False, False],
        [True, True, True, True, False, False],
    ]
    assert torch.equal(got > 0, torch_processed_probs(logits, md) > 0)


def test_draws_are_inverse_cdf_s_on_the_distribution(build_md) -> None:
    """A uniform halfway between two of the torch cdf's steps draws the same token both ways; 0
    draws the first token with mass and the float64 just under 1 the last."""
    vocab = 40
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(3)) * 2
    logits[0, 0] = float("-inf")
    logits[0, -1] = float("-inf")
    md = build_md([SamplingParams(temperature=0.9, top_k=25)], vocab)
    probs = torch_processed_probs(logits, md)
    cdf = probs[0].double().cumsum(0)
    steps = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[probs[0] > 0]])
    middles = ((steps[:-1] + steps[1:]) / 2).tolist()
    uniforms = torch.tensor([0.0, *middles, 1.0 - 2**-53], dtype=torch.float64)
    rows = logits.expand(len(uniforms), vocab).contiguous()
    md = build_md([SamplingParams(temperature=0.9, top_k=25)] * len(uniforms), vocab)
    got = native_draws(rows, md, uniforms)
    want = inverse_cdf(torch_processed_probs(rows, md), uniforms)
    assert got is not None
    assert got.tolist() == want.tolist()
    kept = torch.nonzero(probs[0] > 0).squeeze(1).tolist()
    assert got[0].item() == kept[0] and got[-1].item() == kept[-1]
    assert sorted(set(got[1:-1].tolist())) == kept  # every kept token, each at its own step


def test_rows_with_nothing_to_draw_give_no_token_alone(build_md) -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(4))
    logits[1, 7] = float("nan")
    logits[2, 3] = float("inf")
    logits[3] = float("-inf")
    md = build_md([SamplingParams(temperature=0.8, top_p=0.9)] * 5, 50)
    tokens, _ = native_pass(logits, md)
    assert tokens[1:4].tolist() == [NO_TOKEN] * 3
    assert 0 <= tokens[0].item() < 50 and 0 <= tokens[4].item() < 50
    assert (
        inverse_cdf(torch_processed_probs(logits, md), torch.full((5,), 0.5))[1:4].tolist()
        == [NO_TOKEN] * 3
    )


def test_sample_draws_natively_and_keeps_greedy_rows_argmax(build_md, monkeypatch) -> None:
    """sample() on the CPU goes through native_draws with the rows' own seeded uniforms, and a
    greedy row in the batch still takes its argmax."""
    calls = count_calls(monkeypatch, "native_draws")
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(5))
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=11),
        SamplingParams.greedy(),
        SamplingParams(temperature=1.2, top_k=30, seed=12),
    ]
    tokens = sample(logits, build_md(params, 500))
    assert calls == [1]
    assert tokens[1].item() == logits[1].argmax().item()
    for row in (0, 2):
        alone = sample(logits[row : row + 1], build_md([params[row]], 500))
        assert alone.item() == tokens[row].item()  # the same seed, whatever the batch
        uniform = torch.rand(
            1, dtype=torch.float64, generator=torch.Generator().manual_seed(params[row].seed)
        )
        md = build_md([params[row]], 500)
        assert inverse_cdf(torch_processed_probs(logits[row : row + 1], md), uniform).item() == (
            tokens[row].item()
        )


def test_not_run_where_it_does_not_apply(build_md) -> None:
    md = build_md([SamplingParams(temperature=0.7)], 8)
    uniforms = torch.full((1,), 0.5, dtype=torch.float64)
    assert native_draws(torch.randn(1, 8).double(), md, uniforms) is None
    assert native_draws(torch.randn(1, 16)[:, ::2], md, uniforms) is None  # strided rows
    with pytest.raises(ValueError, match="probs must be"):
        native_draws(torch.randn(1, 8), md, uniforms, torch.empty(1, 9))


def test_processed_probs_runs_the_native_pass_with_nan_rows_and_one_hot_greedy_rows(
    build_md, monkeypatch
) -> None:
    """processed_probs on the CPU is one native pass: a row with nothing to draw is NaN, as the
    torch ops give it, a greedy row the one-hot of its argmax, the others the torch ops' own."""
    calls = count_calls(monkeypatch, "_run_native_sampler")
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(6)) * 2
    logits[1, 7] = float("nan")
    logits[3] = float("-inf")
    params = [
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=0.8),
        SamplingParams.greedy(),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.1, min_p=0.1),
    ]
    md = build_md(params, 300)
    got = processed_probs(logits, md)
    want = torch_processed_probs(logits, md)
    assert calls == [1]
    assert got[1].isnan().all() and got[3].isnan().all()
    assert want[1].isnan().all() and want[3].isnan().all()
    assert torch.equal(got[2], torch.nn.functional.one_hot(logits[2].argmax(), 300).float())
    for row in (0, 2, 4):
        assert torch.equal(got[row] > 0, want[row] > 0), row
        torch.testing.assert_close(got[row], want[row], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("path", ["native pass", "torch ops"])
def test_sample_with_probs_draws_from_the_distribution_it_returns(
    build_md, path: str, request
) -> None:
    """The draft's draw and q at once: its tokens are inverse_cdf's on the torch ops'
    distribution with the same uniforms (each a middle between two steps of the cdf, so rounding
    cannot move it), its q that distribution; greedy rows take the argmax and a one-hot."""
    if path == "torch ops":
        request.getfixturevalue("torch_ops_only")
    vocab = 64
    base = torch.randn(1, vocab, generator=torch.Generator().manual_seed(8)) * 2
    params = SamplingParams(temperature=0.9, top_p=0.95)
    want_one = torch_processed_probs(base, build_md([params], vocab))[0]
    cdf = want_one.double().cumsum(0)
    steps = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[want_one > 0]])
    middles = ((steps[:-1] + steps[1:]) / 2).tolist()
    rows = len(middles) + 1
    logits = base.expand(rows, vocab).contiguous()
    all_params = [params] * len(middles) + [SamplingParams.greedy()]
    md = build_md(all_params, vocab)
    uniforms = torch.tensor([*middles, 0.5], dtype=torch.float64)
    tokens, probs = sample_with_probs(logits, md, uniforms)
    want = torch_processed_probs(logits, md)
    assert tokens.tolist() == inverse_cdf(want, uniforms).tolist()
    assert sorted(set(tokens[:-1].tolist())) == torch.nonzero(want_one > 0).squeeze(1).tolist()
    assert tokens[-1].item() == base[0].argmax().item()
    assert torch.equal(probs > 0, want > 0)
    torch.testing.assert_close(probs, want, rtol=1e-4, atol=1e-7)
