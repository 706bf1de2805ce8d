"""AfterThinking: a reasoning model's thinking block, then output under another constraint,
as that constraint alone would take it."""

from __future__ import annotations

import pytest

from brisklm.constrained import (
    AfterThinking,
    Choice,
    ConstraintError,
    Grammar,
    GrammarCompiler,
    JsonObject,
    JsonSchema,
    Regex,
)

# Each constraint, text it takes and text it refuses.
CASES = [
    (Regex("[0-9]+"), "42", "4a"),
    (Choice(["yes", "no"]), "no", "maybe"),
    (Grammar('start: "(" start ")" | "x"'), "((x))", "((x)"),  # start used inside: the reply's
    (Grammar('root ::= "a" | "b"', "gbnf"), "b", "ab"),
    (JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}}), '{"a": 1}', '{"a":1}'),
    (JsonObject(), '{"b": [1]}', "[1]"),
]  # fmt: skip


def accepts(compiler: GrammarCompiler, constraint, text: str) -> bool:
    matcher = compiler.compile(constraint).matcher()
    ids = compiler.llg_tokenizer.tokenize_str(text)
    return matcher.accept_tokens(ids) == len(ids) and matcher.is_accepting()


@pytest.mark.parametrize(("inner", "good", "bad"), CASES, ids=lambda c: type(c).__name__)
def test_the_block_then_the_constraint_as_alone(bpe_compiler, inner, good, bad) -> None:
    may_open, opened = AfterThinking(inner), AfterThinking(inner, opened=True)
    block = '<think>a plan: (x) {"a": 2} </think'
    for text in (good, f"{block}>{good}", f" \n{block}>\n{good}", f"{block}>\n\n{good}"):
        assert accepts(bpe_compiler, may_open, text), text
    # the prompt opened the block: the reply closes it first
    for text in (f"hm {good}</think>{good}", f"</think>\n\n{good}"):
        assert accepts(bpe_compiler, opened, text), text
    refused = [bad, f"{block}>{bad}", f"{block}>\n\n\n{good}", f"{block}{good}"]
    refused += [f"<think>unclosed {good}", f"{good}<think>x</think>{good}"]
    assert not any(accepts(bpe_compiler, may_open, text) for text in refused), refused
    assert not accepts(bpe_compiler, opened, good)  # (the block must close)
    assert not accepts(bpe_compiler, opened, f"</think>{bad}")


def test_a_lark_grammars_llguidance_options_are_read() -> None:
    skip = Grammar('%llguidance {"allow_initial_skip": true}\nstart: "x"\n%ignore /[ ]+/')
    assert skip.llguidance_options == {"allow_initial_skip": True}
    assert Grammar('%llguidance {}\nstart: "x"').llguidance_options == {}
    assert (
        Grammar('// %llguidance {"allow_initial_skip": true}\nstart: "x"').llguidance_options == {}
    )
    assert Grammar('start: "x"').llguidance_options == {}
    assert Grammar('root ::= "x"', "gbnf").llguidance_options == {}
    assert Grammar("%llguidance {oops\nstart: 'x'").llguidance_options == {}


def test_keys_and_equality() -> None:
    regex = Regex("[0-9]+")
    assert AfterThinking(regex) == AfterThinking(Regex("[0-9]+"))
    assert AfterThinking(regex).key != AfterThinking(regex, opened=True).key
    assert AfterThinking(regex).key != regex.key
    assert AfterThinking(regex).key != AfterThinking(Choice(["[0-9]+"])).key


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ConstraintError, match="JsonSchema, JsonObject, Regex, Choice or Grammar"):
        AfterThinking(AfterThinking(Regex("a")))
    with pytest.raises(ConstraintError, match="got str"):
        AfterThinking("a+")  # type: ignore[arg-type]
    with pytest.raises(ConstraintError, match="opened must be a bool"):
        AfterThinking(Regex("a"), opened=1)  # type: ignore[arg-type]


def test_a_bad_constraint_is_named_as_alone(bpe_compiler) -> None:
    for inner, message in [
        (Regex("(("), "invalid regex"),
        (Grammar("start: ("), "invalid Lark grammar"),
        (Grammar('start ::= "a"', "gbnf"), "no 'root' rule"),
        (Regex(r"[^\x00-\x{10FFFF}]"), "the regex matches no output at all"),
        (Grammar('start: "a" start'), "the Lark grammar cannot be enforced"),
    ]:
        with pytest.raises(ConstraintError, match=message):
            bpe_compiler.compile(inner)
        with pytest.raises(ConstraintError, match=message):
            bpe_compiler.compile(AfterThinking(inner))
    # (a thinking block alone is no output: the constraint's must follow it)
    assert bpe_compiler.compile(AfterThinking(Regex("x"))).matcher().is_accepting() is False
