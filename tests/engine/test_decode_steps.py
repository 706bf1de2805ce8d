"""Greedy steps a few to a native call (EngineConfig.max_decode_steps): the outputs of a step a
call, with every stop rule, in batches and streams; one step a call where they cannot apply."""

from __future__ import annotations

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
    original = runner.greedy_steps

    def counted(batch, columns, steps):
        made.append(steps)
        return original(batch, columns, steps)

    monkeypatch.setattr(runner, "greedy_steps", counted)
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
    original = llm.engine.runner.greedy_steps

    def counted(batch, columns, steps):
        made.append((steps, len(batch.slots)))
        return original(batch, columns, steps)

    llm.engine.runner.greedy_steps = counted
    try:
        same(llm.generate(prompts, params), expected)
    finally:
        llm.close()
    assert made and max(steps * rows for steps, rows in made) == 512


def test_sampled_and_logprob_requests_take_a_step_a_call(one_a_call, several, calls) -> None:
    """A seeded sampled request beside greedy ones, and a greedy one with logprobs: no call of
    several steps while they decode; the outputs are a step a call's."""
    seeded = SamplingParams(temperature=0.8, max_tokens=20, seed=3, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    logprobs = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
    batch = [seeded, greedy, logprobs]
    expected = one_a_call.generate(PROMPTS[:3], batch)
    same(several.generate(PROMPTS[:3], batch), expected)
    assert calls == []


def test_max_decode_steps_is_checked() -> None:
    with pytest.raises(ValueError, match="max_decode_steps"):
        EngineConfig(max_decode_steps=0)
