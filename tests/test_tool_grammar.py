"""tool_call_grammar: the tool-call part of a reply decoded under the tools' schemas (matcher level)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Literal

import pytest

from brisklm.constrained import JSON_OPTIONS, Grammar, GrammarCompiler
from brisklm.constrained.any_order import MAX_ANY_ORDER_PROPERTIES, any_order_object_rules
from brisklm.tokenizer import Tokenizer
from brisklm.tool_calls import parse_tool_calls, tool_call_grammar
from tests.tiny import train_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
MAGIC = {
    "type": "function",
    "function": {
        "name": "magic_function",
        "parameters": {
            "type": "object",
            "properties": {
                "input": {"type": "integer", "exclusiveMinimum": -1000, "exclusiveMaximum": 1000}
            },
            "required": ["input"],
        },
    },
}
TOOLS = [WEATHER, MAGIC]


def call(name: str, arguments: dict) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


CALL_WEATHER = call("get_weather", {"city": "Zürich", "unit": "C"})
CALL_MAGIC = call("magic_function", {"input": 3})


class Checker:
    """Feeds text to a fresh matcher of a grammar and says how far it got."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.compiler = GrammarCompiler(tokenizer)

    def __call__(self, grammar: str, text: str) -> str:
        """ "complete", "prefix" (allowed so far, unfinished) or "rejected"."""
        matcher = self.compiler.compile(Grammar(grammar)).matcher()
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        if matcher.accept_tokens(tokens) != len(tokens):
            return "rejected"
        return "complete" if matcher.is_accepting() else "prefix"


@pytest.fixture(scope="module", params=["tags-as-text", "tags-as-added-tokens"])
def check(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Checker:
    """A byte-level BPE tokenizer where `<tool_call>` is several tokens, or one added token."""
    from tokenizers import AddedToken

    directory = tmp_path_factory.mktemp("tok")
    backend = train_tokenizer()
    if request.param == "tags-as-added-tokens":
        backend.add_tokens([AddedToken(t, special=False) for t in ("<tool_call>", "</tool_call>")])
    backend.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return Checker(Tokenizer.from_pretrained(Path(directory)))


def test_auto_allows_free_text_or_valid_calls(check: Checker) -> None:
    grammar = tool_call_grammar(TOOLS, "auto")
    assert check(grammar, "Hello! It is sunny.\nBye <tool_ca") == "complete"
    assert check(grammar, CALL_WEATHER) == "complete"
    assert check(grammar, "Let me check.\n" + CALL_WEATHER + "\n" + CALL_MAGIC) == "complete"
    # Once the text says <tool_call>, it is a call: a known name and valid arguments.
    assert check(grammar, "I will <tool_call>") == "prefix"
    assert check(grammar, "I will <tool_call>nonsense") == "rejected"
    assert check(grammar, call("unknown_tool", {})) == "rejected"
    assert check(grammar, call("magic_function", {"input": 3000})) == "rejected"
    assert check(grammar, call("magic_function", {"input": "3"})) == "rejected"
    assert check(grammar, call("magic_function", {"input": 3, "extra": 1})) == "rejected"
    assert check(grammar, call("get_weather", {"unit": "C"})) == "rejected"  # city is required
    # After the calls: more calls or the end, no more text.
    assert check(grammar, CALL_MAGIC + " and some text") == "rejected"


def test_calls_use_json_dumps_separators(check: Checker) -> None:
    compact = '<tool_call>\n{"name": "magic_function", "arguments": {"input":3}}\n</tool_call>'
    assert check(tool_call_grammar(TOOLS, "required"), compact) == "rejected"


def test_required_allows_only_calls(check: Checker) -> None:
    grammar = tool_call_grammar(TOOLS, "required")
    assert check(grammar, CALL_MAGIC) == "complete"
    assert check(grammar, CALL_MAGIC + "\n" + CALL_WEATHER) == "complete"
    assert check(grammar, "Sure") == "rejected"
    assert check(grammar, "") == "prefix"


def test_single_call_and_single_tool(check: Checker) -> None:
    grammar = tool_call_grammar([MAGIC], "required", parallel=False)
    assert check(grammar, CALL_MAGIC) == "complete"
    assert check(grammar, CALL_MAGIC + "\n") == "rejected"
    assert check(grammar, CALL_WEATHER) == "rejected"


def test_none_never_starts_a_call(check: Checker) -> None:
    grammar = tool_call_grammar(TOOLS, "none")
    assert check(grammar, "Plain text, <tool and </tool_call> too") == "complete"
    assert check(grammar, "Plain text " + CALL_MAGIC) == "rejected"


def test_generated_calls_parse() -> None:
    text = "Checking.\n" + CALL_WEATHER + "\n" + CALL_MAGIC
    content, calls = parse_tool_calls(text)
    assert content == "Checking."
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Zürich", "unit": "C"}),
        ("magic_function", {"input": 3}),
    ]


def test_tools_as_functions_and_bare_dicts(check: Checker) -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    grammar = tool_call_grammar([add, MAGIC["function"]], "required")
    assert check(grammar, call("add", {"a": 1, "b": 2})) == "complete"
    assert check(grammar, CALL_MAGIC) == "complete"


def test_optional_parameters_of_function_tools_may_be_null(check: Checker) -> None:
    # transformers' schema says "nullable": true (OpenAPI), which JSON Schema ignores: the grammar
    # refused null, and the parameter being required, forced a string.
    def set_alarm(time: str, label: str | None, repeat: Literal["daily", "weekly"] | None):
        """Set an alarm.

        Args:
            time: HH:MM.
            label: A label, or null.
            repeat: How often, or null.
        """

    grammar = tool_call_grammar([set_alarm], "required")
    assert check(grammar, call("set_alarm", {"time": "7", "label": None, "repeat": None})) == (
        "complete"
    )
    assert check(grammar, call("set_alarm", {"time": "7", "label": "x", "repeat": "daily"})) == (
        "complete"
    )
    assert check(grammar, call("set_alarm", {"time": "7", "label": "x", "repeat": "x"})) == (
        "rejected"
    )
    assert check(grammar, call("set_alarm", {"time": None, "label": None, "repeat": None})) == (
        "rejected"
    )


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="mode"):
        tool_call_grammar(TOOLS, "any")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one tool"):
        tool_call_grammar([], "required")
    not_object = {"name": "f", "parameters": {"type": "array"}}
    with pytest.raises(ValueError, match="object schema"):
        tool_call_grammar([not_object], "auto")


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


BOOKING = tool(
    "book",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "nights": {"type": "integer", "minimum": 1},
            "pets": {"type": "boolean"},
            'größe "x"': {"type": "string"},
        },
        "required": ["city", "nights"],
    },
)


def test_arguments_in_any_order_exactly_as_the_schema_allows(check: Checker) -> None:
    """Every order of every subset of the properties: accepted iff the required ones are there."""
    grammar = tool_call_grammar([BOOKING], "required")
    values = {"city": "Zürich", "nights": 2, "pets": False, 'größe "x"': "L"}
    names = list(values)
    for size in range(len(names) + 1):
        for keys in itertools.permutations(names, size):
            text = call("book", {k: values[k] for k in keys})
            expected = "complete" if {"city", "nights"} <= set(keys) else "rejected"
            assert check(grammar, text) == expected, text
    # Each value still under its own subschema, each key at most once, no unknown keys.
    assert check(grammar, call("book", {"nights": 0, "city": "Rome"})) == "rejected"
    assert check(grammar, call("book", {"pets": 1, "nights": 1, "city": "Rome"})) == "rejected"
    twice = call("book", {"nights": 1, "city": "Rome"}).replace("}}", ', "nights": 2}}')
    assert check(grammar, twice) == "rejected"
    assert check(grammar, call("book", {"nights": 1, "city": "Rome", "x": 1})) == "rejected"
    spaced = (
        '<tool_call>\n{"name": "book", "arguments": {"nights": 1,"city": "Rome"}}\n</tool_call>'
    )
    assert check(grammar, spaced) == "rejected"


def test_other_arguments_cannot_spell_a_named_one_with_escapes(check: Checker) -> None:
    """Extra arguments (additionalProperties) are written without \\u escapes: "\\u0063ity"
    is the argument "city" to a JSON parser, and its value would escape city's schema."""
    open_tool = tool(
        "t",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
            "additionalProperties": {"type": "boolean"},
        },
    )
    grammar = tool_call_grammar([open_tool], "required")
    assert check(grammar, call("t", {"city": "Rome", "n": 1, "x": True})) == "complete"
    spelled = call("t", {"city": "Rome", "n": 1}).replace("}}", ', "\\u0063ity": true}}')
    assert check(grammar, spelled) == "rejected"
    spelled = call("t", {"ci": True}).replace('"ci"', '"\\u006e"')
    assert check(grammar, spelled) == "rejected"


def test_any_order_with_definitions(check: Checker) -> None:
    """A pydantic model's nested model stays a `$ref` into `$defs`; it still resolves."""
    pydantic = pytest.importorskip("pydantic")

    class Address(pydantic.BaseModel):
        street: str
        number: int

    class Parcel(pydantic.BaseModel):
        """Send a parcel."""

        to: Address
        weight: float

    grammar = tool_call_grammar([Parcel], "required")
    address = {"street": "Main St", "number": 4}
    assert check(grammar, call("Parcel", {"weight": 1.5, "to": address})) == "complete"
    assert check(grammar, call("Parcel", {"to": address, "weight": 1.5})) == "complete"
    bad_address = {"street": "Main St", "number": "4"}
    assert check(grammar, call("Parcel", {"weight": 1.5, "to": bad_address})) == "rejected"
    # Inside the nested object, properties keep the schema's order (llguidance's %json).
    swapped = {"number": 4, "street": "Main St"}
    assert check(grammar, call("Parcel", {"weight": 1.5, "to": swapped})) == "rejected"


def test_large_or_complex_objects_keep_the_schema_order(check: Checker) -> None:
    many = {f"p{i}": {"type": "integer"} for i in range(MAX_ANY_ORDER_PROPERTIES + 1)}
    grammar = tool_call_grammar([tool("wide", {"type": "object", "properties": many})], "required")
    in_order = {f"p{i}": i for i in range(MAX_ANY_ORDER_PROPERTIES + 1)}
    assert check(grammar, call("wide", in_order)) == "complete"
    assert check(grammar, call("wide", dict(reversed(in_order.items())))) == "rejected"


def test_any_order_rules_apply_to_closed_flat_objects_only() -> None:
    closed = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
        "x-guidance": dict(JSON_OPTIONS),
    }
    assert any_order_object_rules("r", closed) is not None
    cases = {
        "open object": {**closed, "additionalProperties": True},
        "no additionalProperties": {k: v for k, v in closed.items() if k != "additionalProperties"},
        "one property": {**closed, "properties": {"a": {}}, "required": []},
        "minProperties": {**closed, "minProperties": 2},
        "anyOf": {**closed, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
        "ref outside $defs": {**closed, "properties": {"a": {"$ref": "#/properties/b"}, "b": {}}},
        "$id": {**closed, "properties": {"a": {"$id": "x"}, "b": {}}},
        "flexible whitespace": {**closed, "x-guidance": {"whitespace_flexible": True}},
        "compact separators": {**closed, "x-guidance": {**JSON_OPTIONS, "item_separator": ","}},
        # llguidance's own separators differ from json.dumps': the options must say so explicitly.
        "no options": {k: v for k, v in closed.items() if k != "x-guidance"},
        "options without separators": {**closed, "x-guidance": {"whitespace_flexible": False}},
        "unknown required": {**closed, "required": ["c"]},
    }
    for what, schema in cases.items():
        assert any_order_object_rules("r", schema) is None, what
    # A property whose subschema is false never appears; with one property left, nothing to order.
    assert any_order_object_rules("r", {**closed, "properties": {"a": {}, "b": False}}) is None


def test_each_value_carries_only_the_definitions_it_reaches(check: Checker) -> None:
    schema = {
        "type": "object",
        "properties": {
            "to": {"$ref": "#/$defs/Address"},
            "size": {"$ref": "#/definitions/Size"},
            "note": {"type": "string"},
        },
        "required": ["to"],
        "additionalProperties": False,
        "$defs": {
            "Address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"$ref": "#/$defs/City"}},
                "required": ["street", "city"],
                "additionalProperties": False,
            },
            "City": {"enum": ["Rome", "Oslo"]},
            "Unused": {"type": "integer"},
        },
        "definitions": {"Size": {"enum": ["S", "L"]}},
        "x-guidance": dict(JSON_OPTIONS),
    }
    rules = any_order_object_rules("r", schema)
    assert rules is not None
    values = {
        line.split(":", 1)[0]: json.loads(line.split("%json ", 1)[1])
        for line in rules
        if "%json" in line
    }
    assert values["r_v0"]["$defs"].keys() == {"Address", "City"}  # City through Address
    assert "definitions" not in values["r_v0"]
    assert values["r_v1"]["definitions"].keys() == {"Size"} and "$defs" not in values["r_v1"]
    assert "$defs" not in values["r_v2"] and "definitions" not in values["r_v2"]
    grammar = tool_call_grammar([tool("ship", schema)], "required")
    to = {"street": "Via Roma", "city": "Rome"}
    assert check(grammar, call("ship", {"size": "L", "to": to})) == "complete"
    assert check(grammar, call("ship", {"note": "x", "to": {**to, "city": "Paris"}})) == "rejected"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"properties": {"tags": {"type": "array", "uniqueItems": True}}}, "uniqueItems"),
        ({"properties": {"when": {"type": "string", "format": "x-date"}}}, "format 'x-date'"),
        ({"properties": {"n": {"type": "integer", "minimum": "one"}}}, "invalid"),
    ],
)
def test_a_tool_schema_that_cannot_be_enforced_names_the_tool(
    parameters: dict, message: str
) -> None:
    """Found where the tool is given, worded as a JSON schema error: before, the grammar compiler
    reported it for the whole Lark grammar, the tool known only as arguments_<k>."""
    from brisklm.constrained.errors import ConstraintError
    from brisklm.tool_calls import check_tool_schema

    ok = {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}}
    bad = {"type": "function", "function": {"name": "tag_city", "parameters": parameters}}
    check_tool_schema(ok)
    for call in (lambda: check_tool_schema(bad), lambda: tool_call_grammar([ok, bad])):
        with pytest.raises(ConstraintError, match="the parameters of tool 'tag_city'") as info:
            call()
        assert message in str(info.value) and "Lark" not in str(info.value)


def test_enforced_schemas_are_kept_per_schema_text_in_their_key_order() -> None:
    # Kept per schema (a chat with tools asked llguidance to check each tool on every call): a
    # second call gives an equal, independent schema, with the properties in the schema's order.
    from brisklm.tool_calls import _enforced_schema, _enforced_schema_text

    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    first = _enforced_schema(schema)
    hits = _enforced_schema_text.cache_info().hits
    second = _enforced_schema(dict(schema))
    assert _enforced_schema_text.cache_info().hits == hits + 1
    assert first == second and first is not second
    assert list(second["properties"]) == ["b", "a"]
    first["properties"].clear()  # the caller's to change: the kept one is untouched
    assert list(_enforced_schema(schema)["properties"]) == ["b", "a"]
    reordered = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
    }
    assert list(_enforced_schema(reordered)["properties"]) == ["a", "b"]
    # Not plain JSON (a tuple): checked as before, not kept.
    with_tuple = {"type": "object", "properties": {"c": {"enum": ("x", "y")}}}
    assert list(_enforced_schema(with_tuple)["properties"]["c"]["enum"]) == ["x", "y"]
