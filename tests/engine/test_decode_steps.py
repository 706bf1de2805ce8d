"""Decode steps a few to a native call (EngineConfig.max_decode_steps), greedy and sampled: the
outputs of a step a call, with every stop rule, in batches and streams; one step a call where they
cannot apply."""

from __future__ import annotations

import asyncio

import pytest

from brisklm import LLM, SamplingParams
from brisklm.engine import llm_engine
from brisklm.engine.llm_engine import EngineConfig
from brisklm.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")

PROMPTS = ["The quick brown fox", "Hello", "Zürich and 東京 are cities; emoji 🙂", "def add(a, b):"]


def load(path, **kwargs) -> LLM:
    settings = dict(device="cpu", max_batch_size=4, max_seq_len=128, show_progress=False)
    return LLM.from_pretrained(path, **{**settings, **kwargs})


@pytest.fixture(scope="module")
def one_a_call(tiny_dir):
    llm = load(tiny_dir, max_decode_steps=1)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def several(tiny_dir):
    llm = load(tiny_dir, max_decode_steps=8)
    yield llm
    llm.close()


@pytest.fixture
def calls(several, monkeypatch) -> list[int]:
    """The steps of each call of greedy steps the engine of ``several`` makes."""
    runner = several.engine.runner
    made: list[int] = []
    original = runner.run_steps

    def counted(batch, columns, steps, *args):
        made.append(steps)
        return original(batch, columns, steps, *args)

    monkeypatch.setattr(runner, "run_steps", counted)
    return made


def same(outputs, expected) -> None:
    for got, want in zip(outputs, expected, strict=True):
        assert got.token_ids == want.token_ids
        assert got.text == want.text
        assert (got.finish_reason, got.stop_reason) == (want.finish_reason, want.stop_reason)


def test_a_batch_gives_the_outputs_of_a_step_a_call(one_a_call, several, calls) -> None:
    """Prompts of different lengths, each with its own stop rule: max_tokens, a stop string and a
    stop token from the plain output's middle, eos, min_tokens."""
    plain = one_a_call.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    )
    stop_text = plain[0].text[12:15]
    stop_token = plain[1].token_ids[9]
    params = [
        SamplingParams(temperature=0, max_tokens=40, stop=[stop_text]),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0, max_tokens=33),
        SamplingParams(temperature=0, max_tokens=40, min_tokens=20, ignore_eos=True),
    ]
    expected = one_a_call.generate(PROMPTS, params)
    assert expected[0].finish_reason == expected[1].finish_reason == "stop"
    same(several.generate(PROMPTS, params), expected)
    assert calls and max(calls) > 1  # the steps did run several to a call
    # Each request alone too (its steps then run to its own end).
    for prompt, p, want in zip(PROMPTS, params, expected, strict=True):
        same([several.generate(prompt, p)], [want])


def test_a_stream_gets_the_text_a_few_tokens_a_chunk(one_a_call, several, calls) -> None:
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = one_a_call.generate(PROMPTS[2], params).text
    chunks = list(several.stream(PROMPTS[2], params))
    assert "".join(chunks) == want
    assert calls and len(chunks) < 48


def test_steps_stop_at_the_end_of_the_cache(tiny_dir, calls) -> None:
    """A request that runs into the cache's end: steps never write past it, the output ends by
    length as with a step a call."""
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    outputs = []
    for steps in (1, 8):
        llm = load(tiny_dir, max_seq_len=40, max_decode_steps=steps)
        try:
            outputs.append(llm.generate(PROMPTS[0], params))
        finally:
            llm.close()
    same([outputs[1]], [outputs[0]])
    assert outputs[0].finish_reason == "length"
    assert len(outputs[0].prompt_token_ids) + len(outputs[0].token_ids) == 40


def test_steps_times_rows_stay_within_the_kernels_tokens_a_call(
    tiny_dir, one_a_call, monkeypatch
) -> None:
    """max_decode_steps far past what a call takes (512 tokens: 64 steps of 8 rows), with no
    time limit: the calls are cut to fit, the outputs as a step a call's."""
    monkeypatch.setattr(llm_engine, "DECODE_STEPS_SECONDS", 60.0)
    params = SamplingParams(temperature=0, max_tokens=90, ignore_eos=True)
    prompts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 2)]
    expected = one_a_call.generate(prompts[:4], params) + one_a_call.generate(prompts[4:], params)
    llm = load(tiny_dir, max_decode_steps=600, max_batch_size=8)
    made: list[tuple[int, int]] = []
    original = llm.engine.runner.run_steps

    def counted(batch, columns, steps, *args):
        made.append((steps, len(batch.slots)))
        return original(batch, columns, steps, *args)

    llm.engine.runner.run_steps = counted
    try:
        same(llm.generate(prompts, params), expected)
    finally:
        llm.close()
    assert made and max(steps * rows for steps, rows in made) == 512


SAMPLED = [
    SamplingParams(temperature=0.8, max_tokens=40, seed=3, ignore_eos=True),
    SamplingParams(temperature=1.3, top_k=20, max_tokens=40, seed=4, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.8, min_p=0.02, max_tokens=36, seed=2**64 - 1),
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
]


def test_seeded_sampled_requests_draw_the_tokens_of_a_step_a_call(
    one_a_call, several, calls
) -> None:
    """Seeded sampled rows (temperature, top-k, top-p, min-p) beside a greedy one: each row's
    uniforms drawn ahead from its own generator give the tokens of a step a call, in a batch, alone
    and streamed, and leave the generator where a step a call leaves it (the stop rules end rows
    mid-call)."""
    expected = one_a_call.generate(PROMPTS, SAMPLED)
    same(several.generate(PROMPTS, SAMPLED), expected)
    assert calls and max(calls) > 1
    for prompt, p, want in zip(PROMPTS, SAMPLED, expected, strict=True):
        same([several.generate(prompt, p)], [want])
    assert "".join(several.stream(PROMPTS[1], SAMPLED[1])) == expected[1].text
    stop = [expected[0].text[10:13]]
    with_stop = SAMPLED[0].with_changes(stop=stop, min_tokens=5)
    same([several.generate(PROMPTS[0], with_stop)], [one_a_call.generate(PROMPTS[0], with_stop)])


def test_unseeded_sampled_requests_take_several_steps_a_call(several, calls) -> None:
    out = several.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [30] * 4
    assert calls and max(calls) > 1


def test_requests_with_a_grammar_run_a_step_a_call(one_a_call, several, calls) -> None:
    """A grammar beside a sampled and a greedy request: no call of several steps while it
    decodes; the outputs are a step a call's."""
    params = SamplingParams(temperature=0, max_tokens=20, regex="[a-z ]{200}", ignore_eos=True)
    batch = [SAMPLED[0].with_changes(max_tokens=20), SAMPLED[3].with_changes(max_tokens=20), params]
    expected = one_a_call.generate(PROMPTS[:3], batch)
    same(several.generate(PROMPTS[:3], batch), expected)
    assert calls == []


def same_logprobs(outputs, expected) -> None:
    """The outputs of ``same``, and the same logprobs, to the bit."""
    same(outputs, expected)
    for got, want in zip(outputs, expected, strict=True):
        assert got.logprobs == want.logprobs


LOGPROBS = [
    SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=3),
    SamplingParams(temperature=0.8, seed=1, max_tokens=30, ignore_eos=True, logprobs=0),
    SamplingParams(
        temperature=1.1,
        top_k=20,
        seed=2,
        max_tokens=26,
        logprobs=5,
        frequency_penalty=0.7,
        logit_bias={9: 2.0},
    ),
    SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),  # none, beside them
]


def test_requests_with_logprobs_take_several_steps_a_call(one_a_call, several, calls) -> None:
    """Rows with logprobs (greedy, seeded sampled, after penalties and a bias, top-N of 0, 3
    and 5 over a vocabulary padded past the tokenizer's) beside one without: the kernels keep each
    step's raw logits, and the logprobs computed from them are a step a call's to the bit, in a
    batch, alone, streamed and with a stop string ending a row mid-call."""
    expected = one_a_call.generate(PROMPTS, LOGPROBS)
    assert [len(o.logprobs or []) for o in expected] == [30, 30, len(expected[2].token_ids), 0]
    assert len(expected[0].logprobs[5].top) == 3  # (the alternatives are there to compare)
    same_logprobs(several.generate(PROMPTS, LOGPROBS), expected)
    assert calls and max(calls) > 1
    for prompt, p, want in zip(PROMPTS[:3], LOGPROBS[:3], expected[:3], strict=True):
        calls.clear()
        same_logprobs([several.generate(prompt, p)], [want])
        assert max(calls) > 1
    assert "".join(several.stream(PROMPTS[1], LOGPROBS[1])) == expected[1].text
    stop = LOGPROBS[0].with_changes(stop=[expected[0].text[9:12]])
    want = one_a_call.generate(PROMPTS[0], stop)
    assert want.finish_reason == "stop"
    same_logprobs([several.generate(PROMPTS[0], stop)], [want])


def test_logprob_steps_keep_their_logits_within_the_limit(
    one_a_call, several, calls, monkeypatch
) -> None:
    """A call of steps with logprobs keeps at most STEP_LOGITS_BYTES of logits: with room for
    three steps of four rows, calls run three steps at most, the outputs a step a call's."""
    vocab = several.engine.model.config.vocab_size
    monkeypatch.setattr(llm_engine, "STEP_LOGITS_BYTES", 4 * vocab * 4 * 3 + 100)
    expected = one_a_call.generate(PROMPTS, LOGPROBS)
    same_logprobs(several.generate(PROMPTS, LOGPROBS), expected)
    assert max(calls) == 3


ADJUSTED = [
    SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.3),
    SamplingParams(temperature=0, max_tokens=40, frequency_penalty=0.9, presence_penalty=0.4),
    SamplingParams(temperature=0.9, max_tokens=40, seed=5, frequency_penalty=-0.5),
    SamplingParams(
        temperature=1.2, top_k=30, max_tokens=40, seed=6, presence_penalty=1.5, logit_bias={9: 3.0}
    ),
    SamplingParams(
        temperature=0,
        max_tokens=40,
        repetition_penalty=0.7,
        frequency_penalty=0.3,
        logit_bias={11: -2.0, 12: 4.5},
    ),
    SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=7, repetition_penalty=1.2),
]


def test_a_logit_bias_and_penalties_take_several_steps_a_call(one_a_call, several, calls) -> None:
    """The kernels apply the bias and the penalties as the sampler does, counting each step's
    token before the next: the tokens of a step a call, greedy and seeded sampled, each option
    alone and mixed, beside rows without them, and streamed."""
    params = [p.with_changes(ignore_eos=True) for p in ADJUSTED]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    for batch in (params[:4], params[2:]):
        expected = one_a_call.generate(prompts[: len(batch)], batch)
        calls.clear()
        same(several.generate(prompts[: len(batch)], batch), expected)
        assert calls and max(calls) > 1
    plain = [
        p.with_changes(
            repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, logit_bias=None
        )
        for p in params
    ]
    penalised = several.generate(prompts, params)
    # (the options change the outputs: this test would see a kernel that ignored them)
    assert all(
        a.token_ids != b.token_ids for a, b in zip(penalised, several.generate(prompts, plain))
    )
    for prompt, p in zip(prompts, params, strict=True):
        want = one_a_call.generate(prompt, p)
        same([several.generate(prompt, p)], [want])
        assert "".join(several.stream(prompt, p)) == want.text
    beside = [SAMPLED[0], SAMPLED[3], params[1], params[3]]
    same(several.generate(PROMPTS, beside), one_a_call.generate(PROMPTS, beside))


def test_refused_adjustments_leave_the_pass_usable(several) -> None:
    """Adjustments whose tensors do not fit (a count row one token wider than the vocabulary)
    are refused before the pass points at any of them: the next passes run as before."""
    import torch

    from brisklm.models.native_forward import LogitAdjustments

    native_forward = several.engine.runner.native
    vocab = native_forward.args.vocab
    bias = (torch.tensor([0]), torch.tensor([3]), torch.tensor([1.0]))
    bad = LogitAdjustments(
        bias=bias,
        frequency=torch.ones(1),
        presence=torch.zeros(1),
        counts=torch.zeros(1, vocab + 1),
    )
    want = several.generate(PROMPTS[0], SAMPLED[3])
    with pytest.raises(ValueError, match="logit adjustment counts must be"):
        native_forward.run_steps([5], [0], [0], 2, vocab, None, bad)
    assert native_forward.args.n_bias == 0 and not native_forward.args.bias_ids
    same([several.generate(PROMPTS[0], SAMPLED[3])], [want])


def test_max_decode_steps_is_checked() -> None:
    with pytest.raises(ValueError, match="max_decode_steps"):
        EngineConfig(max_decode_steps=0)


def test_a_row_with_nothing_to_draw_fails_as_with_a_step_a_call(tmp_path) -> None:
    """A sampled row whose logits turn NaN mid-call (its own draw fed a token whose embedding is
    NaN) ends the call there: it fails with the error of a step a call, after the same tokens, and
    the seeded row beside it, its generator put back to the steps that ran, goes on as alone."""
    from tests.engine.test_errors import nan_at_token
    from tests.tiny import make_tiny_checkpoint

    directory = make_tiny_checkpoint(tmp_path / "tiny")
    first = SamplingParams(temperature=1.0, seed=5, max_tokens=16, ignore_eos=True)
    second = SamplingParams(temperature=0.9, seed=9, max_tokens=16, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    with load(directory, max_decode_steps=1) as llm:
        clean = [o.token_ids for o in llm.generate(prompts, [first, second])]
    seen = {*prompts[0], *prompts[1], *clean[1]}
    late = [i for i in range(4, 16) if clean[0][i] not in seen | set(clean[0][:i])]
    assert late, "no token of the first output to poison"
    nan_at_token(directory, clean[0][late[0]])

    def run(steps: int) -> tuple[str, list[int], list[int]]:
        with load(directory, max_decode_steps=steps) as llm:
            made: list[int] = []
            original = llm.engine.runner.run_steps

            def counted(batch, columns, n, *args):
                made.append(n)
                return original(batch, columns, n, *args)

            llm.engine.runner.run_steps = counted
            requests = [llm.make_request(p, q) for p, q in zip(prompts, [first, second])]

            async def each():
                return dict([pair async for pair in llm.arun_requests_each(requests)])

            results = asyncio.run(each())
            assert isinstance(results[0], RuntimeError)
            return str(results[0]).split(": ", 1)[1], results[1].token_ids, made  # no request id

    one_error, one_tokens, _ = run(1)
    error, tokens, made = run(8)
    assert f"after {late[0] + 1} output tokens" in one_error
    assert (error, tokens) == (one_error, one_tokens)
    assert tokens == clean[1] and max(made) > 1


def test_steps_past_a_dynamic_rope_models_trained_context_draw_as_a_step_a_call(tmp_path) -> None:
    """Past the trained context of a dynamic-NTK model the kernels decline several steps a call
    (their rotary tables depend on the row's length): the uniforms drawn for them are put back,
    so a seeded request's tokens stay a step a call's."""
    from tests.tiny import make_tiny_checkpoint

    directory = make_tiny_checkpoint(
        tmp_path / "dynamic",
        max_position_embeddings=24,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=40, ignore_eos=True)
    outputs = []
    for steps in (1, 8):
        with load(directory, max_seq_len=64, max_decode_steps=steps) as llm:
            outputs.append(llm.generate([5, 6, 7, 8, 9, 10], params))
    same([outputs[1]], [outputs[0]])


def test_a_rows_alternatives_do_not_depend_on_its_neighbours(several) -> None:
    """Thirty tokens tied at the top: a row's top 3 are the same alone and beside a row asking
    for 20 (torch's topk orders tied values otherwise for another k), so a call of steps, whose
    rows differ from a call a step's, lists the same alternatives."""
    import torch

    class Asking:  # a request, as token_logprobs reads it
        def __init__(self, n: int) -> None:
            self.params = SamplingParams(logprobs=n)

    engine = several.engine
    logits = torch.zeros(1, engine.num_real_tokens)
    logits[0, 10:40] = 5.0
    token = torch.tensor([12])
    alone = engine.token_logprobs([Asking(3)], logits, token)[0]
    pair = engine.token_logprobs([Asking(3), Asking(20)], logits.repeat(2, 1), token.repeat(2))
    assert alone == pair[0] and len(alone.top) == 3 and len(pair[1].top) == 20
    assert all(10 <= t.token_id < 40 for t in pair[1].top)
