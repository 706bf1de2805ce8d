"""A Lark grammar's ``%json`` embeds, rewritten so that llguidance enforces each schema exactly."""

from __future__ import annotations

import json
import re
from typing import Any

from brisklm.constrained.errors import ConstraintError
from brisklm.constrained.json_schema import enforced_options, prepare_json_schema

# Marks an embed that brisklm wrote already prepared (tool-call and answer grammars): taken as is,
# since preparing a prepared schema again would read its Rust regexes as ECMA-262 ones.
PREPARED_MARK = "x-brisklm-prepared"

_DECODER = json.JSONDecoder()
# What the scan stops at: a string or regex literal (a backslash escapes the next character; an
# unclosed one ends at its line's end, where Lark's lexer stops it too), a comment (`//` or, in
# llguidance's dialect, `#`), or `%json`.
_LEXEMES = re.compile(
    r'"(?:[^"\\\n]|\\.)*"?|//[^\n]*|#[^\n]*|/(?:[^/\\\n]|\\.)*/?'
    r"|(?P<json>%json(?![A-Za-z0-9_]))"
)
_SPACE = re.compile(r"[ \t\r\n]*")


def mark_prepared(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (prepared, with its sound options) marked so that ``enforce_json_embeds``
    leaves it as it is."""
    return {**schema, PREPARED_MARK: True}


def enforce_json_embeds(lark: str) -> str:
    """``lark`` with the schema of each ``%json`` embed prepared as a ``json_schema`` constraint
    prepares it (``prepare_json_schema``: ECMA-262 patterns, exact formats and number bounds),
    with llguidance's options that would let through what the schema refuses forced off
    (``sound_json_options``); the embed's own whitespace and separator options stay. An embed
    that is not valid JSON is left for llguidance to report; a schema that cannot be enforced
    raises ConstraintError naming its line."""
    pieces: list[str] = []
    done = i = 0
    while (lexeme := _LEXEMES.search(lark, i)) is not None:
        i = lexeme.end()
        if lexeme.group("json") is None:
            continue
        start = _SPACE.match(lark, i).end()  # type: ignore[union-attr]
        try:
            schema, end = _DECODER.raw_decode(lark, start)
        except json.JSONDecodeError:
            continue
        i = end
        if isinstance(schema, dict) and schema.get(PREPARED_MARK) is True:
            continue
        line = lark.count("\n", 0, lexeme.start()) + 1
        # (ASCII: an escaped lone surrogate stays an escape, which llguidance refuses by name;
        # written out raw, it could not be encoded at all)
        pieces += [lark[done:start], json.dumps(_enforced(schema, line))]
        done = end
    return "".join(pieces) + lark[done:] if pieces else lark


def _enforced(schema: Any, line: int) -> Any:
    try:
        prepared = prepare_json_schema(schema)
    except ConstraintError as e:
        raise ConstraintError(f"the %json schema at line {line}: {e}") from e
    prepared["x-guidance"] = enforced_options(prepared, {})
    return prepared
