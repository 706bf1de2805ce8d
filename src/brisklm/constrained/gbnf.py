"""GBNF (llama.cpp) to llguidance Lark, keeping llama.cpp's character-level rule semantics."""

from __future__ import annotations

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
    (only literals and character classes are lexemes), which parses exactly what llama.cpp parses.
    Raises ConstraintError with line and column for syntax errors and undefined rules.
    """
    try:
        rules = _llg_gbnf.GrammarParser().parse(text)
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
        rule.alternatives = rule.alternatives.simplify()
    for rule in rules.values():
        for node in _descendants(rule):
            if not isinstance(node, _llg_gbnf.RuleRefNode):
                continue
            if node.name not in rules:
                ref = re.search(rf"(?<![\w-]){re.escape(node.name)}(?![\w-])", text)
                line, column = _line_column(text, ref.start()) if ref else (None, None)
                where = f" at line {line}, column {column}" if ref else ""
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
