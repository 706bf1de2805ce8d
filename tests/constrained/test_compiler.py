"""GrammarCompiler: the cache, and errors raised before generation."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from brisklm.constrained import (
    Choice,
    ConstraintError,
    Grammar,
    GrammarCompiler,
    JsonObject,
    JsonSchema,
    Regex,
)


def test_second_compile_returns_the_cached_object(bpe_compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"cache_me": {"type": "integer"}}}
    first = bpe_compiler.compile(JsonSchema(schema))
    second = bpe_compiler.compile(JsonSchema(dict(schema)))  # equal schema, different dict
    assert second is first
    assert bpe_compiler.compile(Regex("cache[0-9]")) is bpe_compiler.compile(Regex("cache[0-9]"))
    assert bpe_compiler.compile(Regex("cache[0-9]")) is not bpe_compiler.compile(
        Regex("cache[0-8]")
    )


def test_concurrent_compiles_share_one_object(bpe_tokenizer: Any) -> None:
    compiler = GrammarCompiler(bpe_tokenizer)
    schema = {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "maxItems": 3}
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: compiler.compile(JsonSchema(schema)), range(8)))
    assert all(r is results[0] for r in results)
    assert compiler.num_cached == 1


def test_cache_is_lru_and_bounded(bpe_tokenizer: Any) -> None:
    compiler = GrammarCompiler(bpe_tokenizer, max_cache_size=2)
    a = compiler.compile(Regex("a"))
    b = compiler.compile(Regex("b"))
    assert compiler.compile(Regex("a")) is a  # a is now most recent
    compiler.compile(Regex("c"))  # evicts b
    assert compiler.num_cached == 2
    assert compiler.compile(Regex("a")) is a
    assert compiler.compile(Regex("b")) is not b
    with pytest.raises(ValueError, match="max_cache_size"):
        GrammarCompiler(bpe_tokenizer, max_cache_size=0)


def test_compiled_grammar_facts(bpe_compiler: GrammarCompiler, bpe_tokenizer: Any) -> None:
    compiled = bpe_compiler.compile(JsonObject())
    assert compiled.vocab_size == bpe_tokenizer.vocab_size
    assert compiled.bitmask_width == (bpe_tokenizer.vocab_size + 31) // 32
    assert compiled.eos_token_ids == bpe_tokenizer.eos_token_ids
    assert compiled.constraint == JsonObject()
    with pytest.raises(TypeError, match="not a constraint"):
        bpe_compiler.compile({"type": "object"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "integr"}, "Invalid type: integr"),
        ({"minLength": -1}, "minLength"),
        ({"properties": 3}, "properties must be an object"),
        ({"$ref": "#/$defs/missing"}, "does not exist"),
        (False, "accepts no instance"),
        ({"type": "string", "pattern": "a("}, "unclosed group"),
        # The reason was on the message's fourth line, which the CLI (one line) dropped.
        (
            {"type": "string", "pattern": "[a-"},
            r"^invalid or unsupported JSON schema: a pattern cannot be read as a regex: "
            r"unclosed character class$",
        ),
        ({"type": "string", "pattern": "a{5,2}"}, r"a regex: invalid repetition count range"),
    ],
)
def test_invalid_json_schema(bpe_compiler: GrammarCompiler, schema: Any, message: str) -> None:
    with pytest.raises(ConstraintError, match=message):
        bpe_compiler.compile(JsonSchema(schema))


def test_annotations_are_not_read_as_schema_keywords(bpe_compiler: GrammarCompiler) -> None:
    """The checks of keyword values (multipleOf > 0, unique type and required entries, $defs an
    object) refused annotations that happen to use those names."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "x-ui": {"required": ["a", "a"], "multipleOf": -1},
        "metadata": {"definitions": "see RFC 8259"},
    }
    assert bpe_compiler.compile(JsonSchema(schema)) is not None
    with pytest.raises(ConstraintError, match="required at #/required names 'a' more than once"):
        bpe_compiler.compile(JsonSchema({**schema, "required": ["a", "b", "a"]}))


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, "not"),
        ({"if": {"minimum": 3}, "then": {"maximum": 5}}, "if, then"),
        ({"type": "array", "contains": {"const": 1}}, "contains"),
        ({"propertyNames": {"maxLength": 3}}, "propertyNames"),
        ({"unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"oneOf": [{"minimum": 1}, {"maximum": 3}]}, "oneOf"),
        ({"type": "string", "format": "iri"}, "format 'iri'"),
        ({"type": "object", "minProperties": 2}, "minProperties"),
        ({"items": [{"type": "integer"}]}, "array-form `items`"),
        ({"additionalItems": False}, "additionalItems"),
        ({"dependencies": {"a": ["b"]}}, "dependencies"),
        ({"type": "string", "pattern": "\\Aabc"}, "escape \\A"),
        ({"$defs": {"x": {"uniqueItems": True}}, "$ref": "#/$defs/x"}, "uniqueItems"),
    ],
)
def test_unenforceable_keywords_are_named(
    bpe_compiler: GrammarCompiler, schema: dict[str, Any], keyword: str
) -> None:
    with pytest.raises(ConstraintError, match="cannot be enforced") as info:
        bpe_compiler.compile(JsonSchema(schema))
    assert keyword in str(info.value)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        # where, and what to do instead (the bare keyword or format named nothing more)
        (
            {"properties": {"tags": {"type": "array", "uniqueItems": True}}},
            r"uniqueItems \(at #/properties/tags\) \(Pydantic writes it for a set field: type the "
            r"field as a list\)",
        ),
        # values JSON Schema forbids, which llguidance read anyway (multipleOf -2 as 2)
        (
            {"properties": {"n": {"type": "integer", "multipleOf": -2}}},
            r"multipleOf at #/properties/n/multipleOf must be greater than 0, got -2",
        ),
        (
            {"type": "number", "multipleOf": -0.5},
            r"multipleOf at #/multipleOf must be greater than 0, got -0.5",
        ),
        (
            {"type": ["string", "null", "string"]},
            r"type at #/type names 'string' more than once \(JSON Schema asks for each entry once\)",
        ),
        (
            {"type": "object", "properties": {"a": {}}, "required": ["a", "a"]},
            r"required at #/required names 'a' more than once",
        ),
        (
            {"$defs": 5, "type": "integer"},
            r"\$defs at #/\$defs must be an object of schemas, got int",
        ),
        # counts past what llguidance reads (a string's length bounds named a regex "pattern")
        (
            {"properties": {"a": {"type": "string", "minLength": 2**32}}},
            r"minLength at #/properties/a/minLength is 4294967296: more than llguidance handles "
            r"\(at most 4294967295\)",
        ),
        (
            {"type": "array", "maxItems": 10**30},
            r"maxItems at #/maxItems is 10{30}: more than llguidance handles \(at most "
            r"18446744073709551615\)",
        ),
        (
            {"properties": {"a": {"not": {"type": "null"}}}},
            r"keyword\(s\) cannot be enforced: not \(at #/properties/a\)",
        ),
        (
            {"properties": {"data": {"type": "string", "format": "binary"}}},
            r"format 'binary' at #/properties/data cannot be enforced; the formats enforced are "
            r"date, time, date-time, duration, email, hostname, ipv4, ipv6, uri, uuid",
        ),
        (
            {"properties": {"x": {"type": "number", "multipleOf": 0.10000000000000002}}},
            r"multipleOf 0.10000000000000002 at #/properties/x has more significant digits",
        ),
        # the offending one of several, not a map of properties (a property named like a keyword)
        (
            {
                "properties": {
                    "uniqueItems": {"type": "array", "uniqueItems": False},
                    "b": {"type": "number", "multipleOf": 0.5},
                    "c": {"type": "number", "multipleOf": 0.1234567890123},
                    "d": {"type": "array", "uniqueItems": True},
                }
            },
            r"multipleOf 0.1234567890123 at #/properties/c",
        ),
        (
            {
                "properties": {
                    "uniqueItems": {"type": "array", "uniqueItems": False},
                    "d": {"type": "array", "uniqueItems": True},
                }
            },
            r"uniqueItems \(at #/properties/d\)",
        ),
        (
            {"$ref": "https://example.com/s.json"},
            r"\$ref 'https://example.com/s.json' is not in the schema.*put the schema it names in "
            r"\$defs",
        ),
    ],
)
def test_refusals_say_where_and_what_instead(
    bpe_compiler: GrammarCompiler, schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConstraintError, match=message):
        bpe_compiler.compile(JsonSchema(schema))


def test_min_properties_allowed_when_sound(bpe_compiler: GrammarCompiler) -> None:
    # At least one key, or no more than the required (distinct, enforced) keys: duplicates cannot hurt.
    bpe_compiler.compile(JsonSchema({"type": "object", "minProperties": 1}))
    bpe_compiler.compile(JsonSchema({"type": "object", "required": ["a", "b"], "minProperties": 2}))


def test_bad_regex_has_column(bpe_compiler: GrammarCompiler) -> None:
    with pytest.raises(ConstraintError, match="unclosed group") as info:
        bpe_compiler.compile(Regex("ab(c"))
    assert (info.value.line, info.value.column) == (1, 3)
    with pytest.raises(ConstraintError, match="column 1: look-around"):
        bpe_compiler.compile(Regex("(?=a)b"))
    # Located in the grammar wrapping the pattern ("at 1(8)", "start: /.../"): no position then
    with pytest.raises(
        ConstraintError, match=r"^invalid regex: invalid regex .*WordUnicode"
    ) as info:
        bpe_compiler.compile(Regex(r"\bfoo\b"))
    assert "start:" not in str(info.value) and "\n" not in str(info.value)


def test_bad_lark_has_line_and_column(bpe_compiler: GrammarCompiler) -> None:
    with pytest.raises(ConstraintError, match="invalid Lark grammar at line 2, column") as info:
        bpe_compiler.compile(Grammar('start: item\nitem: "a" | missing\n'))
    assert 'unknown name: "missing"' in str(info.value)
    assert info.value.line == 2 and info.value.column is not None
    with pytest.raises(ConstraintError, match="line 1") as info:
        bpe_compiler.compile(Grammar('start: "a" ('))
    assert info.value.column is not None


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ('root ::= "a" item\nitem ::= ("b"', 2, 14, "Expected ')'"),
        ('root ::= "a"\nitem := "b"', 2, 6, "Expected ::="),
        ('root ::= "a" [b-', 1, 17, "Unexpected end of input"),
        ('root ::= "a" item\nitem ::= other', 2, 10, "undefined rule 'other'"),
        # llama.cpp's token references ("Expected name" before)
        ('root ::= <[1000]> "x"', 1, 10, "token references (<[id]>, <token>, !<...>) are not"),
        ('root ::= "x" (<|im_end|>)', 1, 15, "token references"),
        ('root ::= "a"\nitem ::= "b" !<[7]>', 2, 14, "token references"),
    ],
)
def test_bad_gbnf_has_line_and_column(
    bpe_compiler: GrammarCompiler, text: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(ConstraintError, match="invalid GBNF grammar") as info:
        bpe_compiler.compile(Grammar(text, "gbnf"))
    assert message in str(info.value)
    assert (info.value.line, info.value.column) == (line, column)


def test_an_undefined_gbnf_rule_is_located_where_it_is_used(bpe_compiler) -> None:
    # It pointed at the name's first appearance, here inside the comment
    text = '# call foo here\nroot ::= "foo" [foo] foo'
    with pytest.raises(ConstraintError, match="undefined rule 'foo'") as info:
        bpe_compiler.compile(Grammar(text, "gbnf"))
    assert (info.value.line, info.value.column) == (2, 22)


@pytest.mark.parametrize(
    ("gbnf", "accepted", "refused"),
    [
        # llama.cpp's escapes (\u00e9 was written \ue9 and \[ stayed \[: both refused)
        (r'root ::= "\u00e9" "\U0001F642" "\x41"', ["é🙂A"], ["e🙂A"]),
        (r'root ::= "\[" [\u00e0-\u00ff] "\]" "\"" "\\"', ['[é]"\\'], ['[a]"\\']),
        # "." is any character, a newline too (the regex "." was not)
        ('root ::= "a" . "b"', ["a\nb", "a.b", "aéb"], ["ab"]),
        # class members are characters: "+--" is the range + to -, "~~" and "&&" no operators
        ("root ::= [+--]", ["+", ",", "-"], ["."]),
        ("root ::= [a~~b]", ["~", "a", "b"], ["c"]),
        ("root ::= [&&a]", ["&", "a"], ["b"]),
        ("root ::= [-a] [a-]", ["-a", "a-"], ["b-"]),
        ("root ::= [^a-c]", ["d", "\n"], ["b"]),
        # strings are read character by character (one greedy lexeme each refused these)
        ('root ::= " "? "  " "x"', ["  x", "   x"], [" x", "    x"]),
        ('root ::= ("a" | "ab") "b"', ["ab", "abb"], ["a", "abbb"]),
        ('root ::= "a"? ("aa")+ "x"', ["aax", "aaax", "aaaax"], ["ax", "x"]),
        # a repetition of a repetition, and x{0} (both refused as invalid Lark)
        ('root ::= ([0-9]+)? "x"', ["x", "12x"], ["1", "ax"]),
        ('root ::= ("a"{2}){3} "b"', ["aaaaaab"], ["aaaab", "aaaaab"]),
        ('root ::= ("a"*)+ "b"', ["b", "aab"], ["c"]),
        ('root ::= "x" "a"{0} "b"', ["xb"], ["xab"]),
    ],
)
def test_gbnf_characters_mean_what_llama_cpp_reads(bpe_compiler, gbnf, accepted, refused) -> None:
    compiled = bpe_compiler.compile(Grammar(gbnf, "gbnf"))
    tokenize = bpe_compiler.llg_tokenizer.tokenize_str

    def accepts(text: str) -> bool:
        matcher = compiled.matcher()
        tokens = tokenize(text)
        return matcher.accept_tokens(tokens) == len(tokens) and matcher.is_accepting()

    assert all(accepts(text) for text in accepted), gbnf
    assert not any(accepts(text) for text in refused), gbnf


def test_gbnf_without_root(bpe_compiler: GrammarCompiler) -> None:
    with pytest.raises(ConstraintError, match="no 'root' rule"):
        bpe_compiler.compile(Grammar('start ::= "a"', "gbnf"))


def test_errors_are_value_errors_and_compiler_stays_usable(bpe_compiler: GrammarCompiler) -> None:
    with pytest.raises(ValueError):
        bpe_compiler.compile(Regex("["))
    assert (
        bpe_compiler.compile(Choice(("ok",)))
        .matcher()
        .accept_tokens(bpe_compiler.llg_tokenizer.tokenize_str("ok"))
        > 0
    )


NOTHING = "matches no output at all"
ENDLESS = "cannot be enforced: it forces \\d+ tok"


@pytest.mark.parametrize(
    "constraint, name, message",
    [
        # These compiled, then failed at the first token with "rejected token 0
        # (NoExtensionBias)": their language is empty.
        (Regex(r"[^\x00-\x{10FFFF}]"), "regex", NOTHING),
        (Grammar('start: a\na: a "x"'), "Lark grammar", NOTHING),  # no base case
        (Grammar('root ::= a\na ::= a "x"', "gbnf"), "GBNF grammar", NOTHING),
        # These compiled, and the request failed at its first step ("Too many items").
        (Grammar('start: "a" start'), "Lark grammar", ENDLESS),
        (Grammar('start: x "b"\nx: "ab" x'), "Lark grammar", ENDLESS),
        (Grammar('root ::= "a" root', "gbnf"), "GBNF grammar", ENDLESS),
    ],
)
def test_a_constraint_with_no_finite_output_fails_at_compile(
    bpe_compiler: GrammarCompiler, constraint: Any, name: str, message: str
) -> None:
    with pytest.raises(ConstraintError, match=f"the {name} {message}"):
        bpe_compiler.compile(constraint)
    assert bpe_compiler.compile(Grammar('start: "a" start | "b"')).matcher().is_accepting() is False


def test_the_empty_string_is_a_language(bpe_compiler: GrammarCompiler) -> None:
    matcher = bpe_compiler.compile(Regex("")).matcher()
    assert matcher.is_accepting()
