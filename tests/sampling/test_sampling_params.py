"""SamplingParams validation and normalisation."""

import dataclasses
from fractions import Fraction

import pytest

from brisklm.constrained import Regex
from brisklm.sampling import MAX_LOGPROBS, SamplingParams

BAD_VALUES = [
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("max_tokens", 2.5),
    ("max_tokens", True),
    ("max_tokens", "10"),
    ("temperature", -0.1),
    ("temperature", "hot"),
    ("top_k", -1),
    ("top_k", 1.5),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", -0.5),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("presence_penalty", 2.01),
    ("presence_penalty", -3.0),
    ("frequency_penalty", 2.5),
    ("frequency_penalty", -2.01),
    ("logit_bias", {5: 100.5}),
    ("logit_bias", {5: -101.0}),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"x": 1.0}),
    ("logit_bias", {1.5: 1.0}),
    ("logit_bias", {3: "big"}),
    ("logit_bias", [(1, 1.0), (1, 2.0)]),
    ("logit_bias", 7),
    ("seed", 1.5),
    ("seed", 2**64),
    ("seed", -(2**63) - 1),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", ["ok", 3]),
    ("stop", 42),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1, 2.0]),
    ("stop_token_ids", "2"),
    ("min_tokens", -1),
    ("min_tokens", 300),  # > max_tokens=256
    ("logprobs", -1),
    ("logprobs", MAX_LOGPROBS + 1),
    ("logprobs", 2.0),
    ("prompt_logprobs", -1),
    ("prompt_logprobs", MAX_LOGPROBS + 1),
    ("prompt_logprobs", "3"),
    ("ignore_eos", 1),
    ("skip_special_tokens", "yes"),
    ("include_stop_str_in_output", None),
]
FLOAT_FIELDS = [
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_bad_value_raises_naming_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field) as info:
        SamplingParams(**{field: value})
    assert "must be" in str(info.value)  # states the allowed range


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_rejected(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_a_stop_string_with_a_lone_surrogate_is_refused() -> None:
    # No output text holds one, so it could never match: it ran to max_tokens without a word.
    with pytest.raises(ValueError, match=r"valid Unicode \('a\\udc80' has a lone surrogate at 1"):
        SamplingParams(stop=["ok", "a\udc80"])
    assert SamplingParams(stop=["🙂"]).stop == ("🙂",)


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [10**400, -(10**400), Fraction(10**400, 3)])
def test_numbers_past_floats_range_are_refused_naming_the_field(field, value) -> None:
    # float() raised a bare OverflowError
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=.* is invalid: must be"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"logit_bias": {5: 10**400}}, "logit_bias=1000"),
        # Python converts at most 4,300 digits of an int to or from text
        ({"logit_bias": {"9" * 5000: 1.0}}, "logit_bias='<a key of 5000 digits>'"),
        ({"seed": 10**5000}, "seed=<an int of 16610 bits>"),
        ({"max_tokens": 10**5000, "min_tokens": -1}, "max_tokens=<an int of 16610 bits>"),
    ],
)
def test_huge_ints_are_refused_naming_the_field(kwargs, shown) -> None:
    with pytest.raises(ValueError, match="is invalid: must be") as info:
        SamplingParams(**kwargs)
    assert shown in str(info.value)


def test_non_finite_logit_bias_rejected() -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={3: float("nan")})


def test_defaults_and_normalisation() -> None:
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (256, 1.0, 0, 1.0, 0.0)
    assert p.stop == () and p.stop_token_ids == () and p.logit_bias == ()
    assert p.logprobs is None and p.seed is None and not p.is_greedy and not p.uses_penalties

    p = SamplingParams(
        stop="###",
        stop_token_ids=7,
        logit_bias={"12": -100, 3: 1},
        temperature=1,
        max_tokens=5,
        min_tokens=5,
    )
    assert p.stop == ("###",)
    assert p.stop_token_ids == (7,)
    assert p.logit_bias == ((3, 1.0), (12, -100.0))  # sorted, JSON string keys accepted
    assert p.logit_bias_dict() == {3: 1.0, 12: -100.0}
    assert isinstance(p.temperature, float)

    p = SamplingParams(stop=["a", "b", "a"], stop_token_ids=[2, 1, 2], logit_bias=None)
    assert p.stop == ("a", "b") and p.stop_token_ids == (2, 1) and p.logit_bias == ()
    assert SamplingParams(stop=None, stop_token_ids=None).stop == ()


def test_frozen_hashable_and_replace_revalidates() -> None:
    p = SamplingParams(stop=["x"], logit_bias={1: 2.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    assert hash(p) == hash(SamplingParams(stop="x", logit_bias={1: 2.0}))
    q = dataclasses.replace(p, temperature=0.0)
    assert q.is_greedy and q.logit_bias == p.logit_bias  # normalised value round-trips
    with pytest.raises(ValueError, match="top_p"):
        dataclasses.replace(p, top_p=2.0)


@pytest.mark.parametrize(
    "option",
    [
        {"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        {"json_object": True},
        {"regex": "a+"},
        {"choice": ["yes", "no"]},
        {"grammar": 'start: "x"'},
        {"grammar": 'root ::= "x"', "grammar_syntax": "gbnf"},
    ],
)
def test_replace_copies_params_made_from_a_constraint_option(option) -> None:
    # dataclasses.replace passes the option and the constraint resolved from it: that was
    # refused as both given ("pass either constraint= or one of json_schema/...").
    params = SamplingParams(**option)
    copy = dataclasses.replace(params, max_tokens=5)
    assert copy.max_tokens == 5 and copy.constraint == params.constraint
    name = next(iter(option))
    assert getattr(copy, name) == getattr(params, name)
    with pytest.raises(ValueError, match="pass either constraint=.*with_changes"):
        dataclasses.replace(params, constraint=Regex("b"))  # another one: two constraints


def test_greedy_convenience_and_boundaries() -> None:
    g = SamplingParams.greedy(max_tokens=3, logprobs=MAX_LOGPROBS)
    assert g.is_greedy and g.max_tokens == 3 and g.logprobs == MAX_LOGPROBS
    # Range ends that are allowed.
    SamplingParams(top_p=1.0, min_p=1.0, presence_penalty=-2, frequency_penalty=2, logprobs=0)
    SamplingParams(logit_bias={0: 100, 1: -100}, seed=0, top_k=0, min_tokens=0)
    assert SamplingParams(repetition_penalty=1.2).uses_penalties


def test_validate_for_vocab() -> None:
    p = SamplingParams(logit_bias={9: 1.0}, stop_token_ids=[3])
    p.validate_for_vocab(10)
    with pytest.raises(ValueError, match="logit_bias"):
        p.validate_for_vocab(9)
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[3]).validate_for_vocab(3)
    with pytest.raises(ValueError, match="vocab_size"):
        SamplingParams().validate_for_vocab(0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"choice": "abc"}, "choice must be a list or tuple of strings, got str"),  # was a, b, c
        ({"choice": {"a", "b"}}, "choice must be a list or tuple of strings, got set"),
        (
            {"constraint": "json"},
            "SamplingParams.constraint='json' is invalid",
        ),  # was a TypeError at generate
        ({"constraint": {"type": "object"}}, "use json_schema="),
        (
            {"logit_bias": {"²": 1.0}},
            "SamplingParams.logit_bias='²' is invalid",
        ),  # isdigit() but not int()
    ],
)
def test_constraint_and_bias_shapes_are_checked_at_construction(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
    assert SamplingParams(logit_bias={"12": 1.0}).logit_bias == ((12, 1.0),)  # JSON keys


def test_with_changes_keeps_the_constraint_and_its_options() -> None:
    # An option changed to its unset value dropped the constraint (choice -> none at all), and
    # every copy lost the options it came from: with_changes() != the original.
    from brisklm.constrained import Choice, Regex

    params = SamplingParams(choice=["yes", "no"])
    assert params.with_changes() == params and params.with_changes().choice == ("yes", "no")
    for changes in ({"json_object": False}, {"regex": None}, {"temperature": 0.5}):
        assert params.with_changes(**changes).constraint == Choice(("yes", "no")), changes
    assert params.with_changes(regex="a+").constraint == Regex("a+")  # replaced
    assert params.with_changes(constraint=None).constraint is None
    gbnf = SamplingParams(grammar='root ::= "x"', grammar_syntax="gbnf")
    assert gbnf.with_changes(max_tokens=3).constraint == gbnf.constraint
    direct = SamplingParams(constraint=Regex("b"))
    assert direct.with_changes(max_tokens=3).constraint == Regex("b")
    assert gbnf.with_changes(grammar=None).constraint is None  # "grammar_syntax without grammar"
    # A copy's constraint is made from the field again: an edit of the caller's dict after the
    # params were made changed it (the chat of a tool model decoded under the edited schema).
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    made = SamplingParams(json_schema=schema)
    schema["properties"]["n"] = {"type": "string"}
    assert made.with_changes(temperature=0).constraint == made.constraint
    assert made.with_changes() == made
