"""ConstraintError: a constraint that cannot be compiled or enforced, raised before generation."""

from __future__ import annotations

import re

# llguidance's Lark errors start with "at 2(6): ..." or "2(6): ..." (line, column; both 1-based).
LARK_POSITION = re.compile(r"^(?:at )?(\d+)\((\d+)\):\s*")


class ConstraintError(ValueError):
    """A constraint that cannot be compiled or enforced.

    `line` and `column` (1-based) locate the error in the grammar or pattern text when known.
    """

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


def first_paragraph(message: str) -> str:
    """llguidance error text without the parser-state dump it appends for matcher errors and the
    Rust backtrace it appends to a panic's."""
    for dump in ("\n<state>", "\n<backtrace>", "\nstack backtrace:"):
        message = message.split(dump, 1)[0]
    return message.strip()


def lark_error(message: str, what: str) -> ConstraintError:
    """ConstraintError for an llguidance Lark/regex error, with its line and column when given."""
    message = first_paragraph(message)
    match = LARK_POSITION.match(message)
    if match is None:
        return ConstraintError(f"{what}: {message}")
    line, column = int(match.group(1)), int(match.group(2))
    rest = message[match.end() :]
    return ConstraintError(
        f"{what} at line {line}, column {column}: {rest}", line=line, column=column
    )
