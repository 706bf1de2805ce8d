"""The numbers of a JSON schema that llguidance cannot enforce exactly, refused with the reason.

llguidance reads a schema's numbers with serde_json's fast float parser, which rounds twice where a
value's digits do not fit a 64-bit float's mantissa (most 17-digit values): a ``const`` of
29.544827403386506 is generated as 29.544827403386503, a bound moves by one unit in the last
place. ``read_as_llguidance`` computes what that parser reads, exactly (the same integer-to-float
rounding, then one multiplication or division by a power of ten, as IEEE arithmetic does in
Python), so such values are found before a request is made.

Its number ranges have two more gaps: an exclusive bound beyond 2**53 moves by one in a float
(2**53 + 1 rounds back to 2**53, which is then allowed), and an integral exclusive bound is
allowed itself when the range holds no integer and lies on the bound's side away from zero
(``exclusiveMinimum: 1, maximum: 1.5`` accepts ``1``; ``minimum: -0.5, exclusiveMaximum: 0``
accepts ``-0``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from brisklm.constrained.errors import ConstraintError

_JSON_NUMBER = re.compile(r"-?(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?")
_U64_LIMIT = 2**64
_EXACT_LIMIT = 2**53  # past this, not every integer is a float
_I64_LIMIT = 2**63  # an integer schema's numbers are held as 64-bit integers


def read_as_llguidance(value: float) -> float:
    """The float llguidance's JSON parser reads from ``json.dumps(value)``."""
    text = json.dumps(value)
    match = _JSON_NUMBER.fullmatch(text)
    if match is None:  # inf / nan: json.dumps writes them, no JSON parser reads them
        return math.nan
    whole, fraction, exponent_text = match.group(1), match.group(2) or "", match.group(3)
    exponent = int(exponent_text or 0) - len(fraction)
    digits = (whole + fraction).lstrip("0")
    significand = 0
    for index, digit in enumerate(digits):  # digits past a u64 only move the exponent
        widened = significand * 10 + int(digit)
        if widened >= _U64_LIMIT:
            exponent += len(digits) - index
            break
        significand = widened
    result = float(significand)
    while abs(exponent) > 308:
        if result == 0.0 or exponent > 0:
            return math.inf if result else 0.0
        result /= 1e308
        exponent += 308
    power = float(f"1e{abs(exponent)}")
    result = result * power if exponent >= 0 else result / power
    return -result if text.startswith("-") else result


def check_integer_range(value: Any, path: str) -> None:
    """ConstraintError if a bound, ``const`` or ``enum`` number of an integer schema (``value``,
    or a list of them) lies outside the 64-bit integers: llguidance holds an integer schema's
    numbers as such, and one beyond was clamped (``"type": "integer", "minimum": 1e19`` generated
    9223372036854775807) or crashed the process (``"maximum": -1e19``)."""
    for number in value if isinstance(value, list) else [value]:
        if not _is_number(number) or (math.isfinite(number) and -_I64_LIMIT < number < _I64_LIMIT):
            continue
        raise ConstraintError(
            f"the number {number!r} at {path} is outside the 64-bit integers llguidance enforces "
            f"an integer schema in (greater than -2**63 and less than 2**63)"
        )


def check_exact_numbers(value: Any, path: str) -> None:
    """ConstraintError if a number in ``value`` (a bound, or a const / enum instance, walked into
    arrays and objects) is read by llguidance as another: a float its parser misreads, or an
    integer a float does not hold (llguidance holds bounds and writes const and enum numbers as
    floats: 12345678901234567 came out as 12345678901234568)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _EXACT_LIMIT:
        try:
            rounded: int | None = int(float(value))
        except OverflowError:
            rounded = None
        if rounded != value:
            became = "cannot hold it" if rounded is None else f"round it to {rounded}"
            raise ConstraintError(
                f"the integer {value} at {path} cannot be enforced exactly: llguidance holds "
                f"numbers as 64-bit floats, which {became} (integers beyond 2**53 are exact only "
                "where a float is)"
            )
    elif isinstance(value, float):
        read = read_as_llguidance(value)
        if read != value:
            raise ConstraintError(
                f"the number {value!r} at {path} cannot be enforced exactly: llguidance reads it "
                f"as {read!r} (its JSON parser rounds twice where the digits do not fit a 64-bit "
                "float's mantissa, as in most values of 17 significant digits, or the power of "
                "ten passes 1e22); use a nearby value of fewer digits"
            )
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_exact_numbers(item, f"{path}/{index}")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_exact_numbers(item, f"{path}/{key}")


def check_exclusive_bound(key: str, value: Any, path: str) -> None:
    """ConstraintError for an exclusive bound beyond 2**53 (llguidance moves it by one)."""
    if key.startswith("exclusive") and _is_number(value) and abs(value) >= _EXACT_LIMIT:
        raise ConstraintError(
            f"the bound {key}={value} at {path} cannot be enforced exactly: llguidance moves an "
            "exclusive bound by one in 64-bit floats, which do not hold every integer past 2**53; "
            "use minimum/maximum"
        )


def check_number_range(
    schema: dict[str, Any], path: str, resolve: Callable[[Any], Any] | None = None
) -> None:
    """ConstraintError for a range llguidance would let its integral exclusive bound through: no
    integer inside, on the bound's side away from zero (see the module docstring). Bounds that
    ``allOf`` members and a ``$ref`` target (``resolve``: the target of a node's $ref, or None)
    state count with the schema's own, as llguidance intersects them into one range, and so do
    those of each ``anyOf`` / ``oneOf`` branch."""
    for summary in _alternatives(schema, resolve, frozenset()):
        _check_range(summary, path)


class _Range(NamedTuple):
    """What one way of matching a schema says of a number: its tightest bounds ((value,
    exclusive) or None), whether its values are listed (enum / const: enforced exactly), and
    whether a part excludes numbers (a type without "number")."""

    low: tuple[float, bool] | None
    high: tuple[float, bool] | None
    listed: bool
    not_a_number: bool


def _own_range(schema: dict[str, Any]) -> _Range:
    kinds = schema.get("type", "number")
    return _Range(
        _tighter(_bound(schema, "minimum", False), _bound(schema, "exclusiveMinimum", True), max),
        _tighter(_bound(schema, "maximum", False), _bound(schema, "exclusiveMaximum", True), min),
        "enum" in schema or "const" in schema,
        "number" not in (kinds if isinstance(kinds, list) else [kinds]),
    )


def _bound(schema: dict[str, Any], key: str, exclusive: bool) -> tuple[float, bool] | None:
    value = schema.get(key)
    return (value, exclusive) if _is_number(value) and math.isfinite(value) else None


def _tighter(a: tuple[float, bool] | None, b: tuple[float, bool] | None, pick: Any) -> Any:
    """The tighter of two bounds ((value, exclusive) or None) on the side ``pick`` says."""
    if a is None or b is None:
        return a if b is None else b
    value = pick(a[0], b[0])
    return value, (a[0] == value and a[1]) or (b[0] == value and b[1])


def _merged(a: _Range, b: _Range) -> _Range:
    return _Range(
        _tighter(a.low, b.low, max),
        _tighter(a.high, b.high, min),
        a.listed or b.listed,
        a.not_a_number or b.not_a_number,
    )


def _alternatives(
    schema: dict[str, Any], resolve: Callable[[Any], Any] | None, seen: frozenset[int]
) -> set[_Range]:
    """The ways an instance can match ``schema``, each as the range all its parts bound: the
    schema, its ``allOf`` members and ``$ref`` target (all of them), and one branch of each
    ``anyOf`` / ``oneOf``, through those parts' own combinators too. Kept as a set of merged
    ranges, so unions that bound nothing collapse and no combination is dropped."""
    if id(schema) in seen:
        return {_Range(None, None, False, False)}
    seen = seen | {id(schema)}
    alternatives = {_own_range(schema)}
    members = schema.get("allOf")
    target = resolve(schema) if resolve is not None and "$ref" in schema else None
    for member in [*(members if isinstance(members, list) else []), target]:
        if isinstance(member, dict):
            alternatives = _combine(alternatives, _alternatives(member, resolve, seen))
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        options = {
            option
            for branch in (branches if isinstance(branches, list) else [])
            if isinstance(branch, dict)
            for option in _alternatives(branch, resolve, seen)
        }
        if options:
            alternatives = _combine(alternatives, options)
    return alternatives


def _combine(left: set[_Range], right: set[_Range]) -> set[_Range]:
    return {_merged(a, b) for a in left for b in right}


def _check_range(summary: _Range, path: str) -> None:
    if summary.listed or summary.not_a_number:
        return  # listed values are enforced exactly; "integer" ranges are enforced
    if summary.low is None or summary.high is None:
        return
    (low_value, low_exclusive), (high_value, high_exclusive) = summary.low, summary.high
    if low_exclusive and _integral(low_value) and low_value >= 0 and high_value < low_value + 1:
        bound = f"exclusiveMinimum {low_value}"
    elif (
        high_exclusive and _integral(high_value) and high_value <= 0 and low_value > high_value - 1
    ):
        bound = f"exclusiveMaximum {high_value}"
    else:
        return
    raise ConstraintError(
        f"the range at {path} cannot be enforced exactly: llguidance lets its {bound} itself "
        "through when no integer lies in the range (a gap in its number ranges); widen the "
        "range to hold an integer, or make the bound inclusive"
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integral(value: float) -> bool:
    return float(value).is_integer()
