"""A random-logits "model" decoded under each constraint: every finished output is valid."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from brisklm.constrained import Choice, Grammar, GrammarCompiler, JsonObject, JsonSchema, Regex
from tests.constraint_cases import SCHEMAS, Person, Team

GBNF_DIR = Path(__file__).resolve().parents[1] / "data" / "gbnf"
RUNS = [(0.0, 0), (0.0, 1), (1.0, 2), (1.0, 3), (1.0, 4), (0.0, 5)]  # (temperature, seed)
MAX_TOKENS = 256


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
            compiled,
            token_bytes,
            seed=seed,
            temperature=temperature,
            max_tokens=MAX_TOKENS,
            eos_bias=eos_bias,
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
    finished = check_all_runs(
        bpe_compiler, bpe_tokenizer, JsonSchema(schema), generate, json_validator(schema)
    )
    assert finished >= 1, f"{name}: no run finished within {MAX_TOKENS} tokens"


@pytest.mark.parametrize("model", [Person, Team])
def test_pydantic_models(
    model: type[BaseModel],
    bpe_compiler: GrammarCompiler,
    bpe_tokenizer: Any,
    generate: Callable[..., Any],
) -> None:
    schema = model.model_json_schema()

    def validate(text: str) -> None:
        json_validator(schema)(text)
        model.model_validate_json(text)

    runs = [(t, s) for t in (0.0, 1.0) for s in range(10)]
    finished = check_all_runs(
        bpe_compiler, bpe_tokenizer, JsonSchema(model), generate, validate, runs
    )
    assert finished >= 1


@pytest.mark.parametrize("name", ["types", "nested_optional", "pattern_formats"])
def test_json_schemas_sentencepiece(
    name: str, sp_compiler: GrammarCompiler, sp_tokenizer: Any, generate: Callable[..., Any]
) -> None:
    schema = SCHEMAS[name]
    finished = check_all_runs(
        sp_compiler, sp_tokenizer, JsonSchema(schema), generate, json_validator(schema)
    )
    assert finished >= 1


def test_json_mode(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]
) -> None:
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
def test_regex(
    pattern: str, which: str, request: pytest.FixtureRequest, generate: Callable[..., Any]
) -> None:
    compiler = request.getfixturevalue(f"{which}_compiler")
    tokenizer = request.getfixturevalue(f"{which}_tokenizer")

    def validate(text: str) -> None:
        assert re.fullmatch(pattern, text), text

    assert check_all_runs(compiler, tokenizer, Regex(pattern), generate, validate) >= 1


def test_choice(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]
) -> None:
    options = ("positive", "negative", "neutral", "très bien", "", "pos", "😀 ok")

    def validate(text: str) -> None:
        assert text in options

    assert check_all_runs(bpe_compiler, bpe_tokenizer, Choice(options), generate, validate) == len(
        RUNS
    )


def test_lark_grammar(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any, generate: Callable[..., Any]
) -> None:
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
    finished = check_all_runs(
        bpe_compiler, bpe_tokenizer, constraint, generate, validate, eos_bias=6.0
    )
    assert finished >= 1, f"{name}: no run finished within {MAX_TOKENS} tokens"
