"""A value's repr for an error message, whatever the value."""

from __future__ import annotations

from typing import Any


def safe_repr(value: Any) -> str:
    """``repr(value)``; an int past Python's limit on converting ints to text (4,300 digits),
    whose repr raises, named by its size."""
    try:
        return repr(value)
    except ValueError:
        if isinstance(value, int):
            return f"<an int of {value.bit_length()} bits>"
        return f"<a {type(value).__name__}>"
