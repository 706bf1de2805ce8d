"""A seeded request's tokens do not depend on what else is in its batch (CPU, dense weights).

Its random numbers come from its own generator, and every step of its computation gives it the
same bits alone as beside other rows: rows of up to 512 tokens run through the native CPU pass,
which computes each token alike whatever else is in the call; through torch's ops, oneDNN's
packed products are row-invariant and a batch holding a seeded request attends row by row over
exactly each row's keys and takes the MLP's activation in calls of whole rows; and the sampler's
cumulative sums run per row. Prompts are cut into
chunks at fixed positions (tests/engine/test_chunked_prefill.py). Before, 1 in 40 seeded 30-token
generations of the bundled model changed beside a greedy row.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from brisklm import LLM, SamplingParams
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.llm import default_model_path
from brisklm.loader import load_model
from brisklm.models.layers import silu_mul
from tests.runner_spy import spy_on_passes

OTHERS = ["Once upon a time there was a", "Hi", "Write a list of colours:"]


@pytest.fixture(scope="module")
def bundled():
    llm = LLM.from_pretrained(max_batch_size=4, max_seq_len=256, show_progress=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def bundled_drafted():
    llm = LLM.from_pretrained(
        draft="default", max_batch_size=4, max_seq_len=256, show_progress=False
    )
    yield llm
    llm.close()


@pytest.mark.parametrize("draft", [False, True], ids=["plain", "draft"])
def test_seeded_tokens_alone_equal_tokens_in_a_ragged_batch(bundled, bundled_drafted, draft):
    llm = bundled_drafted if draft else bundled
    greedy = SamplingParams(temperature=0.0, max_tokens=30)
    for seed in range(12):
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=30, seed=seed)
        alone = llm.generate("The little robot", params).token_ids
        batch = llm.generate(
            [OTHERS[0], "The little robot", OTHERS[1], OTHERS[2]],
            [greedy, params, SamplingParams(temperature=0.7, seed=seed + 100), greedy],
        )
        assert batch[1].token_ids == alone, f"seed {seed}"


@pytest.mark.parametrize("draft", [False, True], ids=["target", "draft"])
def test_a_rows_logits_are_bitwise_the_same_in_any_batch(draft, kernels):
    model = load_model(
        default_model_path(draft), device="cpu", dtype=torch.float32, show_progress=False
    )
    runner = ModelRunner(model, num_slots=8, max_seq_len=256)
    assert (runner.native is not None) == (kernels == "native")
    row = list(range(10, 60))
    others = [list(range(100 + 7 * i, 130 + 11 * i)) for i in range(7)]

    def run(rows: list[list[int]], invariant: bool = True) -> list[torch.Tensor]:
        slots, n = list(range(len(rows))), len(rows)
        logits = [runner.forward(ForwardBatch(slots, [0] * n, rows, [1] * n, invariant))[0]]
        for step in range(3):  # decode at each row's own position
            starts = [len(r) + step for r in rows]
            batch = ForwardBatch(slots, starts, [[7 + step]] * n, [1] * n, invariant)
            logits.append(runner.forward(batch)[0])
        # A speculative verification: three new tokens per row at once.
        starts = [len(r) + 3 for r in rows]
        batch = ForwardBatch(slots, starts, [[5, 6, 7]] * n, [3] * n, invariant)
        logits.append(runner.forward(batch)[:3])
        return logits

    alone = run([row])
    for size in (2, 4, 5, 8):
        for got, expected in zip(run([row] + others[: size - 1]), alone):
            assert torch.equal(got, expected), f"batch of {size}"
    padded = run([row] + others[:7], invariant=False)
    if kernels == "native":
        # Decode and verification rows (up to 32 tokens) run through the native pass, which
        # computes every row alike with or without the flag.
        for got, expected in zip(padded[1:], alone[1:]):
            assert torch.equal(got, expected)
    else:
        # Without the flag torch's ragged batch attends in one padded call: close, not the same bits.
        assert not all(torch.equal(got, expected) for got, expected in zip(padded, alone))
    for got, expected in zip(padded, alone):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_only_batches_with_a_seeded_sampled_request_pay_for_row_by_row_attention(bundled):
    seen: list[bool] = []
    undo = spy_on_passes(bundled.engine.runner, lambda batch: seen.append(batch.row_invariant))
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=4)
        bundled.generate(["Hi", "Hello there"], [greedy, SamplingParams(max_tokens=4)])
        assert seen and not any(seen)  # greedy, and sampled without a seed
        seen.clear()
        bundled.generate(["Hi", "Hello there"], [greedy, SamplingParams(max_tokens=4, seed=1)])
        assert seen and all(seen)
        seen.clear()
        bundled.generate("Hi", SamplingParams(temperature=0.0, max_tokens=4, seed=1))
        assert seen and not any(seen)  # a seed on a greedy request draws nothing
    finally:
        undo()


def test_a_long_row_beside_short_ones_is_computed_as_alone_through_torchs_ops(
    tmp_path, monkeypatch
):
    """Through torch's ops, a row holding most of a pass's tokens holds the point where torch
    splits the MLP's activation between its threads (more than 32,768 elements): its logits
    came out other than alone (~1e-6) until the activation took the rows apart
    (``silu_mul``)."""
    from brisklm.kernels import native
    from tests.tiny import make_tiny_checkpoint

    if torch.get_num_threads() < 2:
        pytest.skip("one torch thread splits nothing")
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    native.library.cache_clear()
    try:
        directory = make_tiny_checkpoint(tmp_path / "model", intermediate_size=864)
        model = load_model(directory, device="cpu", dtype=torch.float32, show_progress=False)
        runner = ModelRunner(model, num_slots=4, max_seq_len=256)
        assert runner.native is None
        long_row = [(7 * i) % 150 + 5 for i in range(120)]

        def logits(rows: list[list[int]]) -> torch.Tensor:
            """The last row's logits, in a pass computing each row as alone."""
            n = len(rows)
            return runner.forward(ForwardBatch(list(range(n)), [0] * n, rows, [1] * n, True))[-1]

        alone = logits([long_row])
        # The split falls at another point of the long row for each length beside it (rounding
        # apart on a few of them before).
        for length in range(1, 25):
            beside = [[11 + i for i in range(length)]]
            assert torch.equal(logits([*beside, long_row]), alone), f"beside {length}"
    finally:
        monkeypatch.undo()
        native.library.cache_clear()


@pytest.mark.parametrize("threads", [1, 2])
def test_the_mlp_activation_computes_each_row_as_alone(threads):
    """torch's elementwise SiLU over more than 32,768 elements splits between threads at points
    set by the total, and the elements before a split took the scalar loop (other rounding): at 2
    threads 56 of 198 row counts gave some row other bits than alone, through torch's ops (a
    seeded request's prompt chunk beside others, logprobs ~5e-6 apart)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(0)
        width = 864
        gate_up = torch.randn(120, 2 * width, generator=generator)

        def activation(rows: torch.Tensor) -> torch.Tensor:
            return silu_mul(*rows.split(width, dim=-1))

        alone = torch.cat([activation(gate_up[i : i + 1]) for i in range(len(gate_up))])
        for count in range(2, len(gate_up) + 1):
            assert torch.equal(activation(gate_up[:count]), alone[:count]), f"{count} rows"
        # and as F.silu(gate) * up computes each row alone, in shapes of any rank
        gate, up = gate_up.reshape(2, 60, 2 * width).split(width, dim=-1)
        expected = torch.cat([F.silu(g) * u for g, u in zip(gate[0], up[0])])
        assert torch.equal(silu_mul(gate, up)[0], expected.reshape(60, width))
        # Rows laid end to end (one run to torch's loop), of a width no vector step divides.
        odd = torch.randn(99, 1000, generator=generator)
        alone = torch.cat([silu_mul(odd[i : i + 1], odd[i : i + 1]) for i in range(99)])
        for count in (2, 7, 33, 99):
            got = silu_mul(odd[:count].clone(), odd[:count].clone())
            assert torch.equal(got, alone[:count]), f"{count} contiguous rows"
        with torch.enable_grad():  # (autograd's inputs: no out= writes)
            grad_gate = odd[:50].clone().requires_grad_()
            torch.testing.assert_close(silu_mul(grad_gate, odd[:50]), alone[:50])
    finally:
        torch.set_num_threads(before)
