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


def test_time_pattern_leap_seconds() -> None:
    pattern = re.compile(_FORMAT_REWRITES["time"]["pattern"])
    for ok in [
        "23:59:60Z",
        "23:59:60.5+00:00",
        "23:59:60-00:00",
        "00:00:00z",
        "12:34:56.789-08:00",
    ]:
        assert pattern.fullmatch(ok), ok
    for bad in [
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
    with pytest.raises(ConstraintError, match=f"bound {2**60 + 1} at #/{keyword}.*64-bit float"):
        prepare_json_schema({"type": "integer", keyword: 2**60 + 1})
    with pytest.raises(ConstraintError, match="64-bit floats, which cannot hold it"):
        prepare_json_schema({"type": "integer", keyword: -(10**400)})
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
