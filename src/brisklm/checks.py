"""Checks of argument values shared by the API's entry points: each error names the argument and
what it may be."""

from __future__ import annotations

import numbers


def check_bool(name: str, value: object) -> None:
    """True or False, or a ValueError naming ``name`` (a truthy str read as True)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_int(name: str, value: object, minimum: int, also: str = "") -> None:
    """An int (not a bool) of at least ``minimum``, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        hint = ""
        if isinstance(value, numbers.Integral) and not isinstance(value, bool | int):
            hint = f" (a {type(value).__name__}: pass int(...) of it)"  # numpy's int64
        raise ValueError(f"{name} must be an int >= {minimum}{also}, got {value!r}{hint}")
