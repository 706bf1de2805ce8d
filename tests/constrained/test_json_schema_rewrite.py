"""Schema rewrites that keep llguidance exact: ECMA regexes, formats, counts, unknown keywords."""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import pytest

from brisklm.constrained import ConstraintError, GrammarCompiler, JsonSchema, ecma_regex_to_rust
from brisklm.constrained.json_schema import _FORMAT_REWRITES, prepare_json_schema


def accepts(compiler: GrammarCompiler, schema: Any, instance: Any) -> bool:
    matcher = compiler.compile(JsonSchema(schema)).matcher()
    text = json.dumps(instance, ensure_ascii=False)
    ids = compiler.llg_tokenizer.tokenize_str(text)
    return matcher.accept_tokens(ids) == len(ids) and matcher.accept_token(
        compiler.eos_token_ids[0]
    )


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        ("^.$", ["a", "é", "\t"], ["\n", "\r", "\u2028", "\u2029", "ab"]),
        ("^\\s$", [" ", "\t", "\ufeff", "\u00a0", "\u3000"], ["\x85", "a", "\u200b"]),
        ("^\\S$", ["a", "\x85"], ["\ufeff", " ", "\n"]),
        ("^\\d+$", ["0123"], ["\u0663", "1a"]),  # ASCII digits only
        ("^\\w+$", ["a_Z9"], ["é", "-"]),
        ("^[\\D]$", ["a"], ["5"]),
        ("^[^]$", ["x", "\n"], ["xy"]),
        ("^a[]?$", ["a"], ["ab"]),
        ("^[a&&b]$", ["&", "a"], ["c"]),  # && is literal in ECMA classes, intersection in Rust
        ("^[[]$", ["["], ["]"]),
        ("^a\\/b$", ["a/b"], ["ab"]),
        ("^\\u00e9$", ["é"], ["e"]),
        ("b", ["abc", "b"], ["ac"]),  # unanchored: search semantics
        ("^a\\0$", ["a\x00"], ["a0", "a"]),  # ECMA's NUL escape (Rust: a backreference)
        ("^[\\0-\\x1f]$", ["\x00", "\x1f"], [" "]),
        # A range may end at "-" (Rust reads "--" in a class as set difference) and start at it.
        ("^[^!--]$", [".", "a"], ["!", "#", "-"]),
        ("^[--/]$", ["-", ".", "/"], ["a", ","]),
        ("^[^a-c--b]$", ["d"], ["a", "b", "-", "0"]),
        # Annex B: beside a class escape "-" is a literal, not a range from the escape's last
        # character (\w is ...Za-z_: "_-z" would take in "`").
        ("^[\\w-.]+$", ["a-.", "_"], ["`", "/"]),
        ("^[\\w-z]$", ["-", "z"], ["`"]),
        ("^[%-\\w]$", ["%", "-", "a"], ["&", "0-"]),
        ("^[^\\w-z]$", ["`", "!"], ["-", "z", "a"]),
        ("^[\\b]$", ["\x08"], ["b"]),  # backspace in an ECMA class
        ("^[\\x41-\\x43]$", ["B"], ["x", "4"]),
    ],
)
def test_ecma_pattern_semantics(
    bpe_compiler: GrammarCompiler, pattern: str, good: list[str], bad: list[str]
) -> None:
    schema = {"type": "string", "pattern": pattern}
    for s in good:
        assert accepts(bpe_compiler, schema, s), (pattern, s)
    for s in bad:
        assert not accepts(bpe_compiler, schema, s), (pattern, s)


def test_pattern_properties_keys_are_rewritten(bpe_compiler: GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^.$": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert accepts(bpe_compiler, schema, {"a": 1})
    assert not accepts(bpe_compiler, schema, {"\r": 1})


def accepts_text(compiler: GrammarCompiler, constraint: JsonSchema, text: str) -> bool:
    matcher = compiler.compile(constraint).matcher()
    ids = compiler.llg_tokenizer.tokenize_str(text)
    return matcher.accept_tokens(ids) == len(ids) and matcher.accept_token(
        compiler.eos_token_ids[0]
    )


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": True},
        {"patternProperties": {"^a": {"type": "integer"}}},
        {
            "properties": {"a": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
            "x-guidance": {"json_allow_general_unicode_escapes": True},
        },
    ],
)
def test_other_keys_cannot_spell_a_named_key_with_escapes(
    bpe_compiler: GrammarCompiler, schema: dict[str, Any]
) -> None:
    """llguidance wrote other keys as any string but a named key's text, \\u escapes allowed:
    "\\u0061" is the key "a" to a JSON parser, and its value escaped a's schema."""
    schema = {"type": "object", **schema}
    for strict in (True, False):
        constraint = JsonSchema(schema, strict=strict)
        assert accepts_text(bpe_compiler, constraint, '{"a": 1, "b": "x"}')
        for text in ['{"\\u0061": "x"}', '{"a": 1, "\\u0061": "x"}', '{"\\u0061b": "x"}']:
            assert not accepts_text(bpe_compiler, constraint, text), (schema, text)
    # Elsewhere strings keep their \\u escapes of control characters.
    assert accepts_text(bpe_compiler, JsonSchema({"type": "string"}), '"\\u0001"')


@pytest.mark.parametrize("escape", ["\\A", "\\z", "\\Z", "\\h", "\\G"])
def test_escapes_with_other_meanings_are_refused(escape: str) -> None:
    with pytest.raises(ConstraintError, match="cannot be enforced"):
        ecma_regex_to_rust(f"a{escape}")
    with pytest.raises(ConstraintError, match="lone backslash"):
        ecma_regex_to_rust("a\\")


def _python_date_ok(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", text))


def test_date_pattern_is_exact() -> None:
    pattern = re.compile(
        _FORMAT_REWRITES["date"]["pattern"]
    )  # the subset used is Python-compatible
    for year in range(0, 10000):  # Feb 29 / Feb 28 of every year: leap-year rules exactly
        for day in ("28", "29", "30"):
            text = f"{year:04d}-02-{day}"
            assert bool(pattern.fullmatch(text)) == _python_date_ok(text), text
    for year in (1, 1999, 2000, 2024, 9999):
        for month in range(0, 14):
            for day in range(0, 33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                assert bool(pattern.fullmatch(text)) == _python_date_ok(text), text


def test_time_pattern_takes_no_leap_second() -> None:
    # RFC 3339 allows 23:59:60 (UTC); Python's time and datetime, and so Pydantic's, refuse it.
    pattern = re.compile(_FORMAT_REWRITES["time"]["pattern"])
    for ok in ["00:00:00z", "12:34:56.789-08:00", "23:59:59.999999Z"]:
        assert pattern.fullmatch(ok), ok
    for bad in [
        "23:59:60Z",
        "23:59:60.5+00:00",
        "23:58:60Z",
        "22:59:60Z",
        "23:59:60+01:00",
        "24:00:00Z",
        "12:00:00",
        "12:00:61Z",
        "01:02:03+24:00",
        "1:02:03Z",
    ]:
        assert not pattern.fullmatch(bad), bad


def test_hostname_pattern() -> None:
    pattern = re.compile(_FORMAT_REWRITES["hostname"]["pattern"])
    for ok in ["a", "ab", "a-b", "a--b.com", "x" * 63 + ".com", "www.example.com", "1host"]:
        assert pattern.fullmatch(ok), ok
    for bad in ["", "-a", "a-", "x" * 64, "a..b", "example.", "xn--abc", "ab--c.com", "a_b"]:
        assert not pattern.fullmatch(bad), bad
    assert _FORMAT_REWRITES["hostname"]["maxLength"] == 253


def test_formats_through_the_matcher(bpe_compiler: GrammarCompiler) -> None:
    date = {"type": "string", "format": "date"}
    assert accepts(bpe_compiler, date, "2024-02-29")
    assert not accepts(bpe_compiler, date, "2023-02-29")
    assert accepts(bpe_compiler, {"format": "date"}, 5)  # format only constrains strings
    host = {"type": "string", "format": "hostname", "pattern": "^a"}
    assert accepts(bpe_compiler, host, "abc.example")
    assert not accepts(bpe_compiler, host, "bc.example")  # both the pattern and the format hold
    assert accepts(bpe_compiler, host, "a" + ".bcd" * 63)  # 253 characters
    assert not accepts(bpe_compiler, host, "ab" + ".bcd" * 63)  # 254


def test_integral_float_counts_and_true_schema(bpe_compiler: GrammarCompiler) -> None:
    schema = {"type": "array", "maxItems": 2.0}
    assert accepts(bpe_compiler, schema, [1, 2])
    assert not accepts(bpe_compiler, schema, [1, 2, 3])
    assert prepare_json_schema(True) == {}
    assert accepts(bpe_compiler, True, {"any": ["thing", 1]})


def test_refs_into_unknown_keywords_are_rewritten(bpe_compiler: GrammarCompiler) -> None:
    schema = {"x-lib": {"one": {"type": "string", "pattern": "^.$"}}, "$ref": "#/x-lib/one"}
    assert accepts(bpe_compiler, schema, "a")
    assert not accepts(bpe_compiler, schema, "\r")


def test_data_keywords_are_not_rewritten() -> None:
    schema = {"const": {"pattern": "."}, "enum": [{"format": "date"}], "default": {"items": [1]}}
    assert prepare_json_schema(schema) == schema


def test_min_properties_duplicates(bpe_compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "required": ["a", "b"], "minProperties": 2}
    assert accepts(bpe_compiler, schema, {"a": 1, "b": 2})
    assert not accepts(bpe_compiler, schema, {"a": 1})
    closed = {
        "type": "object",
        "properties": {"a": {}, "b": {}},
        "required": ["a", "b"],
        "additionalProperties": False,
        "minProperties": 2,
    }
    assert accepts(bpe_compiler, closed, {"a": 1, "b": 2})
    with pytest.raises(ConstraintError, match="minProperties \\(3\\) at #/properties/o"):
        prepare_json_schema({"properties": {"o": {"type": "object", "minProperties": 3}}})


def test_strict_closes_declared_objects_but_not_all_of_members() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "allOf": [{"properties": {"b": {"type": "integer"}}}],
        "$defs": {
            "open": {
                "type": "object",
                "properties": {"y": {}},
                "additionalProperties": {"type": "string"},
            }
        },
    }
    strict = prepare_json_schema(schema, strict=True)
    assert strict["additionalProperties"] is False
    assert strict["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in strict["allOf"][0]
    assert strict["$defs"]["open"]["additionalProperties"] == {"type": "string"}
    assert "additionalProperties" not in prepare_json_schema(schema)
    # allOf members that declare no keys leave nothing to close to
    strings = {"allOf": [{"type": "string"}, {"minLength": 2}]}
    assert prepare_json_schema(strings, strict=True) == strings


def test_strict_schema_rejects_undeclared_keys_open_schema_accepts_them(bpe_compiler) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    text = b'{"a": 1, "zz": 2}'
    for strict, accepted in ((True, False), (False, True)):
        matcher = bpe_compiler.compile(JsonSchema(schema, strict=strict)).matcher()
        ids = bpe_compiler.llg_tokenizer.tokenize_bytes(text)
        assert (matcher.accept_tokens(ids) == len(ids)) is accepted


INT = {"type": "integer"}


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        (  # `required` names a key `properties` does not declare: closing must allow it
            {"type": "object", "properties": {"a": INT}, "required": ["a", "b"]},
            [{"a": 1, "b": [True]}],
            [{"a": 1}, {"a": 1, "b": 2, "zz": 3}],
        ),
        (  # properties beside anyOf branches that declare more keys
            {
                "type": "object",
                "properties": {"a": INT},
                "required": ["a"],
                "anyOf": [
                    {"properties": {"b": INT}, "required": ["b"]},
                    {"properties": {"c": INT}, "required": ["c"]},
                ],
            },
            [{"a": 1, "b": 2}, {"a": 1, "c": 3}],
            [{"a": 1}, {"b": 2}, {"a": 1, "b": 2, "zz": 0}],
        ),
        (  # properties beside a $ref whose target is closed where it stands alone
            {
                "$defs": {"B": {"type": "object", "properties": {"b": INT}, "required": ["b"]}},
                "type": "object",
                "properties": {"a": INT, "solo": {"$ref": "#/$defs/B"}},
                "required": ["a"],
                "$ref": "#/$defs/B",
            },
            [{"a": 1, "b": 2}, {"a": 1, "solo": {"b": 3}, "b": 2}],
            [{"a": 1}, {"a": 1, "b": 2, "zz": 0}],
        ),
        (  # allOf members that each declare keys
            {
                "type": "object",
                "properties": {"a": INT},
                "allOf": [{"properties": {"b": INT}, "required": ["b"]}, {"required": ["c"]}],
            },
            [{"a": 1, "b": 2, "c": None}, {"b": 2, "c": 3}],
            [{"a": 1, "b": 2}, {"b": 2, "c": 3, "zz": 0}],
        ),
        (  # an object made of allOf members alone (they stay open: closed at the top)
            {
                "allOf": [
                    {"type": "object", "properties": {"a": INT}, "required": ["a"]},
                    {"type": "object", "properties": {"b": INT}, "required": ["b"]},
                ]
            },
            [{"a": 1, "b": 2}],
            [{"a": 1}, {"a": 1, "b": 2, "zz": 0}, {"a": 1, "b": 2, "": 0}],
        ),
        (  # ... but not where a member lets other keys in: closing would refuse them
            {
                "allOf": [
                    {"properties": {"a": INT}},
                    {"type": "object", "additionalProperties": True},
                ]
            },
            [{"a": 1, "extra": 2}],
            [{"a": "x"}],
        ),
        (
            {"allOf": [{"properties": {"a": INT}}, {"patternProperties": {"^x-": INT}}]},
            [{"a": 1, "x-y": 2}],
            [{"a": 1, "x-y": "s"}],
        ),
        (  # (properties beside such a member were closed before too; "a" is the member's other
            # key too, so it would have to be a string and an integer: it cannot be there)
            {
                "type": "object",
                "properties": {"a": INT},
                "allOf": [{"additionalProperties": {"type": "string"}}],
            },
            [{"b": "s"}, {"b": "s", "c": "t"}],
            [{"b": 2}, {"a": 1}],
        ),
    ],
)
def test_strict_closes_a_combined_object_to_the_keys_its_parts_declare(
    bpe_compiler: GrammarCompiler, schema: Any, good: list[Any], bad: list[Any]
) -> None:
    for instance in good:
        assert accepts(bpe_compiler, schema, instance), instance
    for instance in bad:
        assert not accepts(bpe_compiler, schema, instance), instance


def test_strict_does_not_close_one_of_branches(bpe_compiler: GrammarCompiler) -> None:
    # {"a": 3} matches both open branches, so the schema rejects it; closing the second branch
    # would make the branches disjoint and {"a": 3} an output.
    schema = {
        "oneOf": [
            {"type": "object", "properties": {"a": INT}, "required": ["a"]},
            {"$ref": "#/$defs/B"},
        ],
        "$defs": {"B": {"type": "object", "properties": {"b": INT}}},
    }
    assert "additionalProperties" not in prepare_json_schema(schema, strict=True)["$defs"]["B"]
    with pytest.raises(ConstraintError, match="oneOf"):
        bpe_compiler.compile(JsonSchema(schema))


def test_a_discriminated_union_is_enforced_and_closed(bpe_compiler: GrammarCompiler) -> None:
    from typing import Literal

    from pydantic import BaseModel, Field

    class Cat(BaseModel):
        pet: Literal["cat"]
        meows: int

    class Dog(BaseModel):
        pet: Literal["dog"]
        barks: int

    class Owner(BaseModel):
        name: str
        animal: Cat | Dog = Field(discriminator="pet")

    schema = Owner.model_json_schema()
    assert "oneOf" in schema["properties"]["animal"]
    prepared = prepare_json_schema(schema, strict=True)
    assert "anyOf" in prepared["properties"]["animal"]
    assert prepared["$defs"]["Cat"]["additionalProperties"] is False
    assert accepts(bpe_compiler, schema, {"name": "x", "animal": {"pet": "cat", "meows": 2}})
    assert not accepts(
        bpe_compiler, schema, {"name": "x", "animal": {"pet": "cat", "meows": 2, "barks": 1}}
    )
    assert not accepts(bpe_compiler, schema, {"name": "x", "animal": {"pet": "dog", "meows": 2}})
    # Constants that JSON equates (1 and 1.0) do not tell branches apart: stays oneOf.
    same = {
        "oneOf": [
            {"properties": {"k": {"const": 1}, "a": INT}, "required": ["k"]},
            {"properties": {"k": {"const": 1.0}}, "required": ["k"]},
        ]
    }
    assert "oneOf" in prepare_json_schema(same)


@pytest.mark.parametrize("keyword", ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"])
def test_integer_bounds_a_float_would_round_are_refused(keyword: str) -> None:
    with pytest.raises(ConstraintError, match=f"{2**60 + 1} at #/{keyword}.*64-bit float"):
        prepare_json_schema({"type": "integer", keyword: 2**60 + 1})
    with pytest.raises(ConstraintError, match="64-bit floats, which cannot hold it"):
        prepare_json_schema({"type": "integer", keyword: -(10**400)})
    if keyword.startswith("exclusive"):  # moved by one in a float: 2**60 + 1 is 2**60
        with pytest.raises(ConstraintError, match=f"{keyword}={2**60} at #/{keyword}"):
            prepare_json_schema({"type": "integer", keyword: 2**60})
        assert prepare_json_schema({"type": "integer", keyword: 2**53 - 1}) == {
            "type": "integer",
            keyword: 2**53 - 1,
        }
    else:
        assert prepare_json_schema({"type": "integer", keyword: 2**60}) == {
            "type": "integer",
            keyword: 2**60,
        }


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"item_separator": ";"}, "item_separator ';' would not be JSON"),
        ({"key_separator": " = "}, "key_separator ' = ' would not be JSON"),
        ({"key_separator": ":\u00a0"}, "key_separator"),  # no-break space is not JSON whitespace
        ({"whitespace_pattern": "\\s*"}, "may match more than JSON whitespace"),
        ({"whitespace_pattern": "[^x]*"}, "may match more than JSON whitespace"),
        ({"whitespace_pattern": " 1*"}, "may match more than JSON whitespace"),
        ({"whitespace_pattern": "(?i) "}, "may match more than JSON whitespace"),
        ({"whitespace_flexibel": True}, "unknown x-guidance option 'whitespace_flexibel'; known:"),
        ({"whitespace_flexible": "yes"}, "whitespace_flexible must be a bool"),
        ({"json_allowed_escapes": "nq"}, "escapes JSON does not have"),
        ([1], "x-guidance must be an object"),
    ],
)
def test_guidance_options_that_would_not_write_json_are_refused(options: Any, match: str) -> None:
    with pytest.raises(ConstraintError, match=re.escape(match) if "(" in match else match):
        prepare_json_schema({"type": "array", "x-guidance": options})


@pytest.mark.parametrize(
    "options",
    [
        {"item_separator": " ,\n", "key_separator": ":\t"},
        {"whitespace_flexible": True, "whitespace_pattern": "(?:[ \\t]|\\n){0,3}"},
        {"json_allowed_escapes": 'n"\\'},
    ],
)
def test_guidance_options_that_keep_json_are_used(
    bpe_compiler: GrammarCompiler, options: dict[str, Any]
) -> None:
    schema = {"type": "object", "x-guidance": options}
    prepare_json_schema(schema)
    bpe_compiler.compile(JsonSchema(schema))


def test_exclusive_bounds_past_2_to_the_53_are_refused(bpe_compiler: GrammarCompiler) -> None:
    """llguidance moves an exclusive bound by one in a float: past 2**53 it allowed the bound."""
    for schema in (
        {"type": "integer", "exclusiveMinimum": 2**53},
        {"type": "integer", "exclusiveMaximum": -(2**53)},
        {"type": "number", "exclusiveMaximum": 2.0**60},
    ):
        with pytest.raises(ConstraintError, match="exclusive bound by one .* use minimum/maximum"):
            prepare_json_schema(schema)
    below = {"type": "integer", "exclusiveMinimum": 2**53 - 2}
    assert accepts(bpe_compiler, below, 2**53 - 1)
    assert not accepts(bpe_compiler, below, 2**53 - 2)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
        {"type": "number", "exclusiveMinimum": 3, "exclusiveMaximum": 3.5},
        {"type": "number", "minimum": 1, "exclusiveMinimum": 1, "maximum": 1.75},
        {"type": ["number", "null"], "exclusiveMinimum": 1, "maximum": 1.5},
        {"exclusiveMinimum": 2, "maximum": 2.25},
        {"type": "number", "minimum": -1.5, "exclusiveMaximum": -1},
        {"type": "number", "exclusiveMinimum": -0.5, "exclusiveMaximum": 0},
        # bounds of allOf members, a $ref target or an anyOf/oneOf branch make one range there
        {"allOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1.5}, {"maximum": 0.5}]},
        {"type": "number", "exclusiveMinimum": 0, "anyOf": [{"maximum": 2}, {"maximum": 0.5}]},
        {"type": "number", "exclusiveMinimum": 0, "oneOf": [{"maximum": 0.5}, {"type": "null"}]},
        {"$defs": {"small": {"maximum": 0.5}}, "$ref": "#/$defs/small", "exclusiveMinimum": 0},
        # ... through those parts' own unions too (an Optional[float] = Field(gt=0) in $defs)
        {
            "$defs": {
                "opt": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}]}
            },
            "$ref": "#/$defs/opt",
            "maximum": 0.5,
        },
        {"allOf": [{"anyOf": [{"exclusiveMinimum": 0}, {"type": "null"}]}], "maximum": 0.5},
        {"anyOf": [{"anyOf": [{"exclusiveMinimum": 0}, {"type": "null"}]}], "maximum": 0.5},
        # ... however many unions sit beside (cut at 64 combinations, one past six let 0 through)
        {
            "type": "number",
            "exclusiveMinimum": 0,
            "allOf": [
                {"anyOf": [{"maximum": 5}, {"maximum": 0.5}]},
                *[{"anyOf": [{"minimum": -10}, {"minimum": -20 - k}]} for k in range(12)],
            ],
        },
    ],
)
def test_ranges_llguidance_would_let_their_exclusive_bound_through_are_refused(
    schema: dict[str, Any],
) -> None:
    """With no integer in the range and on the bound's side away from zero, llguidance's number
    range accepted the integral exclusive bound itself (`1` for (1, 1.5], `-0` for [-0.5, 0))."""
    with pytest.raises(ConstraintError, match="lets its exclusive.* itself through"):
        prepare_json_schema(schema)
    defs = schema.pop("$defs", None)  # stays at the root, where "#/$defs/..." points
    with pytest.raises(ConstraintError, match="at #/properties/x"):
        prepare_json_schema({"type": "object", "properties": {"x": schema}, "$defs": defs or {}})


def test_exclusive_ranges_llguidance_enforces_are_kept(bpe_compiler: GrammarCompiler) -> None:
    for schema, good, bad in [
        # no branch is a number: the bounds beside bind nothing llguidance gets wrong
        (
            {
                "anyOf": [{"type": "integer"}, {"type": "null"}],
                "exclusiveMinimum": 0,
                "maximum": 0.5,
            },
            [None],
            [0],
        ),
        # listed values are enforced exactly whatever the range
        ({"exclusiveMinimum": 0, "maximum": 0.5, "enum": [0.25, 0.5]}, [0.25, 0.5], [0, 0.3]),
        ({"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 1}, [0.75], [1, 0.5]),
        ({"type": "number", "exclusiveMinimum": -1, "maximum": -0.5}, [-0.75], [-1]),
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, [0.5], [0, 1]),
        ({"type": "number", "exclusiveMinimum": 1, "maximum": 2.5}, [1.5, 2], [1]),
        ({"type": "integer", "exclusiveMinimum": 1, "maximum": 3}, [2, 3], [1]),
    ]:
        assert all(accepts(bpe_compiler, schema, value) for value in good), schema
        assert not any(accepts(bpe_compiler, schema, value) for value in bad), schema


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"const": 29.544827403386506}, "#/const"),
        ({"enum": ["x", -1.3989665676299339]}, "#/enum/1"),
        ({"const": {"a": [1, 14.187967625272819]}}, "#/const/a/1"),
        ({"type": "number", "minimum": 29.544827403386506}, "#/minimum"),
        ({"type": "number", "multipleOf": 0.014187967625272819}, "#/multipleOf"),
        # integers a float does not hold (const and enum numbers are written from floats)
        ({"const": 12345678901234567}, "#/const"),
        ({"enum": [1, 2**53 + 1]}, "#/enum/1"),
    ],
)
def test_floats_llguidance_would_read_as_other_floats_are_refused(
    schema: dict[str, Any], where: str
) -> None:
    """`const: 29.544827403386506` was generated as 29.544827403386503 (finish "stop", invalid)."""
    with pytest.raises(ConstraintError, match=f"at {where} cannot be enforced exactly: llguidance"):
        prepare_json_schema(schema)


def test_the_float_reading_is_llguidances(bpe_compiler: GrammarCompiler) -> None:
    """read_as_llguidance against llguidance itself: the text a const schema of each value forces
    (given to llguidance directly, past our refusal) is that value exactly when the reading says
    llguidance reads that value."""
    import random

    from llguidance import LLMatcher

    from brisklm.constrained.json_numbers import read_as_llguidance
    from brisklm.constrained.json_schema import JSON_OPTIONS, SOUND_JSON_OPTIONS

    rng = random.Random(0)
    values = [rng.uniform(-100, 100) for _ in range(40)]
    values += [rng.uniform(-1, 1) * 10 ** rng.randint(-40, 40) for _ in range(40)]
    values += [0.1 + 0.2, 1e23, 2.5e-30, 1.7976931348623157e308, 29.5448274033865, 0.5]
    outcomes = set()
    for value in values:
        grammar = LLMatcher.grammar_from_json_schema(
            {"const": value}, defaults=JSON_OPTIONS, overrides=SOUND_JSON_OPTIONS
        )
        matcher = LLMatcher(bpe_compiler.llg_tokenizer, grammar, log_level=0)
        forced = matcher.compute_ff_bytes().decode()  # written without an exponent
        exact = read_as_llguidance(value) == value
        assert (float(forced) == value) == exact, (value, forced, read_as_llguidance(value))
        outcomes.add(exact)
    assert outcomes == {True, False}


def test_keywords_that_assert_nothing_are_dropped(bpe_compiler: GrammarCompiler) -> None:
    schema = {"type": "array", "uniqueItems": False, "minContains": 2, "maxContains": 3}
    assert prepare_json_schema(schema) == {"type": "array"}
    assert accepts(bpe_compiler, schema, [1, 1])
    with pytest.raises(ConstraintError, match="uniqueItems"):  # still unenforceable when true
        bpe_compiler.compile(JsonSchema({"type": "array", "uniqueItems": True}))


def test_integers_a_float_holds_are_kept_as_constants(bpe_compiler: GrammarCompiler) -> None:
    for value in (2**53, 2**60, 10**17, -(2**62)):
        assert accepts(bpe_compiler, {"const": value}, value)


@pytest.mark.parametrize(
    "schema, where",
    [
        ({"type": "integer", "minimum": 1e19, "maximum": 2e19}, "#/minimum"),  # was 2**63 - 1
        ({"type": "integer", "minimum": -2e19, "maximum": -1e19}, "#/minimum"),  # crashed
        ({"type": ["integer", "null"], "maximum": -1e19}, "#/maximum"),
        ({"type": "integer", "const": 1e19}, "#/const"),  # was 2**63 - 1
        ({"type": "integer", "enum": [1, 10**19]}, "#/enum"),
        ({"type": "integer", "minimum": -(2**63)}, "#/minimum"),
        ({"properties": {"n": {"type": "integer", "const": -1e19}}}, "#/properties/n/const"),
        # Untyped nodes take a parent's or an allOf sibling's type (these crashed or clamped).
        ({"type": "integer", "allOf": [{"minimum": -2e19}]}, "#/allOf/0/minimum"),
        ({"allOf": [{"type": "integer"}, {"maximum": -1e19}]}, "#/allOf/1/maximum"),
        ({"type": "integer", "anyOf": [{"const": 1e19}]}, "#/anyOf/0/const"),
        (
            {"allOf": [{"type": "integer"}, {"type": "number", "minimum": 1e19}]},
            "#/allOf/1/minimum",
        ),
        (
            {"$defs": {"b": {"minimum": -2e19}}, "type": "integer", "$ref": "#/$defs/b"},
            "#/$defs/b/minimum",
        ),
    ],
)
def test_integer_schema_numbers_past_64_bits_are_refused(schema, where) -> None:
    """llguidance holds an integer schema's bounds and values as 64-bit integers: one beyond was
    clamped (an output below the minimum, or another constant) or crashed the process (a
    negative bound: a segmentation fault while the grammar was built)."""
    with pytest.raises(ConstraintError, match=f"at {re.escape(where)} is outside the 64-bit"):
        prepare_json_schema(schema)


def test_integer_schema_numbers_within_64_bits_are_kept(bpe_compiler: GrammarCompiler) -> None:
    big = {"type": "integer", "minimum": 2**62, "maximum": 2**62 + 2**12}
    assert accepts(bpe_compiler, big, 2**62 + 2**11)
    assert not accepts(bpe_compiler, big, 2**62 - 1)
    # A number schema's bounds are floats to llguidance: no 64-bit integer limit applies.
    assert prepare_json_schema({"type": "number", "const": 1e19}) == {
        "type": "number",
        "const": 1e19,
    }


def test_formats_of_schemas_that_cannot_be_strings(bpe_compiler: GrammarCompiler) -> None:
    """llguidance checks formats of strings only: on an integer or a number a format was ignored
    (int32 let 99999999999 through). OpenAPI's int32 is enforced on integers as its bounds; any
    other is refused."""
    int32 = {"type": "integer", "format": "int32"}
    assert accepts(bpe_compiler, int32, 2**31 - 1)
    assert accepts(bpe_compiler, int32, -(2**31))
    assert not accepts(bpe_compiler, int32, 99999999999)
    assert not accepts(bpe_compiler, {**int32, "maximum": 5}, 6)  # with its own bounds too
    int64 = {"type": "integer", "format": "int64"}  # within 1,024 of its ends: exact floats
    assert accepts(bpe_compiler, int64, 2**63 - 1024)
    assert not accepts(bpe_compiler, int64, 2**63 - 1023)
    assert not accepts(bpe_compiler, int64, 10**20)
    for schema in (
        {"type": "number", "format": "double"},
        {"type": "boolean", "format": "date"},
        {"type": ["integer", "null"], "format": "uuid"},
    ):
        with pytest.raises(ConstraintError, match=f"format {schema['format']!r} at # cannot be"):
            prepare_json_schema(schema)
    # Where it may be a string, llguidance enforces (or refuses) it as before.
    assert accepts(bpe_compiler, {"type": ["string", "integer"], "format": "date"}, 5)
    assert not accepts(bpe_compiler, {"type": ["string", "integer"], "format": "date"}, "x")


def _pydantic_accepts(kind: Any) -> Any:
    """A check of a text by Pydantic's validator for ``kind`` (EmailStr, timedelta)."""
    pydantic = pytest.importorskip("pydantic")
    adapter = pydantic.TypeAdapter(kind)

    def accepts(text: str) -> bool:
        try:
            adapter.validate_python(text)
        except pydantic.ValidationError:
            return False
        return True

    return accepts


def _random_decodes(
    compiler: GrammarCompiler, tokenizer: Any, generate: Any, schema: JsonSchema, **options: Any
) -> list[Any]:
    """The strings random logits wrote under ``schema`` (one a seed, those that finished)."""
    compiled = compiler.compile(schema)
    outputs = [
        generate(compiled, tokenizer.token_bytes(), seed=seed, temperature=1.0, **options)
        for seed in range(60)
    ]
    return [json.loads(out.text.decode()) for out in outputs if out.finished]


def test_email_is_what_pydantic_accepts_too(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Any
) -> None:
    """llguidance's email format took bob@example, a@1.2.3.4 and x@host.local, which Pydantic's
    EmailStr (email-validator) refuses; the pattern in its place never writes one of those."""
    pydantic = pytest.importorskip("pydantic")
    pytest.importorskip("email_validator")
    import random

    pydantic_accepts = _pydantic_accepts(pydantic.EmailStr)
    email = JsonSchema({"type": "string", "format": "email"})
    for text in ["bob@example", "a@1.2.3.4", "x@host.local", "a@x.TEST", "a@x.c1", "a@[1.2.3.4]"]:
        assert not pydantic_accepts(text) and not accepts_text(bpe_compiler, email, f'"{text}"')
    for text in ["maria@example.com", "A.B+c@mail.x-y.co", "a@x.tests", "a@x.1c", "t~e@z.io"]:
        assert pydantic_accepts(text) and accepts_text(bpe_compiler, email, f'"{text}"'), text
    # Random addresses: whatever the pattern takes, Pydantic takes (the pattern is Rust syntax
    # that Python's re reads alike: classes and bounded repeats).
    pattern = re.compile(_FORMAT_REWRITES["email"]["pattern"])
    rng = random.Random(0)
    alphabet = "abcxyzABC0129-"
    taken = 0
    for _ in range(3000):
        labels = [
            "".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 3))
        ]
        if rng.random() < 0.3:
            labels[-1] = rng.choice(["test", "local", "localhost", "onion", "arpa", "invalid"])
            labels[-1] += rng.choice(["", "", "s", "1"])
        local = "".join(rng.choices("ab.+_~!{}`'-9", k=rng.randint(1, 6)))
        text = f"{local}@{'.'.join(labels)}"
        if pattern.fullmatch(text):
            taken += 1
            assert pydantic_accepts(text), text
    assert taken > 500
    # Random logits decoded under the schema: every address written passes EmailStr.
    written = _random_decodes(
        bpe_compiler, bpe_tokenizer, generate, email, max_tokens=300, eos_bias=4.0
    )
    assert len(written) >= 20 and all(map(pydantic_accepts, written)), written


def test_duration_is_rfc_3339s_within_what_pydantic_reads(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Any
) -> None:
    """llguidance's duration format took numbers of any length, which Pydantic's timedelta
    refuses past a few digits ("PT99999999999S": too large)."""
    pydantic_accepts = _pydantic_accepts(datetime.timedelta)
    duration = JsonSchema({"type": "string", "format": "duration"})
    good = ["P4DT12H30M5S", "P4Y", "PT0S", "P0D", "P1M", "PT1M", "PT36H", "P2W", "P1Y2M3D",
            "PT99999H999999M99999999S", "P9999Y99999M9999999DT99999H999999M99999999S"]  # fmt: skip
    for text in good:
        assert pydantic_accepts(text) and accepts_text(bpe_compiler, duration, f'"{text}"'), text
    # RFC 3339's order and shape (P1W2D: a week stands alone; PT1H1S skips the minutes), and
    # numbers too large for timedelta.
    for text in ["P", "PT", "P1YT", "P2D1Y", "PT1D", "P1W2D", "PT1H1S", "P1.5D", "PT99999999999S"]:
        assert not accepts_text(bpe_compiler, duration, f'"{text}"'), text
    written = _random_decodes(
        bpe_compiler, bpe_tokenizer, generate, duration, max_tokens=60, eos_bias=3.0
    )
    assert len(written) >= 20 and all(map(pydantic_accepts, written)), written
