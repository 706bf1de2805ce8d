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


def is_token_id(value: object) -> bool:
    """An int (numpy's integer scalars too: numbers.Integral) or a 0-d integer tensor or array;
    not a bool (nor a numpy str, bytes or datetime scalar)."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return is_integer_dtype(getattr(value, "dtype", None))
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_integer_dtype(dtype: object) -> bool:
    """Whether a numpy or torch dtype is of integers (not bools)."""
    kind = getattr(dtype, "kind", None)  # numpy's
    if kind is not None:
        return kind in ("i", "u")
    if dtype is None or not hasattr(dtype, "is_floating_point"):
        return False
    return not (dtype.is_floating_point or dtype.is_complex) and str(dtype) != "torch.bool"
