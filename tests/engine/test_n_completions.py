"""SamplingParams.n: several completions of a prompt through generate / agenerate / chat / achat."""

from __future__ import annotations

import asyncio

import pytest

from brisklm import SamplingParams
from brisklm.sampling.params import MAX_SEED

SAMPLED = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=11)
MESSAGES = [{"role": "user", "content": "Hello"}]


def test_a_seeded_prompts_choices_are_its_requests_with_seeds_apart(llm):
    out = llm.generate("The quick brown fox", SAMPLED.with_changes(n=3))
    assert len(out.choices) == 3 and out.choices[0] is out
    alone = [
        llm.generate("The quick brown fox", SAMPLED.with_changes(seed=11 + i)) for i in range(3)
    ]
    assert [c.token_ids for c in out.choices] == [a.token_ids for a in alone]
    assert [c.text for c in out.choices] == [a.text for a in alone]
    assert len({tuple(c.token_ids) for c in out.choices}) > 1  # they differ
    for choice in out.choices:
        assert choice.prompt == "The quick brown fox"
        assert choice.prompt_token_ids == out.prompt_token_ids
        assert choice.usage.prompt_tokens == len(out.prompt_token_ids)
        assert choice.usage.completion_tokens == 10
    assert [c.other_choices for c in out.other_choices] == [[], []]
    assert len({c.request_id for c in out.choices}) == 3


def test_unseeded_choices_draw_apart(llm):
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, n=3)
    out = llm.generate("Hello", params)
    assert len({tuple(c.token_ids) for c in out.choices}) == 3


def test_each_prompt_of_a_list_gets_its_own_number_of_choices(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(["Hello", "def add(a, b):"], [greedy.with_changes(n=2), greedy])
    assert [len(o.choices) for o in outs] == [2, 1]
    assert outs[0].choices[1].token_ids == outs[0].token_ids  # greedy: alike
    assert outs[1].prompt == "def add(a, b):"
    assert outs[1].token_ids == llm.generate("def add(a, b):", greedy).token_ids
    both = llm.generate(["Hello", "def add(a, b):"], greedy.with_changes(n=2))
    assert [len(o.choices) for o in both] == [2, 2]
    assert [o.prompt for o in both[1].choices] == ["def add(a, b):"] * 2


def test_agenerate_and_prompt_logprobs_take_n_too(llm):
    params = SAMPLED.with_changes(n=2, prompt_logprobs=1, logprobs=0)
    out = asyncio.run(llm.agenerate("Hello there", params))
    synced = llm.generate("Hello there", params)
    assert [c.token_ids for c in out.choices] == [c.token_ids for c in synced.choices]
    for choice in out.choices:  # each choice its prompt's logprobs and its own tokens'
        assert choice.prompt_logprobs == out.prompt_logprobs
        assert [e.token_id for e in choice.logprobs] == choice.token_ids


def test_chat_and_achat_return_each_choices_turn(llm):
    params = SAMPLED.with_changes(n=2)
    reply = llm.chat(MESSAGES, params)
    assert len(reply.choices) == 2 and reply.choices[0] is reply
    for i, choice in enumerate(reply.choices):
        alone = llm.chat(MESSAGES, SAMPLED.with_changes(seed=11 + i))
        assert choice.content == alone.content
        assert choice.output.token_ids == alone.output.token_ids
        assert choice.finish_reason == alone.finish_reason
    again = asyncio.run(llm.achat(MESSAGES, params))
    assert [c.content for c in again.choices] == [c.content for c in reply.choices]


def test_make_requests_makes_a_request_a_choice(llm):
    requests = llm.make_requests("Hello", SAMPLED.with_changes(n=3))
    assert [r.params.seed for r in requests] == [11, 12, 13]
    assert all(r.params.n == 1 and r.prompt == "Hello" for r in requests)
    assert all(r.prompt_token_ids == requests[0].prompt_token_ids for r in requests)
    outputs = llm.run_requests(requests)
    assert outputs[2].token_ids == llm.generate("Hello", SAMPLED.with_changes(seed=13)).token_ids


def test_a_stream_or_a_request_is_one_completion(llm):
    params = SAMPLED.with_changes(n=2)
    for call in (
        lambda: llm.make_request("Hello", params),
        lambda: llm.stream("Hello", params),
        lambda: llm.stream_chunks("Hello", params),
        lambda: llm.astream("Hello", params),
        lambda: llm.stream_chat(MESSAGES, params),
    ):
        with pytest.raises(ValueError, match=r"SamplingParams.n=2: a request \(and a stream\)"):
            call()
    assert len(llm.generate("Hello", SAMPLED).token_ids) == 10  # the engine goes on


def test_a_bad_prompt_among_several_is_named_and_nothing_runs(llm):
    before = llm.engine.stats.generation_tokens
    with pytest.raises(ValueError, match="prompt 1"):
        llm.generate(["Hello", [10**6]], SAMPLED.with_changes(n=2))
    assert llm.engine.stats.generation_tokens == before


def test_choice_seeds_wrap_past_the_largest_seed():
    params = SamplingParams(temperature=0.8, seed=MAX_SEED - 1, n=3)
    assert [p.seed for p in params.per_choice()] == [MAX_SEED - 1, MAX_SEED, 0]
    assert all(p.n == 1 for p in params.per_choice())
    unseeded = SamplingParams(temperature=0.8, n=2)
    assert unseeded.per_choice() == [unseeded.with_changes(n=1)] * 2
    single = SamplingParams(temperature=0.8)
    assert single.per_choice() == [single]


@pytest.mark.parametrize("bad", [0, -1, 129, 1.5, True, "2", None])
def test_n_outside_its_range_is_refused(bad):
    with pytest.raises(ValueError, match=r"SamplingParams.n=.* must be an int in \[1, 128\]"):
        SamplingParams(n=bad)
