"""Speculative decoding through the engine: the output never changes, everything else keeps working."""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter

import pytest

from brisklm import LLM, SamplingParams
from brisklm.speculative import StepCosts
from tests.tiny import make_tiny_checkpoint, train_tokenizer

PROMPTS = ["The quick brown fox", "Hello", "Zürich and 東京 are cities; emoji 🙂", "def add(a, b):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def load(path, **kwargs):
    settings = dict(device="cpu", max_batch_size=4, max_seq_len=256, show_progress=False)
    return LLM.from_pretrained(path, **{**settings, **kwargs})


@pytest.fixture(scope="module")
def other_draft_dir(tmp_path_factory):
    """A different random model with the same tokenizer: it mostly disagrees with the target."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("draft"), seed=7, num_hidden_layers=1)


@pytest.fixture(scope="module")
def plain(tiny_dir):
    llm = load(tiny_dir)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def self_drafted(tiny_dir):
    llm = load(tiny_dir, draft=tiny_dir, num_speculative_tokens=4)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def other_drafted(tiny_dir, other_draft_dir):
    llm = load(tiny_dir, draft=other_draft_dir, num_speculative_tokens=3)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def other_drafted_fixed(tiny_dir, other_draft_dir):
    llm = load(tiny_dir, draft=other_draft_dir, num_speculative_tokens=3, draft_length="fixed")
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def ngram(tiny_dir):
    llm = load(tiny_dir, draft="ngram", num_speculative_tokens=5)
    yield llm
    llm.close()


@pytest.fixture(params=["self", "other", "other-fixed", "ngram"])
def speculative(request, self_drafted, other_drafted, other_drafted_fixed, ngram):
    return {
        "self": self_drafted,
        "other": other_drafted,
        "other-fixed": other_drafted_fixed,
        "ngram": ngram,
    }[request.param]


def test_greedy_output_is_the_targets(plain, speculative):
    expected = plain.generate(PROMPTS, GREEDY)
    got = speculative.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert [o.text for o in got] == [o.text for o in expected]
    for out in got:
        assert out.speculative is not None and out.speculative.num_steps > 0


@pytest.mark.parametrize("penalised", [False, True])
def test_greedy_rows_take_the_kernels_tokens_and_processed_ones_read_the_logits(
    plain, other_drafted, penalised
):
    """Plain greedy requests: the target's verification and the draft's proposals take their
    tokens from the native pass (``forward_greedy``); with a repetition penalty both read the
    logits. Either way the output is plain decoding's."""
    params = GREEDY.with_changes(repetition_penalty=1.3) if penalised else GREEDY
    entry_points: dict[str, set[str]] = {"target": set(), "draft": set()}
    runners = {
        "target": other_drafted.engine.runner,
        "draft": other_drafted.engine.speculator.proposer.runner,
    }
    originals = {name: (r.forward, r.forward_greedy) for name, r in runners.items()}

    def watch(name: str, runner) -> None:
        forward, forward_greedy = originals[name]

        def watched(batch):
            if sum(batch.num_logits):  # (the draft's prompt passes want none)
                entry_points[name].add("forward")
            return forward(batch)

        def watched_greedy(batch, columns):
            logits, tokens = forward_greedy(batch, columns)
            entry_points[name].add("logits" if tokens is None else "kernels")
            return logits, tokens

        runner.forward, runner.forward_greedy = watched, watched_greedy

    for name, runner in runners.items():
        watch(name, runner)
    try:
        got = other_drafted.generate(PROMPTS, params)
    finally:
        for name, runner in runners.items():
            runner.forward, runner.forward_greedy = originals[name]
    expected = plain.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    if other_drafted.engine.runner.native is not None:
        wanted = {"forward"} if penalised else {"kernels"}
        assert entry_points == {"target": wanted, "draft": wanted}


def test_self_draft_accepts_everything_and_saves_steps(self_drafted):
    out = self_drafted.generate("Hello", GREEDY)
    stats = out.speculative
    assert stats.num_proposed > 0 and stats.acceptance_rate == 1.0
    # 40 tokens: 1 from prefill, then 5 per step (4 accepted + bonus).
    assert stats.num_steps <= 8
    assert stats.mean_accepted_per_step == pytest.approx(stats.num_accepted / stats.num_steps)


def test_disagreeing_draft_still_makes_progress(other_drafted):
    out = other_drafted.generate("Hello", GREEDY)
    assert len(out.token_ids) == 40
    assert out.speculative.acceptance_rate < 0.5


def test_adaptive_draft_length_proposes_less_to_a_disagreeing_draft(
    other_drafted, other_drafted_fixed
):
    adaptive = other_drafted.generate("Hello", GREEDY).speculative
    fixed = other_drafted_fixed.generate("Hello", GREEDY).speculative
    # Fixed: three tokens every step but the last two, which max_tokens cuts to 2 and 1 (the
    # step that makes the last token proposes none).
    assert fixed.num_proposed == 3 * fixed.num_steps - 6
    # Adaptive: rejections shorten the proposals towards one token (3, 2, 1, 1, ...); the same
    # tokens come out either way (test_greedy_output_is_the_targets).
    assert fixed.acceptance_rate < 0.2
    assert adaptive.num_proposed < 0.5 * fixed.num_proposed


def test_adaptive_schedule_pauses_a_draft_that_keeps_failing(other_drafted, other_drafted_fixed):
    """After a rejected one-token proposal the request decodes plainly for a while (no draft pass),
    then tries again: a few proposals in all, where shrinking alone would propose one per step.
    Paused steps are target steps like the others."""
    adaptive = other_drafted.generate("Hello", GREEDY).speculative
    fixed = other_drafted_fixed.generate("Hello", GREEDY).speculative
    assert 0 < adaptive.num_proposed < 0.2 * fixed.num_proposed
    assert adaptive.num_steps >= 39 - adaptive.num_accepted  # every token after prefill: a step


def test_adaptive_draft_length_keeps_the_maximum_while_everything_is_accepted(self_drafted):
    stats = self_drafted.generate("Hello", GREEDY).speculative
    # 39 tokens after prefill at 5 per step (4 accepted + bonus): 8 steps of 4 proposals, the
    # last cut to what max_tokens leaves.
    assert stats.num_steps == 8 and stats.num_proposed == 7 * 4 + 3


class PinnedCosts(StepCosts):
    """Step costs at a fixed ratio, whatever the steps took."""

    def __init__(self, ratio: float) -> None:
        super().__init__()
        self.pinned = ratio

    def cost(self, seconds: float) -> float:
        return self.pinned


@pytest.fixture
def pin_costs(monkeypatch):
    def pin(llm, ratio: float):
        monkeypatch.setattr(llm.engine.speculator, "costs", PinnedCosts(ratio))
        return llm

    return pin


@pytest.mark.timed_speculation
def test_timed_schedule_pauses_where_speculating_does_not_pay(plain, self_drafted, pin_costs):
    """The target as its own draft: every proposal kept, 5 tokens a step. At 2 plain steps a
    speculative step that pays and the schedule proposes as on counts alone; at 20 it does not:
    the request pauses, longer each time, probing with one token between pauses, and the paused
    steps run several to a native call.
    The tokens are the target's either way."""
    expected = plain.generate(PROMPTS, GREEDY)
    cheap = pin_costs(self_drafted, 2.0).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in cheap] == [o.token_ids for o in expected]
    assert cheap[1].speculative.num_steps == 8  # as test_adaptive_..._keeps_the_maximum_...
    costly_llm = pin_costs(self_drafted, 20.0)
    runner = costly_llm.engine.runner
    calls = []

    def run_steps(batch, columns, steps, *args, **kwargs):
        calls.append(steps)
        return run_steps.inner(batch, columns, steps, *args, **kwargs)

    run_steps.inner = runner.run_steps
    costly_llm.engine.runner.run_steps = run_steps
    try:
        costly = costly_llm.generate(PROMPTS, GREEDY)
    finally:
        del runner.run_steps
    assert [o.token_ids for o in costly] == [o.token_ids for o in expected]
    stats = costly[1].speculative
    # 39 tokens after prefill: 4 kept + 1, a pause of MIN_PAUSE, then probes of one token (2
    # tokens each) between pauses twice as long each time: 5 + 4 + 2 + 8 + 2 + 16 + 2.
    assert stats.num_proposed == 4 + 1 + 1 + 1 == stats.num_accepted
    assert stats.num_steps == 39 - 7
    assert cheap[1].speculative.num_proposed == 31
    if runner.native is not None:
        assert calls and max(calls) > 1  # paused steps, several a call
    plain_step = costly_llm.engine.speculator.costs.plain  # (timed from one step to the next)
    assert plain_step is not None and 0 < plain_step < 1


@pytest.mark.timed_speculation
@pytest.mark.parametrize("ratio", [3.0, 50.0])
def test_timed_schedules_keep_the_targets_output(plain, speculative, pin_costs, ratio):
    """Rows paused and proposing side by side (a ratio of 3 pauses the rows whose proposals are
    mostly rejected; 50 pauses every row after its first step): the greedy tokens, stop strings and
    logprobs of the target alone."""
    llm = pin_costs(speculative, ratio)
    expected = plain.generate(PROMPTS, GREEDY)
    got = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    stop = expected[0].text[9:14]
    params = [
        GREEDY.with_changes(stop=[stop]),
        GREEDY.with_changes(logprobs=2, max_tokens=17),
        GREEDY.with_changes(max_tokens=3),
        GREEDY,
    ]
    want = plain.generate(PROMPTS, params)
    got = llm.generate(PROMPTS, params)
    for a, b in zip(got, want, strict=True):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
    assert [t.token_id for t in got[1].logprobs] == [t.token_id for t in want[1].logprobs]
    assert [t.logprob for t in got[1].logprobs] == pytest.approx(
        [t.logprob for t in want[1].logprobs], abs=1e-5
    )


@pytest.mark.timed_speculation
@pytest.mark.parametrize("ratio", [0.5, 3.0, 50.0])
def test_a_seeded_request_beside_timed_rows_keeps_its_tokens(other_drafted, pin_costs, ratio):
    """Greedy rows paused or proposing by the timed rule beside it: a seeded sampled request's
    tokens are those it has alone."""
    seeded = SamplingParams(temperature=0.9, seed=21, max_tokens=30, ignore_eos=True)
    llm = pin_costs(other_drafted, ratio)
    alone = llm.generate(PROMPTS[2], seeded)
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[2]]
    batch = llm.generate(prompts, [GREEDY, seeded, GREEDY.with_changes(max_tokens=9), seeded])
    assert batch[1].token_ids == batch[3].token_ids == alone.token_ids


@pytest.mark.timed_speculation
def test_a_seeded_sampled_request_proposes_on_counts_alone(other_drafted, pin_costs):
    """Its tokens follow from its proposals, so how fast steps ran must not change them."""
    params = SamplingParams(temperature=0.8, seed=11, max_tokens=30, ignore_eos=True)
    runs = [pin_costs(other_drafted, ratio).generate(PROMPTS[:2], params) for ratio in (1.0, 50.0)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    assert [o.speculative for o in runs[0]] == [o.speculative for o in runs[1]]
    greedy = [pin_costs(other_drafted, r).generate("Hello", GREEDY) for r in (1.0, 50.0)]
    assert greedy[0].token_ids == greedy[1].token_ids
    assert greedy[1].speculative.num_proposed < greedy[0].speculative.num_proposed


def test_bad_draft_length_is_a_clear_error(tiny_dir):
    with pytest.raises(ValueError, match="draft length schedule 'short'.*adaptive, fixed"):
        load(tiny_dir, draft="ngram", draft_length="short")
    with pytest.raises(ValueError, match="draft_length='fixed' needs speculative decoding"):
        load(tiny_dir, draft_length="fixed")


def test_stop_rules_inside_accepted_runs(plain, speculative):
    reference = plain.generate("The quick brown fox", GREEDY)
    stop = reference.text[9:14]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop])
    expected = plain.generate("The quick brown fox", params)
    got = speculative.generate("The quick brown fox", params)
    assert got.text == expected.text and got.finish_reason == "stop" and got.stop_reason == stop
    assert "".join(speculative.stream("The quick brown fox", params)) == expected.text
    token = reference.token_ids[6]
    params = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[token])
    assert (
        speculative.generate("The quick brown fox", params).token_ids
        == plain.generate("The quick brown fox", params).token_ids
    )
    for max_tokens in (1, 2, 5, 7):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        out = speculative.generate("Hello", params)
        assert out.token_ids == reference_prefix(plain, "Hello", max_tokens)
        assert out.finish_reason == "length"
        # Stats on every output (max_tokens=1 had None), counting only emitted proposals (a
        # stop inside an accepted run counted the dropped ones): each step emits its accepted
        # proposals and one token of the target's, the first token came from the prompt.
        stats = out.speculative
        assert stats is not None
        assert stats.num_accepted <= len(out.token_ids) - 1
    stopped = speculative.generate(
        "The quick brown fox",
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop]),
    )
    assert stopped.speculative.num_accepted <= len(stopped.token_ids) - 1


def reference_prefix(plain, prompt, n):
    return plain.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    ).token_ids


def test_context_limit(plain, self_drafted):
    prompt = list(range(5, 5 + 240))
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    out = self_drafted.generate(prompt, params)
    assert out.token_ids == plain.generate(prompt, params).token_ids
    assert len(prompt) + len(out.token_ids) == 256


def test_logprobs_match_plain_decoding(plain, speculative):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    expected = plain.generate("Hello", params).logprobs
    got = speculative.generate("Hello", params).logprobs
    assert [e.token_id for e in got] == [e.token_id for e in expected]
    for a, b in zip(got, expected):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]


def test_seeded_sampling_is_reproducible(speculative):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=30, seed=5, ignore_eos=True)
    first = speculative.generate("Hello", params).token_ids
    assert speculative.generate("Hello", params).token_ids == first
    mixed = speculative.generate(["The quick", "Hello"], [GREEDY, params])
    assert mixed[1].token_ids == first


def test_constrained_output_stays_valid(plain, speculative):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
    for temperature, seed in ((0.0, None), (1.0, 3)):
        params = SamplingParams(
            temperature=temperature, seed=seed, max_tokens=120, json_schema=schema
        )
        out = speculative.generate("JSON:", params)
        if out.finish_reason == "stop":
            data = json.loads(out.text)
            assert set(data) == {"name", "n"} and len(data["name"]) <= 8
        else:
            assert out.finish_reason == "length"
        if temperature == 0.0:
            assert out.token_ids == plain.generate("JSON:", params).token_ids


def test_vocabulary_mismatch_is_a_clear_error(tiny_dir, other_draft_dir, tmp_path):
    mismatched = shutil.copytree(other_draft_dir, tmp_path / "other-tokenizer")
    train_tokenizer(vocab_size=300).save(str(mismatched / "tokenizer.json"))
    with pytest.raises(ValueError, match="token"):
        load(tiny_dir, draft=mismatched)
    assert load(tiny_dir, draft="ngram").generate("Hello", GREEDY).finish_reason == "length"


def test_dynamic_ntk_past_the_trained_context_gives_the_plain_output(tmp_path):
    # Past its trained context a dynamic NTK model rotates a pass's rows by their longest
    # position: a row of proposals rotated them (and the keys it caches) otherwise than one-token
    # steps, and greedy output diverged from the plain engine's 25-42 tokens in.
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    path = make_tiny_checkpoint(
        tmp_path / "dynamic", max_position_embeddings=32, rope_parameters=rope
    )
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, logprobs=1)
    plain = load(path)  # max_seq_len 256, far past the trained 32
    expected = plain.generate(PROMPTS, params)
    plain.close()
    for draft in ("ngram", path):
        drafted = load(path, draft=draft, num_speculative_tokens=4)
        try:
            for want, got in zip(expected, drafted.generate(PROMPTS, params)):
                assert got.token_ids == want.token_ids
                assert [lp.logprob for lp in got.logprobs] == [lp.logprob for lp in want.logprobs]
                assert got.speculative is not None and got.speculative.num_proposed > 0
        finally:
            drafted.close()


def test_a_grammar_naming_eos_mid_output_gives_the_targets_output(plain, speculative):
    # Rolling back a rejected proposal that held an EOS the grammar names left llguidance's
    # state broken: the request's next token failed ("the grammar rejected token ...")
    eos = plain.tokenizer.eos_token_ids[0]
    grammar = f'start: /[a-z]{{1,8}}/ <[{eos}]> /[a-z]{{1,8}}/ <[{eos}]> "end"'
    params = SamplingParams(temperature=0, max_tokens=40, grammar=grammar)
    prompts = ["Write one lowercase word.", "abc", "Hello world", "def add(a, b):"]
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    assert [o.token_ids for o in speculative.generate(prompts, params)] == expected


# Found by fuzzing: a grammar so ambiguous that llguidance passes its item limit mid-output.
TOO_AMBIGUOUS_GBNF = r"""root ::= (my-rule-2)* | ("é [")+ "}+東" "]"
a1-1 ::= ("z")* ("(\t "){1,3} "🙂" |
    ((([\x7f🙂-🙃0]){0,2} root my-rule-2 | .)){0,2}
my-rule-2 ::= ("b{\x01")* a1-1 (([^z] (b_c-3)? ("'+" "xx1" my-rule-2) | ([\]🙂-🙃一-丏] | [A-C\x00-\x1f] (root)* [^y\na-c]) a1-1))? |
    (.)* my-rule-2 "9" |
    [一-丏a\]] ([à-ÿ]){2}
b_c-3 ::= "\"" (root){1,3} ("z"){2,} | ((("é[-"){2}) my-rule-2 (my-rule-2)*) [\x00-\x1f] ([🙂-🙃\[{]){1,3} | ".*\x01" (my-rule-2)+ (b_c-3){0,2}
"""


def test_a_grammar_past_llguidances_limits_fails_only_its_request(tiny_dir):
    """With a draft, a matcher that failed while the proposals' masks were computed could not be
    rolled back: "llguidance rollback failed" (RuntimeError) failed every request of the batch,
    unconstrained ones too. Now, as without a draft, each such request gets its ConstraintError."""
    import asyncio

    from brisklm.constrained import ConstraintError

    settings = dict(draft="ngram", num_speculative_tokens=3, max_batch_size=8, show_progress=False)
    with LLM.from_pretrained(tiny_dir, max_seq_len=256, **settings) as llm:
        free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        requests = [llm.make_request("Hello there", free)]
        for seed, prompt in enumerate(["The quick brown", "abc 123", "東京 🙂", "Hi"], start=1):
            params = SamplingParams(
                grammar=TOO_AMBIGUOUS_GBNF, grammar_syntax="gbnf", seed=seed, max_tokens=48
            )
            requests.append(llm.make_request(prompt, params))

        async def run():
            return dict([pair async for pair in llm.arun_requests_each(requests)])

        results = asyncio.run(run())
        assert results[0].finish_reason == "length" and len(results[0].token_ids) == 40
        failed = [r for r in results.values() if isinstance(r, BaseException)]
        assert all(isinstance(r, ConstraintError) for r in failed), failed
        assert all("could not be enforced past" in str(r) for r in failed)
        assert llm.generate("Hi", SamplingParams(choice=["ok"], max_tokens=5)).text == "ok"
        if not failed:
            pytest.skip("this llguidance stays within its limits on the grammar")


def test_logprobs_do_not_change_a_seeded_constrained_requests_tokens(speculative):
    """With logprobs, the tokens a grammar forces went through the proposals (drawn and tested
    one by one) instead of being appended at once: proposals and random draws then differed,
    and so did a seeded request's tokens (10 seeds of 10 with the target as its own draft)."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    eos = speculative.tokenizer.eos_token_ids[0]
    # An EOS a grammar names inside a forced run: text with more to follow, or the end.
    words = f'" is the word" <[{eos}]> " and then " /[a-z]{{2,5}}/ " the end"'
    constraints = [
        {"json_schema": schema},
        {"grammar": f"start: /[a-z]{{1,4}}/ {words}"},
        {"grammar": f'start: /[a-z]{{1,6}}/ " is the quick brown word" <[{eos}]>'},
    ]
    for constraint in constraints:
        for seed in range(6):
            params = SamplingParams(temperature=1.0, seed=seed, max_tokens=30, **constraint)
            without = speculative.generate("JSON:", params)
            with_logprobs = speculative.generate("JSON:", params.with_changes(logprobs=1))
            assert with_logprobs.token_ids == without.token_ids, (constraint, seed)
            assert with_logprobs.text == without.text
            assert len(with_logprobs.logprobs) == len(with_logprobs.token_ids)
            assert with_logprobs.speculative == without.speculative


def test_a_seeded_constrained_request_does_not_depend_on_its_batch(other_drafted):
    """A request its schedule pauses takes a plain step alone (a forced token drawing nothing)
    but a verification row beside drafting requests: that row drew for its forced token, and
    from there its seeded tokens differed (logprobs take forced tokens one a step)."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer"},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "age"],
    }
    for seed in range(20):
        params = SamplingParams(
            temperature=0.8, seed=seed, max_tokens=36, json_schema=schema, logprobs=2
        )
        alone = other_drafted.generate("JSON:", params)
        beside = other_drafted.generate(["JSON:", "The quick brown fox"], [params, GREEDY])[0]
        assert beside.token_ids == alone.token_ids, seed


@pytest.mark.parametrize("draft_length", ["fixed", "adaptive"])
def test_constrained_sampling_ends_as_often_as_the_targets(tiny_dir, plain, draft_length):
    """A drafted EOS under a grammar was dropped and the target drew that position afresh, so
    with the target as its own draft output ended at the first chance with p(EOS)^2, not
    p(EOS) (TV 0.26 from the target's length distribution here). Seeds are fixed: the figures
    are the same each run."""
    eos = plain.tokenizer.eos_token_ids[0]
    n = 2000
    params = [
        SamplingParams(
            temperature=1.0, seed=s, max_tokens=4, regex="[a-z]{1,8}", logit_bias={eos: 4.0}
        )
        for s in range(n)
    ]
    drafted = load(
        tiny_dir,
        max_batch_size=64,
        max_seq_len=64,
        draft=tiny_dir,
        num_speculative_tokens=4,
        draft_length=draft_length,
    )
    try:
        outputs = [llm.generate(["Hello"] * n, params) for llm in (plain, drafted)]
    finally:
        drafted.close()
    assert sum(o.speculative.num_accepted for o in outputs[1]) > n
    # A kept EOS counts as an accepted proposal: the target drafting for itself keeps what it
    # proposes (452 of these requests reported an acceptance rate of 0 when it did not count).
    assert sum(o.speculative.acceptance_rate < 0.5 for o in outputs[1]) < 0.02 * n
    lengths = [Counter(len(o.token_ids) for o in outs) for outs in outputs]
    assert lengths[0][2] > 0.1 * n  # the first chance to end is taken often
    tv = sum(abs(lengths[0][k] - lengths[1][k]) for k in range(1, 5)) / (2 * n)
    assert tv < 0.05, lengths


# A proposer that fails (a draft model's pass out of memory, a bug) costs its requests the speedup,
# not their output: they decode to their end without it, and later requests use it again.
FALLBACK_GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
FALLBACK_PROMPTS = ["The quick brown fox", "Hello", "def add(a, b):"]


def fail_draft_passes(llm, after: int):
    """Make the draft model's passes raise after ``after`` of them ran; returns what undoes it
    and a list that counts the passes tried."""
    runner = llm.engine.speculator.proposer.runner
    forward, forward_greedy = runner.forward, runner.forward_greedy
    tried = []

    def failing(batch, *greedy_columns):
        tried.append(batch)
        if len(tried) > after:
            raise RuntimeError("simulated draft out of memory")
        return forward_greedy(batch, *greedy_columns) if greedy_columns else forward(batch)

    def restore() -> None:
        runner.forward, runner.forward_greedy = forward, forward_greedy

    runner.forward = runner.forward_greedy = failing
    return restore, tried


@pytest.mark.parametrize("draft_length", ["adaptive", "fixed"])
@pytest.mark.parametrize("after", [0, 3])
def test_requests_whose_draft_fails_keep_the_targets_tokens(
    tiny_dir, other_draft_dir, plain, caplog, draft_length, after
):
    expected = [out.token_ids for out in plain.generate(FALLBACK_PROMPTS, FALLBACK_GREEDY)]
    llm = load(tiny_dir, draft=other_draft_dir, num_speculative_tokens=3, draft_length=draft_length)
    try:
        restore, tried = fail_draft_passes(llm, after)
        runner = llm.engine.runner
        run_steps, calls = runner.run_steps, []

        def counting(batch, columns, steps, *args, **kwargs):
            calls.append(steps)
            return run_steps(batch, columns, steps, *args, **kwargs)

        runner.run_steps = counting
        with caplog.at_level(logging.WARNING, logger="brisklm.engine.speculation"):
            outs = llm.generate(FALLBACK_PROMPTS, FALLBACK_GREEDY)
        del runner.run_steps
        assert [out.token_ids for out in outs] == expected
        if runner.native is not None:  # without the draft, several steps a native call
            assert max(calls, default=0) > 1, calls
        assert all(out.finish_reason == "length" for out in outs)
        assert "speculative proposer failed (RuntimeError: simulated draft" in caplog.text
        # The draft is not tried again for them: at most one failed pass per prompt's prefill
        # and one per decoding step that proposed.
        assert len(tried) <= after + 2
        assert all(out.speculative.num_steps >= 1 for out in outs)
        # The next requests use it again (3 passes ran before the failure: some were proposals).
        restore()
        again = llm.generate(FALLBACK_PROMPTS, FALLBACK_GREEDY)
        assert [out.token_ids for out in again] == expected
        assert sum(out.speculative.num_proposed for out in again) > 0
        assert llm.engine.scheduler.slots.num_free == 4
    finally:
        llm.close()


def test_a_draft_failing_on_a_prompt_chunk_leaves_the_decoding_requests_drafting(
    tiny_dir, other_draft_dir, plain
):
    """The draft fails on the long prompt's chunks only: that request decodes without it, the
    one decoding beside it keeps proposing."""
    long_prompt = list(range(5, 105))
    expected_long = plain.generate(long_prompt, FALLBACK_GREEDY).token_ids
    expected_short = plain.generate("Hello", FALLBACK_GREEDY).token_ids
    llm = load(tiny_dir, draft=tiny_dir, num_speculative_tokens=3, prefill_chunk_size=32)
    try:
        runner = llm.engine.speculator.proposer.runner
        forward = runner.forward

        def fail_long_rows(batch, *greedy_columns):
            if any(len(tokens) >= 32 for tokens in batch.token_ids):
                raise RuntimeError("simulated draft out of memory")
            if greedy_columns:
                return type(runner).forward_greedy(runner, batch, *greedy_columns)
            return forward(batch)

        runner.forward = runner.forward_greedy = fail_long_rows
        short = llm.make_request("Hello", FALLBACK_GREEDY)
        llm.engine.add_request(short)
        for _ in range(2):
            llm.engine.step()
        long = llm.make_request(long_prompt, FALLBACK_GREEDY)
        llm.engine.add_request(long)
        while not (short.is_finished and long.is_finished):
            for _, result in llm.engine.step():
                assert not isinstance(result, BaseException), result
        assert long.output_token_ids == expected_long
        assert short.output_token_ids == expected_short
        assert long.speculative.num_proposed == 0
        # The target as its own draft: every proposal kept, several tokens a step.
        assert short.speculative.num_accepted > 10
    finally:
        llm.close()


def test_seeded_sampled_requests_finish_when_their_draft_fails(tiny_dir, other_draft_dir):
    sampled = SamplingParams(temperature=0.9, seed=3, max_tokens=30, ignore_eos=True)
    llm = load(tiny_dir, draft=other_draft_dir, num_speculative_tokens=3)
    try:
        fail_draft_passes(llm, 2)
        outs = llm.generate(FALLBACK_PROMPTS, sampled)
        assert [len(out.token_ids) for out in outs] == [30] * 3
        assert all(out.finish_reason == "length" for out in outs)
    finally:
        llm.close()


def test_a_failing_ngram_proposer_falls_back_as_a_draft_model_does(tiny_dir, plain, monkeypatch):
    expected = [out.token_ids for out in plain.generate(FALLBACK_PROMPTS, FALLBACK_GREEDY)]
    llm = load(tiny_dir, draft="ngram", num_speculative_tokens=3)
    try:

        def fail(rows):
            raise ValueError("simulated lookup bug")

        monkeypatch.setattr(llm.engine.speculator.proposer, "propose", fail)
        outs = llm.generate(FALLBACK_PROMPTS, FALLBACK_GREEDY)
        assert [out.token_ids for out in outs] == expected
        assert all(out.speculative.num_proposed == 0 for out in outs)
    finally:
        llm.close()
