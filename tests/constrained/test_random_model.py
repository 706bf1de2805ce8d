"""A random-logits "model" decoded under each constraint: every finished output is valid."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Optional

import jsonschema
import pytest
from pydantic import BaseModel, Field

from brisklm.constrained import Choice, Grammar, GrammarCompiler, JsonObject, JsonSchema, Regex

GBNF_DIR = Path(__file__).resolve().parents[1] / "data" / "gbnf"
RUNS = [(0.0, 0), (0.0, 1), (1.0, 2), (1.0, 3), (1.0, 4), (0.0, 5)]  # (temperature, seed)
MAX_TOKENS = 256

SCHEMAS: dict[str, dict[str, Any]] = {
    "types": {
        "type": "object",
        "properties": {
            "s": {"type": "string", "maxLength": 6},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "z": {"type": "null"},
            "u": {"type": ["string", "null"], "maxLength": 3},
        },
        "required": ["s", "i", "n", "b", "z", "u"],
        "additionalProperties": False,
    },
    "enum_const": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", 3, None, [1, 2]]},
            "version": {"const": {"major": 1, "tags": ["x"]}},
        },
        "required": ["color", "version"],
    },
    "nested_optional": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "owner": {
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 5}, "age": {"type": "integer"}},
                "required": ["name"],
                "additionalProperties": False,
            },
            "note": {"type": "string", "maxLength": 4},
        },
        "required": ["id", "owner"],
        "additionalProperties": False,
    },
    "array_bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 2,
        "maxItems": 4,
    },
    "prefix_items": {"type": "array", "prefixItems": [{"type": "boolean"}, {"const": "x"}], "items": False},
    "any_of": {"anyOf": [{"type": "integer", "maximum": 0}, {"type": "string", "maxLength": 3}]},
    "one_of": {"oneOf": [{"type": "integer"}, {"type": "array", "maxItems": 2, "items": {"type": "boolean"}}]},
    "all_of": {"allOf": [{"type": "integer", "minimum": 10}, {"maximum": 20}, {"multipleOf": 3}]},
    "ref_defs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer", "minimum": 0, "maximum": 9},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1},
                },
                "required": ["v"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "pattern_formats": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "day": {"type": "string", "format": "date"},
            "mail": {"type": "string", "format": "email", "maxLength": 20},
            "id": {"type": "string", "format": "uuid"},
            "at": {"type": "string", "format": "date-time"},
            "host": {"type": "string", "format": "hostname", "maxLength": 12},
        },
        "required": ["code", "day", "mail", "id", "at", "host"],
        "additionalProperties": False,
    },
    "numeric_bounds": {
        "type": "array",
        "prefixItems": [
            {"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25},
            {"type": "integer", "exclusiveMinimum": 10, "maximum": 20},
            {"type": "integer", "multipleOf": 7},
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        ],
        "minItems": 4,
        "items": False,
    },
    "map": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    "string_lengths": {"type": "string", "minLength": 2, "maxLength": 4},
}


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    city: str = Field(max_length=6)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=8)
    age: int = Field(ge=0, le=130)
    role: Literal["admin", "user"]
    favourite: Color
    address: Address
    previous: list[Address] = Field(max_length=2)
    tags: list[str] = Field(default_factory=list, max_length=2)
    nickname: Optional[str] = Field(default=None, max_length=4)  # noqa: UP045 - testing Optional
    score: float | None = None


class Team(BaseModel):
    lead: Person
    size: int = Field(ge=1, le=9)


def check_all_runs(
    compiler: GrammarCompiler,
    tokenizer: Any,
    constraint: Any,
    generate: Callable[..., Any],
    validate: Callable[[str], None],
    runs: list[tuple[float, int]] = RUNS,
    eos_bias: float = 0.0,
) -> int:
    """Generate once per run; validate every finished output; return how many finished."""
    compiled = compiler.compile(constraint)
    token_bytes = tokenizer.token_bytes()
    finished = 0
    for temperature, seed in runs:
        out = generate(
            compiled, token_bytes, seed=seed, temperature=temperature, max_tokens=MAX_TOKENS, eos_bias=eos_bias
        )
        if not out.finished:
            # Length cap: reported unfinished, never as a valid (terminated) output.
            assert not out.matcher.is_terminated() and len(out.token_ids) >= MAX_TOKENS
            continue
        finished += 1
        validate(out.text.decode("utf-8"))
    return finished


def json_validator(schema: dict[str, Any]) -> Callable[[str], None]:
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    return lambda text: validator.validate(json.loads(text))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schemas(
    name: str, bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]
) -> None:
    schema = SCHEMAS[name]
    finished = check_all_runs(bpe_compiler, bpe_tokenizer, JsonSchema(schema), generate, json_validator(schema))
    assert finished >= 1, f"{name}: no run finished within {MAX_TOKENS} tokens"


@pytest.mark.parametrize("model", [Person, Team])
def test_pydantic_models(
    model: type[BaseModel], bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]
) -> None:
    schema = model.model_json_schema()

    def validate(text: str) -> None:
        json_validator(schema)(text)
        model.model_validate_json(text)

    runs = [(t, s) for t in (0.0, 1.0) for s in range(10)]
    finished = check_all_runs(bpe_compiler, bpe_tokenizer, JsonSchema(model), generate, validate, runs)
    assert finished >= 1


@pytest.mark.parametrize("name", ["types", "nested_optional", "pattern_formats"])
def test_json_schemas_sentencepiece(
    name: str, sp_compiler: GrammarCompiler, sp_tokenizer: Any, generate: Callable[..., Any]
) -> None:
    schema = SCHEMAS[name]
    finished = check_all_runs(sp_compiler, sp_tokenizer, JsonSchema(schema), generate, json_validator(schema))
    assert finished >= 1


def test_json_mode(bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]) -> None:
    def validate(text: str) -> None:
        assert isinstance(json.loads(text), dict)

    assert check_all_runs(bpe_compiler, bpe_tokenizer, JsonObject(), generate, validate) >= 1


@pytest.mark.parametrize(
    "pattern",
    [
        r"[a-z]{3,8}@[a-z]{2,5}\.(com|org)",
        r"\d{3}-\d{4}",
        r"(yes|no)( maybe)?",
        r"[A-Z][a-z]*( [A-Z][a-z]*){0,2}",
        r"-?(0|[1-9][0-9]{0,5})(\.[0-9]{1,3})?",
    ],
)
@pytest.mark.parametrize("which", ["bpe", "sp"])
def test_regex(pattern: str, which: str, request: pytest.FixtureRequest, generate: Callable[..., Any]) -> None:
    compiler = request.getfixturevalue(f"{which}_compiler")
    tokenizer = request.getfixturevalue(f"{which}_tokenizer")

    def validate(text: str) -> None:
        assert re.fullmatch(pattern, text), text

    assert check_all_runs(compiler, tokenizer, Regex(pattern), generate, validate) >= 1


def test_choice(bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]) -> None:
    options = ("positive", "negative", "neutral", "très bien", "", "pos", "😀 ok")

    def validate(text: str) -> None:
        assert text in options

    assert check_all_runs(bpe_compiler, bpe_tokenizer, Choice(options), generate, validate) == len(RUNS)


def test_lark_grammar(bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]) -> None:
    lark = 'start: expr\nexpr: term (("+" | "-") term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]{1,3}/\n'

    def validate(text: str) -> None:
        assert re.fullmatch(r"[0-9()+-]+", text), text
        ast.parse(text, mode="eval")

    assert check_all_runs(bpe_compiler, bpe_tokenizer, Grammar(lark), generate, validate) >= 1


GBNF_VALID_EXAMPLES = {
    "arithmetic.gbnf": ["x=1\n", "(a +b)=c\n", "x = y\nz=(1)\n"],
    "chess.gbnf": ["1. e4 e5\n2. Nf3 Nc6\n"],
    "list.gbnf": ["- one\n- two\n"],
    "json.gbnf": ['{"a": [1, 2.5, "x"], "b": null}'],
    "json_arr.gbnf": ['[\n1,\n{"a": true}]'],
}


def _gbnf_files() -> list[str]:
    return sorted(p.name for p in GBNF_DIR.glob("*.gbnf"))


def test_gbnf_files_present() -> None:
    assert len(_gbnf_files()) == 9, "test data missing: tests/data/gbnf"
    assert (GBNF_DIR / "LICENSE").is_file()


@pytest.mark.parametrize("name", _gbnf_files())
def test_gbnf_grammars(
    name: str, bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]
) -> None:
    constraint = Grammar((GBNF_DIR / name).read_text(encoding="utf-8"), "gbnf")
    compiled = bpe_compiler.compile(constraint)
    eos = bpe_compiler.eos_token_ids[0]

    def reparses(text: str) -> bool:
        # Re-tokenize canonically (different ids than sampled) and feed a fresh matcher.
        matcher = compiled.matcher()
        ids = bpe_compiler.llg_tokenizer.tokenize_bytes(text.encode())
        return matcher.accept_tokens(ids) == len(ids) and matcher.accept_token(eos)

    for example in GBNF_VALID_EXAMPLES.get(name, []):
        assert reparses(example), example

    def validate(text: str) -> None:
        assert reparses(text), text
        if name in ("json.gbnf", "json_arr.gbnf"):
            value = json.loads(text)
            assert isinstance(value, dict if name == "json.gbnf" else list)

    # Open-ended grammars (english, list, arithmetic) end only if the "model" wants to stop.
    finished = check_all_runs(bpe_compiler, bpe_tokenizer, constraint, generate, validate, eos_bias=6.0)
    assert finished >= 1, f"{name}: no run finished within {MAX_TOKENS} tokens"
