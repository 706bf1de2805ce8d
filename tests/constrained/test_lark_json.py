"""A Lark grammar's `%json` embeds are enforced as json_schema constraints are."""

from __future__ import annotations

import json
from typing import Any

import pytest

from brisklm.constrained import ConstraintError, Grammar, GrammarCompiler
from brisklm.constrained.lark_json import enforce_json_embeds
from brisklm.tool_formats import ToolCallFormat


def accepts(compiler: GrammarCompiler, grammar: str, text: str) -> bool:
    matcher = compiler.compile(Grammar(grammar)).matcher()
    ids = compiler.llg_tokenizer.tokenize_str(text)
    return matcher.accept_tokens(ids) == len(ids) and matcher.accept_token(
        compiler.eos_token_ids[0]
    )


def embed(schema: Any, before: str = "", after: str = "") -> str:
    return f"start: {before} %json {json.dumps(schema, ensure_ascii=False)} {after}".strip()


def test_escaped_keys_formats_and_ecma_patterns(bpe_compiler: GrammarCompiler) -> None:
    # llguidance alone let "\u0061" spell a second key "a" that a's schema never checked, took
    # Feb 29 of any year as a date, and read `\S` as Rust does (U+FEFF is ECMA whitespace).
    open_object = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(bpe_compiler, embed(open_object), '{"a": 1, "b": "x"}')
    assert not accepts(bpe_compiler, embed(open_object), '{"a": 1, "\\u0061": "x"}')
    date = embed({"type": "string", "format": "date"}, '"on "', '"."')
    assert accepts(bpe_compiler, date, 'on "2024-02-29".')
    assert not accepts(bpe_compiler, date, 'on "2021-02-29".')
    not_space = embed({"type": "string", "pattern": "^\\S$"})
    assert accepts(bpe_compiler, not_space, '"a"')
    assert not accepts(bpe_compiler, not_space, '"\ufeff"')


def test_an_embeds_own_whitespace_options_stay(bpe_compiler: GrammarCompiler) -> None:
    compact = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "x-guidance": {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"},
    }
    assert accepts(bpe_compiler, embed(compact), '{"a":1,"b":2}')
    assert not accepts(bpe_compiler, embed(compact), '{"a": 1, "b": 2}')


def test_every_embed_of_a_grammar_is_enforced(bpe_compiler: GrammarCompiler) -> None:
    date = json.dumps({"type": "string", "format": "date"})
    grammar = f'start: "from " a " to " b\na: %json {date}\nb: %json{date}\n'
    assert accepts(bpe_compiler, grammar, 'from "2024-02-29" to "2024-03-01"')
    assert not accepts(bpe_compiler, grammar, 'from "2024-02-29" to "2023-02-29"')


@pytest.mark.parametrize(
    "text",
    [
        'start: "%json {\\"type\\": \\"integer\\"}" | "b"\n',
        'start: /%json \\{\\}/ | "b"\n',
        'start: "b" // %json {"type": "string", "format": "date"}\n',
        'start: "b"\n# an example: %json []\n',
        'start: "a#b" | /#/ # %json []\n',
        'start: "a" | jsonish\njsonish: "%json" "b"\n',
        '%llguidance {}\nstart: "x"\n',
    ],
)
def test_text_outside_embeds_is_left_alone(text: str) -> None:
    assert enforce_json_embeds(text) == text


@pytest.mark.parametrize(
    "tools",
    [
        [{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
        [
            {
                "name": "book",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "day": {"type": "string", "format": "date"},
                        "code": {"type": "string", "pattern": "^\\w+$"},
                        "n": {"type": "integer"},
                    },
                    "required": ["day", "code"],
                },
            }
        ],
    ],
)
def test_brisklm_s_own_embeds_are_taken_as_written(tools: list[dict[str, Any]]) -> None:
    # Tool-call and answer grammars embed schemas brisklm prepared already (their patterns are
    # Rust regexes now): preparing them again would read those as ECMA-262 ones.
    for name, tag in (("hermes", None), ("llama3_json", 7), ("mistral", 9)):
        grammar = ToolCallFormat(name, tag).grammar(
            tools, "auto", answer_schema={"type": "object", "properties": {"x": {}}}
        )
        assert "%json" in grammar
        assert enforce_json_embeds(grammar) == grammar


def test_a_schema_that_cannot_be_enforced_names_its_line(bpe_compiler: GrammarCompiler) -> None:
    grammar = 'start: "a" x\nx: %json {"type": "array", "items": [{"type": "integer"}]}\n'
    with pytest.raises(ConstraintError, match="the %json schema at line 2: .*draft-07"):
        bpe_compiler.compile(Grammar(grammar))
    # llguidance's `lenient` would skip the keyword instead: it is forced off.
    lenient = embed(
        {"type": "array", "contains": {"type": "integer"}, "x-guidance": {"lenient": 1}}
    )
    with pytest.raises(ConstraintError, match="x-guidance lenient must be a bool"):
        bpe_compiler.compile(Grammar(lenient))
    lenient = lenient.replace('"lenient": 1', '"lenient": true')
    with pytest.raises(ConstraintError, match="line 1, column 9: .*Unimplemented keys.*contains"):
        bpe_compiler.compile(Grammar(lenient))
    # An escaped lone surrogate is llguidance's to refuse (it was a UnicodeEncodeError).
    with pytest.raises(ConstraintError, match="invalid Lark grammar"):
        bpe_compiler.compile(Grammar('start: %json {"const": "\\ud800"}'))
    # Text after %json that is not JSON is llguidance's to report.
    with pytest.raises(ConstraintError, match="invalid Lark grammar"):
        bpe_compiler.compile(Grammar("start: %json {not json}"))
    assert accepts(bpe_compiler, embed({"type": "integer"}), "12")
