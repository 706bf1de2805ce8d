"""Constraint kinds: construction, cache keys, option parsing."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from llguidance import LLMatcher
from pydantic import BaseModel

from brisklm import SamplingParams
from brisklm.constrained import (
    Choice,
    ConstraintError,
    Grammar,
    JsonObject,
    JsonSchema,
    Regex,
    constraint_from_options,
)


class Pet(BaseModel):
    name: str
    kind: Literal["cat", "dog"]


def test_json_schema_key_is_stable_and_hashable() -> None:
    a = JsonSchema({"type": "object", "properties": {"x": {"type": "integer"}}})
    b = JsonSchema({"type": "object", "properties": {"x": {"type": "integer"}}})
    assert a == b and hash(a) == hash(b) and a.key == b.key
    assert len({a, b}) == 1
    # Property order changes the grammar (llguidance emits properties in order), so it is in the key.
    c = JsonSchema({"properties": {"x": {}, "y": {}}})
    d = JsonSchema({"properties": {"y": {}, "x": {}}})
    assert c.key != d.key


def test_json_schema_copies_the_schema() -> None:
    schema = {"type": "string"}
    constraint = JsonSchema(schema)
    schema["type"] = "integer"
    assert constraint.schema == {"type": "string"}
    assert json.loads(constraint.key[-1]) == {"type": "string"}


def test_json_schema_from_pydantic() -> None:
    assert JsonSchema(Pet) == JsonSchema.from_pydantic(Pet) == JsonSchema(Pet.model_json_schema())
    assert constraint_from_options(json_schema=Pet) == JsonSchema(Pet.model_json_schema())


def test_json_schema_rejects_non_schemas() -> None:
    with pytest.raises(ConstraintError, match="json_schema must be"):
        JsonSchema("not a schema")  # type: ignore[arg-type]
    for strict in ("no", 0, None):  # "no" was strict, 0 and None open
        with pytest.raises(ConstraintError, match="strict must be True or False"):
            JsonSchema({}, strict=strict)  # type: ignore[arg-type]
    with pytest.raises(ConstraintError, match="json_schema must be a dict, a boolean or a pyd"):
        JsonSchema.from_pydantic(int)  # (an AttributeError: no model_json_schema)
    with pytest.raises(
        ConstraintError, match=r"got JsonSchema \(pass a JsonSchema as constraint=\)"
    ):
        SamplingParams(json_schema=JsonSchema({}, strict=False))
    with pytest.raises(ConstraintError, match="not JSON-serialisable"):
        JsonSchema({"const": {1, 2}})
    deep: dict = {"type": "string"}
    for _ in range(3000):  # a RecursionError from json.dumps
        deep = {"type": "array", "items": deep}
    with pytest.raises(ConstraintError, match="nested too deeply to serialise"):
        SamplingParams(json_schema=deep)
    # The tool grammars' and answer schemas' path (a RecursionError there too).
    from brisklm.constrained.json_schema import prepare_json_schema

    deep = {"type": "string"}
    for _ in range(1500):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ConstraintError, match="nested too deeply to read"):
        prepare_json_schema(deep)
    from brisklm.tool_calls import check_tool_schema

    nested: dict = {"type": "integer"}
    for _ in range(600):
        nested = {"type": "object", "properties": {"a": nested}, "required": ["a"]}
    tool = {"type": "function", "function": {"name": "f", "parameters": nested}}
    with pytest.raises(ConstraintError, match="tool 'f': the JSON schema is nested too deeply"):
        check_tool_schema(tool)
    # Deep, but within what the constraint reads: its copy in SamplingParams too (a deepcopy
    # overflowed Python's stack first).
    nested = {"type": "integer"}
    for _ in range(300):
        nested = {"type": "object", "properties": {"a": nested}, "required": ["a"]}
    assert SamplingParams(json_schema=nested).json_schema == nested


def test_keys_differ_across_kinds() -> None:
    constraints = [
        JsonSchema({"type": "object"}),
        JsonObject(),
        Regex("a+"),
        Choice(("a", "b")),
        Grammar('start: "a"'),
        Grammar('root ::= "a"', "gbnf"),
    ]
    assert len({c.key for c in constraints}) == len(constraints)
    for c in constraints:
        hash(c)  # every kind is usable as a dict key
        assert isinstance(c.to_llguidance(), str)


def test_choice_normalises_and_validates() -> None:
    assert Choice(["a", "b"]).options == ("a", "b")  # type: ignore[arg-type]
    assert Choice(["a", "b"]) == Choice(("a", "b"))  # type: ignore[arg-type]
    with pytest.raises(ConstraintError, match="at least one"):
        Choice(())
    with pytest.raises(ConstraintError, match="strings"):
        Choice(("a", 1))  # type: ignore[arg-type]
    with pytest.raises(ConstraintError, match="sequence"):
        Choice("ab")  # type: ignore[arg-type]


def test_grammar_syntax_is_validated() -> None:
    with pytest.raises(ConstraintError, match="grammar_syntax must be one of lark, gbnf"):
        Grammar("start: x", "ebnf")  # type: ignore[arg-type]


def test_constraint_from_options_single() -> None:
    assert constraint_from_options() is None
    assert constraint_from_options(json_schema={"type": "integer"}) == JsonSchema(
        {"type": "integer"}
    )
    assert constraint_from_options(json_object=True) == JsonObject()
    assert constraint_from_options(regex="[0-9]+") == Regex("[0-9]+")
    assert constraint_from_options(choice=["x", "y"]) == Choice(("x", "y"))
    assert constraint_from_options(grammar='root ::= "a"', grammar_syntax="gbnf") == Grammar(
        'root ::= "a"', "gbnf"
    )


def test_constraint_from_options_rejects_several() -> None:
    with pytest.raises(ValueError, match="json_schema, regex"):
        constraint_from_options(json_schema={}, regex="a")
    with pytest.raises(ValueError, match="json_object, choice, grammar"):
        constraint_from_options(json_object=True, choice=["a"], grammar="start: a")
    with pytest.raises(ValueError, match="grammar_syntax"):
        constraint_from_options(grammar="x", grammar_syntax="yacc")
    # The syntax of a grammar that is not there was silently ignored.
    with pytest.raises(ValueError, match="grammar_syntax='gbnf' without grammar"):
        constraint_from_options(grammar_syntax="gbnf")
    with pytest.raises(ValueError, match="grammar_syntax='gbnf' without grammar"):
        SamplingParams(grammar_syntax="gbnf")


def test_json_grammar_is_one_line_and_sound() -> None:
    grammar = json.loads(JsonSchema({"type": "array"}).to_llguidance())
    options = grammar["grammars"][0]["json_schema"]["x-guidance"]
    assert options["whitespace_flexible"] is False
    assert options["item_separator"] == ", " and options["key_separator"] == ": "
    assert options["lenient"] is False and options["coerce_one_of"] is False
    # A schema's own x-guidance may change whitespace but never switch on over-approximation.
    grammar = json.loads(
        JsonSchema({"x-guidance": {"whitespace_flexible": True, "lenient": True}}).to_llguidance()
    )
    options = grammar["grammars"][0]["json_schema"]["x-guidance"]
    assert options["whitespace_flexible"] is True and options["lenient"] is False
    assert LLMatcher.validate_grammar(JsonObject().to_llguidance()) == ""


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Regex("a\ud800"), r"regex holds a lone surrogate \(U\+D800\) at index 1"),
        (lambda: Choice(("x", "\udfff")), r"choice option 1 holds a lone surrogate \(U\+DFFF\)"),
        (lambda: Grammar('start: "\ud800"'), "grammar holds a lone surrogate"),
        (lambda: Grammar('root ::= "\ud800"', "gbnf"), "grammar holds a lone surrogate"),
        (  # (it was "Value is not JSON serializable", from inside llguidance)
            lambda: JsonSchema({"properties": {"\ud800": {}}}),
            r"json_schema's key '\\ud800' at #/properties holds a lone surrogate \(U\+D800\)",
        ),
        (
            lambda: JsonSchema({"properties": {"a": {"enum": ["x", "y\udfff"]}}}),
            r"json_schema at #/properties/a/enum/1 holds a lone surrogate \(U\+DFFF\) at index 1",
        ),
    ],
)
def test_lone_surrogates_are_named(make, message) -> None:
    # They failed inside llguidance's translation: a bare UnicodeEncodeError, or "unexpected end
    # of hex escape" at a position in Lark text the caller never wrote.
    with pytest.raises(ConstraintError, match=message):
        make()
    assert Choice(("🙂",)).options == ("🙂",)  # a real astral character is fine
