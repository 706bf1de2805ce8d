"""Constrained decoding through the engine with a random-weight model (it wants garbage): every
output matches its JSON Schema, regex, choice or grammar, at temperature 0 and 1."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from brisklm import LLM, SamplingParams
from brisklm.constrained import ConstraintError
from tests.constraint_cases import SCHEMAS, Person, Team

MAX_TOKENS = 400
RUNS = [(0.0, None), (1.0, 11), (1.0, 12)]


@pytest.fixture(scope="module")
def llm(tiny_dir):
    model = LLM.from_pretrained(
        tiny_dir, device="cpu", max_batch_size=4, max_seq_len=512, show_progress=False
    )
    yield model
    model.close()


def validator(schema):
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    return jsonschema.Draft202012Validator(schema, format_checker=checker)


def run_all(llm, must_finish=True, runs=RUNS, **constraint):
    """One batch with every (temperature, seed) run; returns the texts of finished runs.

    A random model may ramble inside an unbounded grammar (a number with endless digits): such a
    run must end on max_tokens and say so ("length"), never claim a valid output. With
    ``must_finish`` every run must reach the end of its grammar.
    """
    params = [
        SamplingParams(temperature=t, seed=seed, max_tokens=MAX_TOKENS, **constraint)
        for t, seed in runs
    ]
    outs = llm.generate(["Reply in JSON:"] * len(params), params)
    finished = []
    for out in outs:
        if out.finish_reason == "length" and not must_finish:
            assert len(out.token_ids) == MAX_TOKENS
            continue
        assert out.finish_reason == "stop", (
            f"{out.finish_reason} after {len(out.token_ids)} tokens: {out.text!r}"
        )
        finished.append(out.text)
    assert finished, "no run finished"
    return finished


# Schemas whose every value is bounded (no free-length numbers, recursion or open strings): a
# random model must finish all of them. Elsewhere it may ramble (digits forever) and hit max_tokens.
BOUNDED = {"array_bounds", "prefix_items", "string_lengths", "pattern_formats"}
MORE_RUNS = RUNS + [(1.0, seed) for seed in range(20, 24)]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schemas(llm, name):
    schema = SCHEMAS[name]
    bounded = name in BOUNDED
    runs = RUNS if bounded else MORE_RUNS
    for text in run_all(llm, must_finish=bounded, runs=runs, json_schema=schema):
        validator(schema).validate(json.loads(text))


@pytest.mark.parametrize("model", [Person, Team])
def test_pydantic_models(llm, model):
    for text in run_all(llm, must_finish=False, runs=MORE_RUNS, json_schema=model):
        model.model_validate_json(text)
        validator(model.model_json_schema()).validate(json.loads(text))


def test_json_mode(llm):
    for text in run_all(llm, must_finish=False, json_object=True):
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    "pattern", [r"[0-9]{3}-[0-9]{4}", r"(yes|no)( maybe)?", r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)"]
)
def test_regex(llm, pattern):
    for text in run_all(llm, regex=pattern):
        assert re.fullmatch(pattern, text), text


def test_choice(llm):
    options = ["positive", "negative", "très bien", "😀 ok"]
    for text in run_all(llm, choice=options):
        assert text in options


def test_lark_and_gbnf_grammars(llm):
    lark = 'start: expr\nexpr: term (("+" | "-") term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]{1,3}/\n'
    for text in run_all(llm, must_finish=False, grammar=lark):
        assert re.fullmatch(r"[0-9()+-]+", text)
        eval(compile(text, "<grammar>", "eval"))  # noqa: S307 - digits, parens, + and - only
    gbnf = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c] | "x" [0-9]\n'
    for text in run_all(llm, grammar=gbnf, grammar_syntax="gbnf"):
        assert re.fullmatch(r"\(([a-c]|x[0-9])(,([a-c]|x[0-9]))*\)", text), text


def test_mixed_batch_and_streaming(llm):
    schema = SCHEMAS["pattern_formats"]
    free = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, json_schema=schema)
    outs = llm.generate(["Hello", "JSON:", "The quick"], [free, constrained, free])
    assert outs[0].token_ids == llm.generate("Hello", free).token_ids
    assert outs[2].token_ids == llm.generate("The quick", free).token_ids
    validator(schema).validate(json.loads(outs[1].text))
    streamed = "".join(llm.stream("JSON:", constrained))
    assert streamed == outs[1].text


def counted_passes(llm, monkeypatch) -> list:
    """The batches of the forward passes ``llm`` runs from now on (the list grows)."""
    calls = []
    original = llm.engine.runner.forward

    def counting(batch):
        calls.append(batch)
        return original(batch)

    monkeypatch.setattr(llm.engine.runner, "forward", counting)
    return calls


def test_forced_tokens_skip_forward_passes(llm, monkeypatch):
    schema = {
        "type": "object",
        "properties": {
            "an_unusually_long_property_name": {"type": "integer", "minimum": 0, "maximum": 9}
        },
        "required": ["an_unusually_long_property_name"],
        "additionalProperties": False,
    }
    calls = counted_passes(llm, monkeypatch)
    out = llm.generate("JSON:", SamplingParams(temperature=0.0, max_tokens=100, json_schema=schema))
    monkeypatch.undo()
    assert json.loads(out.text)["an_unusually_long_property_name"] in range(10)
    # One prefill, then far fewer passes than tokens: the key was fed in one go, not sampled.
    assert len(calls) < len(out.token_ids) - 5
    assert max(len(tokens) for batch in calls[1:] for tokens in batch.token_ids) > 3


@pytest.mark.parametrize("max_tokens", [100, 9])
def test_a_request_with_logprobs_takes_a_forced_run_in_one_pass(llm, monkeypatch, max_tokens):
    """With logprobs, forced tokens were decoded one a step (their logprobs need the model's
    logits there). Now the grammar takes the run at once and the next pass feeds it, computing
    each token's logits: the same logprobs, a pass per run instead of one per token."""
    from brisklm.engine.structured import StructuredOutputs

    schema = {
        "type": "object",
        "properties": {"an_unusually_long_property_name": {"type": "string", "maxLength": 6}},
        "required": ["an_unusually_long_property_name"],
        "additionalProperties": False,
    }
    calls = counted_passes(llm, monkeypatch)

    def run(seed):
        calls.clear()
        params = SamplingParams(
            temperature=0.9, seed=seed, max_tokens=max_tokens, json_schema=schema, logprobs=3
        )
        return llm.generate("JSON:", params), len(calls)

    for seed in range(3):
        out, passes = run(seed)
        with monkeypatch.context() as one_a_step:  # the old way: each forced token a step
            one_a_step.setattr(StructuredOutputs, "forced_tokens", staticmethod(lambda r: []))
            alone, passes_alone = run(seed)
        assert out.token_ids == alone.token_ids and out.text == alone.text
        assert out.finish_reason == alone.finish_reason
        assert out.logprobs == alone.logprobs  # ids, values, ranks and alternatives, to the bit
        assert len(out.logprobs) == len(out.token_ids)
        assert passes < passes_alone - 5 if max_tokens == 100 else passes <= passes_alone
        if max_tokens == 100:
            validator(schema).validate(json.loads(out.text))


@pytest.mark.parametrize(
    "constraint, stop, text, reason",
    [
        ({"regex": "say hello world"}, None, "say hello world", None),  # the run ends it
        ({"regex": "say hello world"}, ["lo w"], "say hel", "lo w"),  # a stop string inside it
        ({"choice": ["an unusually long answer"]}, None, "an unusually long answer", None),
    ],
)
def test_a_pending_forced_run_ends_the_output_as_an_appended_one_does(
    llm, constraint, stop, text, reason
):
    for logprobs in (None, 2):
        params = SamplingParams(
            temperature=1.0, seed=1, max_tokens=40, stop=stop, logprobs=logprobs, **constraint
        )
        out = llm.generate("Say", params)
        assert (out.text, out.finish_reason, out.stop_reason) == (text, "stop", reason)
        chunks = list(llm.stream_chunks("Say", params))
        assert [t for c in chunks for t in c.token_ids] == out.token_ids
        assert "".join(c.text for c in chunks) == text
        if logprobs:
            assert [lp for c in chunks for lp in c.logprobs or ()] == out.logprobs
            assert len(out.logprobs) == len(out.token_ids)
            assert [lp.token_id for lp in out.logprobs] == out.token_ids
    assert not llm.engine.has_unfinished


def test_an_eos_a_grammar_names_inside_a_forced_run_keeps_its_role_when_pending(llm, monkeypatch):
    """A pending run's tokens join the output after the grammar took them all: each keeps the
    role it had when the grammar took it (an EOS as text with more to follow, or the end)."""
    from brisklm.engine.structured import StructuredOutputs

    eos = llm.tokenizer.eos_token_ids[0]
    grammars = [
        f'start: /[a-z]{{1,4}}/ " is the word" <[{eos}]> " and then " /[a-z]{{2,5}}/ " the end"',
        f'start: /[a-z]{{1,6}}/ " is the quick brown word" <[{eos}]>',
    ]
    for grammar in grammars:
        for seed in range(3):
            params = SamplingParams(temperature=1.0, seed=seed, max_tokens=40, grammar=grammar)
            without = llm.generate("Hello", params)
            with_logprobs = llm.generate("Hello", params.with_changes(logprobs=2))
            with monkeypatch.context() as one_a_step:
                one_a_step.setattr(StructuredOutputs, "forced_tokens", staticmethod(lambda r: []))
                stepped = llm.generate("Hello", params.with_changes(logprobs=2))
            assert with_logprobs.token_ids == without.token_ids == stepped.token_ids
            assert with_logprobs.text == without.text == stepped.text
            assert with_logprobs.finish_reason == without.finish_reason == "stop"
            assert with_logprobs.logprobs == stepped.logprobs


def test_length_limit_is_reported_not_claimed_valid(llm):
    params = SamplingParams(temperature=0.0, max_tokens=3, json_schema=SCHEMAS["types"])
    out = llm.generate("JSON:", params)
    assert out.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_errors_before_generation(llm):
    with pytest.raises(ConstraintError, match="line 1"):
        llm.generate("x", SamplingParams(grammar="start: (((", max_tokens=5))
    with pytest.raises(ValueError, match="uniqueItems"):
        llm.generate("x", SamplingParams(json_schema={"type": "array", "uniqueItems": True}))
    with pytest.raises(ValueError):
        llm.generate("x", SamplingParams(regex="[a-", max_tokens=5))
    with pytest.raises(ValueError, match="at most one constraint"):
        SamplingParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(regex="a+", min_tokens=2)
    with pytest.raises(ConstraintError, match="regex matches no output at all"):
        llm.generate("x", SamplingParams(regex=r"[^\x00-\x{10FFFF}]", max_tokens=5))
    assert not llm.engine.has_unfinished
    assert llm.generate("x", SamplingParams(choice=["ok"], max_tokens=5)).text == "ok"


def test_constraint_past_llguidance_limits_is_a_constraint_error(llm):
    # llguidance gives up on these: a clear ConstraintError for this request (not "rejected
    # token ..."), at submit, and the engine goes on.
    with pytest.raises(ConstraintError, match="llguidance stopped with .*exceeds its limits"):
        llm.generate("x", SamplingParams(regex="(a{1000}){1000}", max_tokens=5))
    with pytest.raises(ConstraintError, match="never ends"):
        llm.generate("x", SamplingParams(grammar='start: "a" start', max_tokens=5))
    assert not llm.engine.has_unfinished
    assert llm.generate("x", SamplingParams(choice=["ok"], max_tokens=5)).text == "ok"


def test_a_dead_end_in_llguidances_grammar_is_named_as_one(llm):
    """llguidance 1.9's multipleOf ranges can leave no token to continue (NoExtensionBias) once a
    branch is chosen: the error says so rather than blaming the grammar's size."""
    narrow = {"type": "number", "minimum": 2.5, "exclusiveMaximum": 2.500001, "multipleOf": 0.25}
    schema = {"anyOf": [{"type": "object", "properties": {"x": narrow}, "required": ["x"]}]}
    schema["anyOf"].append({"type": "null"})
    errors = []
    for seed in range(8):
        try:
            llm.generate("x", SamplingParams(json_schema=schema, seed=seed, max_tokens=20))
        except ConstraintError as error:
            errors.append(str(error))
    if not errors:
        pytest.skip("this llguidance finds no dead end in the schema")
    assert all("NoExtensionBias': no token continues the output" in e for e in errors)
    assert not any("exceeds its limits" in e for e in errors)
    assert llm.generate("x", SamplingParams(choice=["ok"], max_tokens=5)).text == "ok"


def test_chat_with_constraint(llm):
    reply = llm.chat(
        [{"role": "user", "content": "Pick"}], SamplingParams(choice=["red", "blue"], max_tokens=5)
    )
    assert reply.content in ("red", "blue")
    assert reply.finish_reason == "stop"


@pytest.mark.parametrize("seed", range(4))
def test_logprobs_and_a_forced_start_do_not_change_seeded_tokens(llm, seed):
    # With logprobs, forced tokens were sampled one a step, each taking a random draw, so every
    # token sampled after them differed from the same request without logprobs.
    regex = r"ab日本語 [a-z]{3,8} (yes|no) done"
    plain = SamplingParams(temperature=1.0, seed=seed, max_tokens=40, regex=regex)
    reported = SamplingParams(temperature=1.0, seed=seed, max_tokens=40, regex=regex, logprobs=2)
    without, with_logprobs = llm.generate(["Hi", "Hi"], [plain, reported])
    assert with_logprobs.token_ids == without.token_ids
    assert len(with_logprobs.logprobs) == len(with_logprobs.token_ids)
    # The forced start is the forced tokens (no draw picked a shorter token under the mask).
    assert without.token_ids[:2] == llm.tokenizer.encode("ab日本語", add_special_tokens=False)[:2]


def test_the_end_of_a_grammar_is_not_text_even_with_ignore_eos(llm):
    # ignore_eos makes the model's EOS ordinary text; the grammar's end still ends the output, and
    # skip_special_tokens=False must not print it as '<|im_end|>'.
    eos = llm.tokenizer.eos_token_ids[0]
    for ignore_eos in (False, True):
        params = [
            SamplingParams(
                temperature=1.0,
                seed=seed,
                max_tokens=60,
                json_schema={"type": "integer"},
                ignore_eos=ignore_eos,
                skip_special_tokens=False,
            )
            for seed in range(6)
        ]
        outs = llm.generate(["Number:"] * len(params), params)
        ended = [o for o in outs if o.finish_reason == "stop"]
        assert any(o.token_ids[-1] == eos for o in ended), "no run ended on EOS"
        for out in ended:
            assert re.fullmatch(r"-?(0|[1-9][0-9]*)", out.text), out.text
        streamed = "".join(llm.stream("Number:", params[0]))
        assert streamed == outs[0].text


def test_a_grammar_that_names_eos_writes_it(llm):
    eos = llm.tokenizer.eos_token_ids[0]
    eos_text = llm.tokenizer.decode([eos], skip_special_tokens=False)
    for grammar in (f'start: "yes" <[{eos}]>', f'start: "yes" {eos_text}'):
        out = llm.generate("Say yes:", SamplingParams(max_tokens=10, grammar=grammar))
        assert (out.text, out.finish_reason, out.token_ids[-1]) == ("yes", "stop", eos)
        kept = SamplingParams(max_tokens=10, grammar=grammar, skip_special_tokens=False)
        assert llm.generate("Say yes:", kept).text == "yes"


def test_an_eos_the_grammar_names_mid_output_is_text_not_the_end(llm):
    # The output ended at the EOS ("ok", finish "stop"), a grammar's whole output by the README
    eos = llm.tokenizer.eos_token_ids[0]
    grammar = f'start: "ok" <[{eos}]> "more"'
    out = llm.generate("Say:", SamplingParams(max_tokens=10, grammar=grammar))
    assert (out.text, out.finish_reason, out.token_ids[-1] != eos) == ("okmore", "stop", True)
    assert eos in out.token_ids
    kept = SamplingParams(max_tokens=10, grammar=grammar, skip_special_tokens=False)
    eos_text = llm.tokenizer.decode([eos], skip_special_tokens=False)
    assert llm.generate("Say:", kept).text == f"ok{eos_text}more"


def test_a_grammar_llguidance_panics_on_after_an_eos_as_content_fails_that_request_only(llm):
    # llguidance (1.9) panics checking the second EOS this grammar names after a one-letter
    # word (its mask allowed it): the request failed "the grammar rejected token 4 (no error
    # reported)", and the compiled grammar, poisoned, failed every later request with it.
    eos = llm.tokenizer.eos_token_ids[0]
    grammar = f'start: /[a-z]{{1,4}}/ <[{eos}]> /[a-z]{{1,4}}/ <[{eos}]> "end"'
    biased = SamplingParams(temperature=0, max_tokens=20, grammar=grammar, logit_bias={eos: 3.0})
    try:
        out = llm.generate("Hello", biased)
    except ConstraintError as exc:
        assert "llguidance failed internally on this grammar (panic:" in str(exc)
    else:  # a later llguidance
        assert out.finish_reason == "length" or out.text.endswith("end")
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=20, grammar=grammar))
    assert out.finish_reason == "length" or re.fullmatch("[a-z]{1,8}end", out.text), out.text


def test_a_grammar_llguidance_fails_on_is_an_error_not_a_finished_output(llm, monkeypatch):
    # A failure inside llguidance while it computed forced tokens left the matcher stopped, and
    # the request finished "stop" with a cut, invalid output; the compiled grammar, whose state
    # the failed copy shares, then failed every later request at once (PoisonError).
    from brisklm.constrained.matcher import GrammarMatcher

    params = SamplingParams(max_tokens=20, grammar='start: "<a>" /[a-z]+/ "</a>!"')
    compiler = llm.engine.structured.compiler
    compute_ff_tokens = GrammarMatcher.compute_ff_tokens
    calls = {"n": 0}

    def failing(self):
        calls["n"] += 1
        if calls["n"] == 3:  # as llguidance's panics do: the matcher stops with an error
            monkeypatch.setattr(type(self), "error", property(lambda _: "panic: simulated"))
            monkeypatch.setattr(type(self), "is_stopped", lambda _: True)
            return []
        return compute_ff_tokens(self)

    monkeypatch.setattr(GrammarMatcher, "compute_ff_tokens", failing)
    with pytest.raises(ConstraintError, match="llguidance failed internally .*panic: simulated"):
        llm.generate("x", params)
    assert params.constraint.key not in compiler._cache  # compiled afresh next time
    monkeypatch.undo()
    out = llm.generate("x", params)
    assert out.finish_reason == "length" or re.fullmatch("<a>[a-z]+</a>!", out.text)
    assert not llm.engine.has_unfinished


def test_grammar_cache_size_bounds_the_compiled_grammars(tiny_dir):
    llm = LLM.from_pretrained(
        tiny_dir, device="cpu", max_seq_len=128, show_progress=False, grammar_cache_size=2
    )
    try:
        compiled = []
        for options in (["a", "b"], ["c", "d"], ["e", "f"], ["c", "d"]):
            assert llm.generate("x", SamplingParams(choice=options, max_tokens=5)).text in options
            compiled.append(
                llm.engine.structured.compiler.compile(SamplingParams(choice=options).constraint)
            )
        compiler = llm.engine.structured.compiler
        assert compiler.max_cache_size == 2 and compiler.num_cached == 2
        assert compiled[3] is compiled[1]  # the second choice was still cached, not compiled again
        assert llm.generate("x", SamplingParams(choice=["a", "b"], max_tokens=5)).text in "ab"
        again = compiler.compile(SamplingParams(choice=["a", "b"]).constraint)
        assert again is not compiled[0]  # the first had been dropped: compiled again
        assert compiler.num_cached == 2
    finally:
        llm.close()


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_grammar_cache_size_must_be_a_positive_int(tiny_dir, bad):
    with pytest.raises(ValueError, match=r"grammar_cache_size must be an int >= 1, got"):
        LLM.from_pretrained(tiny_dir, device="cpu", show_progress=False, grammar_cache_size=bad)


def test_top_logprobs_under_a_constraint_leave_out_the_tokens_it_masks(llm):
    """A choice between two words allows few tokens a step: the top-5 alternatives were padded
    with masked tokens of logprob -inf (which no JSON can write)."""
    params = SamplingParams(choice=["yes", "no"], max_tokens=5, temperature=0.0, logprobs=5)
    out = llm.generate("Pick", params)
    assert out.text in ("yes", "no") and out.logprobs
    for entry in out.logprobs:
        assert 1 <= len(entry.top) <= 5
        assert all(math.isfinite(top.logprob) for top in entry.top)
        assert entry.token_id in [top.token_id for top in entry.top]  # greedy: the top one
    # The last step allows one token (the grammar's end, or the word's last piece).
    assert len(out.logprobs[-1].top) < 5


def test_masks_are_filled_beside_the_pass_only_where_a_cpu_is_free(llm, monkeypatch):
    """A worker filling the masks while the pass ran took a core from the pass's threads where
    they had every CPU (they waited for it at their barriers): there the masks are filled before
    the pass. The same tokens either way."""
    import threading

    import torch

    import brisklm.engine.structured as structured
    from brisklm.kernels.omp import available_cpus

    outputs = llm.engine.structured
    cpus = available_cpus()
    with monkeypatch.context() as threads:
        threads.setattr(torch, "get_num_threads", lambda: cpus)
        assert not outputs.overlaps()
        threads.setattr(torch, "get_num_threads", lambda: cpus - 1)
        assert outputs.overlaps()
    on_gpu = structured.StructuredOutputs(llm.tokenizer, 1, device=torch.device("cuda"))
    assert on_gpu.overlaps()

    fill = structured.fill_bitmasks
    fillers: set[str] = set()

    def recorded(*args, **kwargs):
        fillers.add(threading.current_thread().name.split("_")[0])
        return fill(*args, **kwargs)

    monkeypatch.setattr(structured, "fill_bitmasks", recorded)
    schema = SCHEMAS["nested_optional"]
    params = [
        SamplingParams(temperature=1.0, seed=seed, max_tokens=60, json_schema=schema)
        for seed in range(3)
    ] + [SamplingParams(temperature=0.8, seed=5, max_tokens=20)]
    tokens = {}
    for overlap in (True, False):
        fillers.clear()
        monkeypatch.setattr(
            structured.StructuredOutputs, "overlaps", lambda self, overlap=overlap: overlap
        )
        outs = llm.generate(["Person:", "JSON:", "A", "Hello"], params)
        tokens[overlap] = [o.token_ids for o in outs]
        assert fillers == ({"brisklm-grammar"} if overlap else {"brisklm-engine"}), fillers
        for out in outs[:3]:
            if out.finish_reason == "stop":
                validator(schema).validate(json.loads(out.text))
    assert tokens[True] == tokens[False]
