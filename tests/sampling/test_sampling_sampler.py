"""Sampler correctness on hand-computed cases and against transformers' logits processors."""

import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from brisklm.kernels.omp import one_thread_works
from brisklm.sampling import SamplingParams, processed_probs, sample
from brisklm.sampling.categorical import NO_TOKEN, inverse_cdf
from brisklm.sampling.metadata import SamplingMetadata
from brisklm.sampling.sampler import compute_logprobs, largest_values

NEG_INF = float("-inf")

# Every test here runs through the native pass and through torch's ops (tests/sampling/conftest.py).
pytestmark = pytest.mark.usefixtures("either_sampler_path")


def reference_probs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """transformers' warper chain for one (V,) row, in its generate() order."""
    scores = logits.clone().unsqueeze(0)
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    if min_p > 0.0:
        scores = MinPLogitsWarper(min_p)(None, scores)
    return scores.softmax(-1).squeeze(0)


def test_greedy_is_argmax_and_never_touches_rng(build_md) -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    md = build_md([SamplingParams.greedy()] * 6, 50)
    state = torch.get_rng_state()
    assert torch.equal(sample(logits, md), logits.argmax(-1))
    assert torch.equal(torch.get_rng_state(), state)
    probs = processed_probs(logits, md)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 50).float())


@pytest.mark.parametrize("vocab", [7, 16, 17, 4096, 128256])
def test_greedy_tokens_are_argmax_s_on_ties_nan_and_infinities(build_md, vocab: int) -> None:
    """The greedy path takes max(dim)'s indices on CPU (argmax is scalar there): the same token as
    argmax, the first of tied maxima, rows of -inf, across thread splits; a row holding a NaN,
    which argmax takes as the largest, has no token (NO_TOKEN: its request fails saying so)."""
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 4, (8, vocab), generator=generator).float()  # many ties
    logits[1, torch.randint(0, vocab, (2,), generator=generator)] = float("nan")
    logits[2] = NEG_INF
    logits[3, vocab // 2 :] = float("inf")
    logits[4, 0] = -0.0
    logits[4, 1:] = 0.0
    md = build_md([SamplingParams.greedy()] * 8, vocab)
    expected = logits.argmax(-1)
    expected[1] = NO_TOKEN
    assert torch.equal(sample(logits, md), expected)
    assert torch.equal(sample(logits.double(), md), expected)
    # As a distribution (speculative verification, a greedy row beside sampled ones): one-hot at
    # the token, NaN for the row that has none, as a sampled row's says it.
    probs = processed_probs(logits, md)
    assert probs[1].isnan().all() and not probs[[0, 2, 3, 4]].isnan().any()
    rows = [0, 2, 3, 4, 5, 6, 7]
    one_hot = torch.nn.functional.one_hot(expected[rows], vocab).float()
    assert torch.equal(probs[rows], one_hot)


def test_plain_temperature_builds_no_optional_tensors(build_md) -> None:
    md = build_md([SamplingParams(temperature=0.8), SamplingParams()], 10)
    assert md.all_random and not md.all_greedy
    assert md.no_top_k and md.no_top_p and md.no_min_p and md.no_penalties
    assert md.no_logit_bias and md.no_min_tokens
    assert md.default_rng_rows is None and md.generators == {}
    md = build_md([SamplingParams.greedy(top_k=3, top_p=0.5, min_p=0.2)], 10)
    assert md.temperature is None and md.no_top_k and md.no_top_p and md.no_min_p


def test_logit_bias_changes_argmax_and_does_not_modify_input(build_md) -> None:
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 0.5, 0.2, 0.1]])
    original = logits.clone()
    md = build_md(
        [SamplingParams.greedy(logit_bias={2: 3.5}), SamplingParams.greedy(logit_bias={1: -100})],
        4,
    )
    assert sample(logits, md).tolist() == [2, 2]  # 0+3.5 > 3; 0.5-100 < 0.2
    assert torch.equal(logits, original)


def test_repetition_penalty_matches_transformers(build_md) -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 20) * 3
    prompts = [[1, 2, 2, 5], [7], []]
    outputs = [[5, 9], [], [3, 3, 4]]
    penalties = [1.3, 0.7, 2.0]
    params = [SamplingParams(repetition_penalty=r) for r in penalties]
    got = processed_probs(logits, build_md(params, 20, prompts, outputs))
    for row in range(3):
        ids = torch.tensor([prompts[row] + outputs[row]], dtype=torch.long).reshape(1, -1)
        ref = RepetitionPenaltyLogitsProcessor(penalties[row])(ids, logits[row : row + 1].clone())
        torch.testing.assert_close(got[row], ref.softmax(-1)[0])


def test_presence_and_frequency_penalties_follow_openai_formula(build_md) -> None:
    torch.manual_seed(2)
    logits = torch.randn(2, 12)
    outputs = [[4, 4, 4, 7], [1]]
    params = [
        SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
        SamplingParams(presence_penalty=-1.0),
    ]
    # The prompt must not count: only output tokens are penalised.
    got = processed_probs(logits, build_md(params, 12, [[4, 0], [2]], outputs))
    expected = logits.clone()
    expected[0, 4] -= 0.25 * 3 + 0.5
    expected[0, 7] -= 0.25 * 1 + 0.5
    expected[1, 1] -= -1.0
    torch.testing.assert_close(got, expected.softmax(-1))


def test_penalty_changes_greedy_choice(build_md) -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0]])
    assert sample(logits, build_md([SamplingParams.greedy()], 3)).item() == 0
    md = build_md([SamplingParams.greedy(repetition_penalty=1.1)], 3, outputs=[[0]])
    assert sample(logits, md).item() == 1  # 2.0 / 1.1 < 1.9
    md = build_md([SamplingParams.greedy(frequency_penalty=0.05)], 3, outputs=[[0, 0, 0]])
    assert sample(logits, md).item() == 1  # 2.0 - 0.15 < 1.9


def test_min_tokens_masks_eos_and_stop_ids_until_reached(build_md) -> None:
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]] * 4)
    params = [
        SamplingParams.greedy(min_tokens=2, stop_token_ids=[2]),
        SamplingParams.greedy(min_tokens=2, stop_token_ids=[2]),
        SamplingParams.greedy(min_tokens=2, ignore_eos=True),
        SamplingParams.greedy(),
    ]
    outputs = [[9], [9, 9], [], []]
    md = build_md(params, 4, outputs=outputs, eos=[1])
    # Row 0 is short: eos 1 and stop 2 masked. Row 1 reached min_tokens. Row 2 ignores eos.
    assert sample(logits, md).tolist() == [3, 1, 1, 1]
    assert processed_probs(logits, md)[0, 1:3].sum().item() == 0.0


def test_filters_match_transformers_per_row(build_md) -> None:
    torch.manual_seed(3)
    vocab_size = 64
    settings = [  # (temperature, top_k, top_p, min_p)
        (1.0, 5, 1.0, 0.0),
        (0.7, 0, 0.8, 0.0),
        (1.3, 0, 1.0, 0.1),
        (0.9, 10, 0.6, 0.0),
        (1.0, 20, 0.9, 0.05),
        (0.5, 0, 1.0, 0.0),
        (2.0, 3, 0.3, 0.3),
    ]
    logits = torch.randn(len(settings), vocab_size) * 2
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m) for t, k, p, m in settings]
    got = processed_probs(logits, build_md(params, vocab_size))
    for row, (t, k, p, m) in enumerate(settings):
        ref = reference_probs(logits[row], t, k, p, m)
        assert torch.equal(got[row] > 0, ref > 0), f"row {row}: kept sets differ"
        torch.testing.assert_close(got[row], ref, atol=1e-6, rtol=1e-5)


def test_top_k_alone_with_mixed_rows_uses_per_row_k(build_md) -> None:
    torch.manual_seed(4)
    logits = torch.randn(4, 30)
    params = [SamplingParams(top_k=k) for k in (1, 4, 0, 30)] + [SamplingParams.greedy(top_k=2)]
    logits = torch.cat([logits, torch.randn(1, 30)])
    md = build_md(params, 30)
    assert md.max_top_k == 4  # disabled rows (0, >= V, greedy) do not widen the topk call
    kept = (processed_probs(logits, md) > 0).sum(-1).tolist()
    assert kept == [1, 4, 30, 30, 1]


def test_top_k_keeps_all_tokens_tied_with_kth(build_md) -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    probs = processed_probs(logits, build_md([SamplingParams(top_k=2)], 5))[0]
    assert (probs > 0).tolist() == [True, True, True, True, False]
    assert probs[1] == probs[2] == probs[3]
    # Same through the sort path (top-p present): ties at the top-p boundary are kept too.
    probs = processed_probs(logits, build_md([SamplingParams(top_k=2, top_p=0.5)], 5))[0]
    assert (probs > 0).tolist() == [True, True, True, True, False]


def test_top_p_smallest_set_reaching_p(build_md) -> None:
    # probs exactly 0.5, 0.25, 0.125, 0.125 (logits are logs of them).
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]])).repeat(4, 1)
    params = [SamplingParams(top_p=p) for p in (0.3, 0.6, 0.8, 1.0)]
    probs = processed_probs(logits, build_md(params, 4))
    assert (probs > 0).sum(-1).tolist() == [1, 2, 4, 4]  # 0.8 needs 3; the 4th ties with it
    torch.testing.assert_close(probs[1], torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]))
    torch.testing.assert_close(probs[2], torch.tensor([0.5, 0.25, 0.125, 0.125]))


def test_min_p_relative_to_max(build_md) -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]]))
    probs = processed_probs(logits, build_md([SamplingParams(min_p=0.45)], 5))[0]
    assert (probs > 0).tolist() == [True, True, True, False, False]  # threshold 0.18
    md = build_md([SamplingParams(min_p=1.0)], 3)
    probs = processed_probs(torch.tensor([[1.0, 1.0, 0.5]]), md)[0]
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.5, 0.0]))


def test_processed_probs_normalised_and_sample_within_support(build_md) -> None:
    torch.manual_seed(5)
    vocab_size = 40
    params = [
        SamplingParams(top_k=3),
        SamplingParams.greedy(logit_bias={7: 50.0}),
        SamplingParams(top_p=0.5, temperature=0.6, seed=11),
        SamplingParams(min_p=0.3, repetition_penalty=1.5, seed=12),
        SamplingParams(temperature=1e-6),
    ] * 40
    logits = torch.randn(len(params), vocab_size) * 3
    md = build_md(params, vocab_size, outputs=[[1, 2, 3]] * len(params))
    probs = processed_probs(logits, md)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(params)))
    assert not probs.isnan().any()
    assert torch.equal(probs[1::5].argmax(-1), torch.full((40,), 7))
    assert ((probs[0::5] > 0).sum(-1) == 3).all()
    for _ in range(10):
        tokens = sample(logits, md)
        assert (probs.gather(1, tokens[:, None]) > 0).all()
        assert torch.equal(tokens[1::5], torch.full((40,), 7))


def test_tiny_temperature_behaves_like_greedy(build_md) -> None:
    torch.manual_seed(6)
    logits = torch.randn(8, 100) * 1e4
    md = build_md([SamplingParams(temperature=1e-8)] * 8, 100)
    probs = processed_probs(logits, md)
    assert not probs.isnan().any()
    assert torch.equal(sample(logits, md), logits.argmax(-1))


def test_temperature_and_penalty_that_underflow_float32_stay_finite(build_md) -> None:
    # 1e-46 is a valid float but 0 in float32: dividing by it made the rows NaN, and the draw
    # then returned the last token id every time.
    torch.manual_seed(8)
    logits = torch.randn(4, 60) * 3
    md = build_md([SamplingParams(temperature=1e-46, seed=s) for s in range(4)], 60)
    probs = processed_probs(logits, md)
    assert not probs.isnan().any()
    assert torch.equal(sample(logits, md), logits.argmax(-1))
    seen = [[1, 2, 3, 7]] * 4
    logits[:, [1, 2]] = torch.tensor([2.0, 5.0])  # seen and positive: pushed far above the rest
    logits[:, [3, 7]] = -1.0
    params = [SamplingParams(repetition_penalty=1e-46, seed=s) for s in range(4)]
    probs = processed_probs(logits, build_md(params, 60, prompts=seen))
    assert not probs.isnan().any()
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
    assert (probs[:, 2] == 1.0).all()  # the limit of a vanishing penalty: the larger seen logit


def test_temperature_and_penalty_that_overflow_float32_keep_masks_and_filters(build_md) -> None:
    # 1e300 is a valid float but inf in float32: -inf (a masked logit) / inf made the rows NaN,
    # and the draw returned the last token id whatever the mask or top-k said.
    torch.manual_seed(9)
    logits = torch.randn(6, 50) * 3
    logits[:, 40:] = float("-inf")  # masked, as a grammar or padding masks them
    md = build_md([SamplingParams(temperature=1e300, top_k=5, seed=s) for s in range(6)], 50)
    probs = processed_probs(logits, md)
    assert not probs.isnan().any()
    top5 = logits.topk(5, dim=-1).indices
    assert torch.equal((probs > 0).sum(-1), torch.full((6,), 5))  # top-k still filters
    assert (probs.gather(1, top5) > 0).all()
    torch.testing.assert_close(probs.gather(1, top5), torch.full((6, 5), 0.2))  # the flat limit
    tokens = sample(logits, md)
    assert all(t in row for t, row in zip(tokens.tolist(), top5.tolist()))
    params = [SamplingParams(repetition_penalty=1e300, seed=s) for s in range(6)]
    probs = processed_probs(logits, build_md(params, 50, prompts=[[1, 2, 45]] * 6))
    assert not probs.isnan().any() and (probs[:, 40:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_upcast(build_md, dtype: torch.dtype) -> None:
    logits = torch.tensor([[0.1, 2.0, 0.3]], dtype=dtype)
    md = build_md([SamplingParams(top_p=0.9, logit_bias={0: 0.5})], 3)
    probs = processed_probs(logits, md)
    assert probs.dtype == torch.float32
    assert sample(logits, md).dtype == torch.int64


def test_metadata_rejects_out_of_vocab_ids(build_md) -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        build_md([SamplingParams(logit_bias={10: 1.0})], 10)
    with pytest.raises(ValueError, match="eos_token_ids"):
        build_md([SamplingParams()], 10, eos=[10])
    with pytest.raises(ValueError, match="token ids"):
        build_md([SamplingParams(frequency_penalty=1.0)], 10, outputs=[[3, 10]])
    with pytest.raises(ValueError, match="length"):
        build_md([SamplingParams()], 10, prompts=[[], []])


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    from brisklm.sampling import SamplingMetadata, make_generator

    torch.manual_seed(8)
    vocab_size = 1000
    params = [
        SamplingParams.greedy(logit_bias={3: 2.0}, repetition_penalty=1.2),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=1),
        SamplingParams(min_p=0.05, frequency_penalty=0.5, min_tokens=4),
        SamplingParams(temperature=1.2, top_k=10),
    ]
    logits = torch.randn(len(params), vocab_size) * 3
    prompts, outputs = [[1, 2], [3], [4, 5, 6], []], [[7], [], [8, 8], [9]]

    def build(device: str) -> SamplingMetadata:
        generators = [make_generator(p, device) for p in params]
        return SamplingMetadata.build(
            params, prompts, outputs, generators, vocab_size, device, eos_token_ids=[0]
        )

    cpu_probs = processed_probs(logits, build("cpu"))
    cuda_md = build("cuda")
    cuda_probs = processed_probs(logits.cuda(), cuda_md)
    torch.testing.assert_close(cuda_probs.cpu(), cpu_probs, atol=1e-5, rtol=1e-4)
    tokens = sample(logits.cuda(), cuda_md)
    assert tokens.device.type == "cuda"
    assert (cuda_probs.gather(1, tokens[:, None]) > 0).all()
    alone = SamplingMetadata.build(
        params[1:2],
        prompts[1:2],
        outputs[1:2],
        [make_generator(params[1], "cuda")],
        vocab_size,
        "cuda",
    )
    assert sample(logits[1:2].cuda(), alone).item() == tokens[1].item()


def test_the_sampler_on_cpu_gives_the_same_bits_at_any_thread_count() -> None:
    """The sampler's ops run on one thread whatever torch's count (brisklm.kernels.omp): a sum
    over one row of 128k logits, split between threads, rounds otherwise at each count, and a
    top-p at that edge kept one token or two depending on the count."""
    if not one_thread_works():
        pytest.skip("torch's OpenMP runtime cannot be reached here (the sampler keeps its count)")
    vocab = 128256
    before = torch.get_num_threads()
    edge = None
    for seed in range(200):  # logits whose top-p normaliser rounds otherwise on two threads
        logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(seed)) * 3
        x = (logits - logits.amax(-1, keepdim=True)) / 0.8
        values = largest_values(x, 256)
        sums = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            sums[threads] = (values - x.amax(-1, keepdim=True)).exp().cumsum(-1) / x.exp().sum(
                -1, keepdim=True
            )
        differ = (sums[1] != sums[2]).nonzero()
        if len(differ):
            column = differ[0, 1].item()
            top_p = max(sums[1][0, column].item(), sums[2][0, column].item())
            if top_p < 1.0:
                edge = logits, top_p
                break
    torch.set_num_threads(before)
    assert edge is not None, "no row whose normaliser depends on the thread count"
    logits, top_p = edge
    params = [SamplingParams(temperature=0.8, top_p=top_p, seed=3, logprobs=2)]
    results = {}
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            md = SamplingMetadata.build(params, [[1]], [[]], [None], vocab, "cpu")
            probs = processed_probs(logits, md)
            logprobs = compute_logprobs(logits, probs.argmax(-1), 2)
            uniforms = torch.tensor([0.37], dtype=torch.float64)
            results[threads] = (probs, logprobs.chosen, inverse_cdf(probs, uniforms))
    finally:
        torch.set_num_threads(before)
    for threads in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(results[1], results[threads])), threads
