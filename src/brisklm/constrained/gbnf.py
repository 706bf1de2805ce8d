"""GBNF (llama.cpp) to llguidance Lark, keeping llama.cpp's character-level rule semantics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from llguidance import gbnf_to_lark as _llg_gbnf

from brisklm.constrained.errors import ConstraintError


def _line_column(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, column


def _descendants(node: _llg_gbnf.ASTNode) -> Iterator[_llg_gbnf.ASTNode]:
    for child in node.children():
        yield child
        yield from _descendants(child)


# llama.cpp's escapes: \\x.., \\u...., \\U........ (hex) and these single characters.
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class _Literal(_llg_gbnf.LiteralNode):
    """A GBNF string, written as JSON strings (which llguidance's Lark strings read) of one
    character each: a Lark string is one lexeme, and lexemes are matched greedily, so
    `" "? "  " "x"` refused three spaces and `("a" | "ab") "b"` refused "ab", where llama.cpp
    reads every string character by character."""

    def __str__(self) -> str:
        return " ".join(json.dumps(c) for c in self.value) if self.value else '""'

    def is_atomic(self) -> bool:
        return len(self.value) <= 1


def _repaired(node: _llg_gbnf.ASTNode) -> _llg_gbnf.ASTNode:
    """``node`` with the repetitions Lark cannot write as llguidance writes them: a repetition
    of a repetition (`([0-9]+)?`, which ``simplify`` leaves as `/[0-9]/+?`) gets its group back,
    and `x{0}` (nothing, in llama.cpp) becomes the empty string."""
    if isinstance(node, _llg_gbnf.RepetitionNode):
        node.node = _repaired(node.node)
        if node.max_times == 0 or _is_empty(node.node):
            return _llg_gbnf.SequenceNode([])
        if isinstance(node.node, _llg_gbnf.RepetitionNode):
            node.node = _llg_gbnf.SequenceNode([node.node])  # not atomic: written in parentheses
    elif isinstance(node, _llg_gbnf.SequenceNode):
        node.nodes = [_repaired(child) for child in node.nodes]
    elif isinstance(node, _llg_gbnf.AlternativeNode):
        node.alternatives = [_repaired(child) for child in node.alternatives]
    return node


def _is_empty(node: _llg_gbnf.ASTNode) -> bool:
    return isinstance(node, _llg_gbnf.SequenceNode) and not node.nodes


def _opened(pos: _llg_gbnf.Position, opening: str) -> _llg_gbnf.Position:
    """The position after ``opening``, which must be there."""
    if pos.current() != opening:
        raise _llg_gbnf.GbnfToLarkError(pos, f"Expected {opening!r}")
    return pos.advance()


class _Parser(_llg_gbnf.GrammarParser):
    """llguidance's GBNF parser, with strings and character classes read as llama.cpp reads them.

    llguidance's own copies the escapes' text into the Lark grammar: ``\\u00e9`` became ``\\ue9``
    and ``\\[`` stayed ``\\[`` (both refused), and a class's characters went into a regex class
    as they were, where the regex dialect reads ``--``, ``&&`` and ``~~`` as set operations
    (``[+--]``, the range + to -, lost ``,`` and ``-``). Here each character is decoded and then
    written unambiguously: strings as JSON strings, class members as ``\\x{..}``.
    """

    def _char(self, pos: _llg_gbnf.Position) -> tuple[str, _llg_gbnf.Position]:
        if pos.current() == "":
            raise _llg_gbnf.GbnfToLarkError(pos, "Unexpected end of input")
        if pos.current() != "\\":
            return pos.current(), pos.advance()
        kind = pos.peek(2)[1:]
        if kind in _ESCAPES:
            return _ESCAPES[kind], pos.advance(2)
        if kind in _HEX_ESCAPES:
            width = _HEX_ESCAPES[kind]
            digits = pos.peek(2 + width)[2:]
            if len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
                code = int(digits, 16)
                if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
                    return chr(code), pos.advance(2 + width)
            raise _llg_gbnf.GbnfToLarkError(
                pos, f"Invalid \\{kind} escape sequence: \\{kind}{digits}"
            )
        if not kind:
            raise _llg_gbnf.GbnfToLarkError(pos, "Incomplete escape sequence")
        raise _llg_gbnf.GbnfToLarkError(pos, f"Invalid escape sequence \\{kind}")

    def _parse_sequence(
        self, pos: _llg_gbnf.Position, is_nested: bool
    ) -> tuple[_llg_gbnf.SequenceNode, _llg_gbnf.Position]:
        node, end = super()._parse_sequence(pos, is_nested)
        # llama.cpp's token references (<[1000]>, <|im_end|>, !<...>) stopped the sequence, and
        # the parse failed further on with "Expected name".
        if end.current() == "<" or (end.current() == "!" and end.peek(2)[1:] == "<"):
            raise _llg_gbnf.GbnfToLarkError(
                end,
                "token references (<[id]>, <token>, !<...>) are not supported: write the text "
                "the token stands for as a string",
            )
        return node, end

    def _parse_literal(
        self, pos: _llg_gbnf.Position
    ) -> tuple[_llg_gbnf.ASTNode, _llg_gbnf.Position]:
        pos = _opened(pos, '"')
        value = ""
        while pos.current() != '"':
            char, pos = self._char(pos)
            value += char
        return _Literal(value), pos.advance()

    def _parse_char_class(
        self, pos: _llg_gbnf.Position
    ) -> tuple[_llg_gbnf.ASTNode, _llg_gbnf.Position]:
        pos = _opened(pos, "[")
        regex = "["
        if pos.current() == "^":
            regex += "^"
            pos = pos.advance()
        members = 0
        while pos.current() != "]":
            start = pos
            low, pos = self._char(pos)
            regex += f"\\x{{{ord(low):x}}}"
            if pos.current() == "-" and pos.peek(2)[1:] not in ("]", ""):
                high, pos = self._char(pos.advance())
                if ord(high) < ord(low):
                    raise _llg_gbnf.GbnfToLarkError(start, "Character class range out of order")
                regex += f"-\\x{{{ord(high):x}}}"
            members += 1
        if not members:
            raise _llg_gbnf.GbnfToLarkError(pos, "Empty character class")
        return _llg_gbnf.RegexNode(regex + "]"), pos.advance()


# What a reference to a rule is not inside: comments, strings and character classes (each with
# its escapes), and the name a rule defines.
_NOT_REFERENCES = re.compile(r'#[^\n]*|"(?:\\.|[^"\\])*"?|\[(?:\\.|[^\]\\])*\]?|[\w-]+\s*::=')


def _reference_position(text: str, name: str) -> int | None:
    """Where ``name`` is first used as a rule reference in GBNF ``text``, or None."""
    word = re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")
    position = 0
    for skipped in _NOT_REFERENCES.finditer(text):
        found = word.search(text, position, skipped.start())
        if found:
            return found.start()
        position = skipped.end()
    found = word.search(text, position)
    return found.start() if found else None


def _lark_name(gbnf_name: str, taken: set[str]) -> str:
    # Lark rule names are lowercase identifiers; the prefix keeps clear of `start` and leading digits.
    base = "g_" + re.sub(r"[^a-z0-9_]", "_", gbnf_name.lower())
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def gbnf_to_lark(text: str) -> str:
    """Translate a GBNF grammar (root rule `root`) into Lark text for llguidance.

    llguidance's own translator turns rules made only of terminals into lexemes, and lexemes are
    matched greedily: in llama.cpp's arithmetic.gbnf `num ::= [0-9]+ ws` then swallows the newline
    that `root` requires, so no output can ever complete. Here every GBNF rule becomes a Lark rule
    and the only lexemes are single characters (a class, or one character of a string), which
    parses exactly what llama.cpp parses.
    Raises ConstraintError with line and column for syntax errors and undefined rules.
    """
    try:
        rules = _Parser().parse(text)
    except _llg_gbnf.GbnfToLarkError as e:
        message = str(e)
        suffix = f" at {e.pos}"
        if message.endswith(suffix):
            message = message[: -len(suffix)]
        line, column = _line_column(text, e.pos.pos)
        raise ConstraintError(
            f"invalid GBNF grammar at line {line}, column {column}: {message}",
            line=line,
            column=column,
        ) from e
    if "root" not in rules:
        raise ConstraintError("invalid GBNF grammar: no 'root' rule")
    for rule in rules.values():
        rule.alternatives = _repaired(rule.alternatives.simplify())
    for rule in rules.values():
        for node in _descendants(rule):
            if isinstance(node, _llg_gbnf.RegexNode) and node.rx == ".":
                node.rx = "(?s:.)"  # llama.cpp's "." is any character, a newline too
            if not isinstance(node, _llg_gbnf.RuleRefNode):
                continue
            if node.name not in rules:
                ref = _reference_position(text, node.name)
                line, column = _line_column(text, ref) if ref is not None else (None, None)
                where = f" at line {line}, column {column}" if ref is not None else ""
                raise ConstraintError(
                    f"invalid GBNF grammar{where}: undefined rule '{node.name}'",
                    line=line,
                    column=column,
                )
            node.target = rules[node.name]
    taken = {"start"}
    ordered = list(rules.values())
    for rule in ordered:
        rule.name = "start" if rule.name == "root" else _lark_name(rule.name, taken)
    return "%llguidance {}\n\n" + "\n\n".join(str(rule) for rule in ordered) + "\n"
