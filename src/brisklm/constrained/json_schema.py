"""JSON Schema to llguidance grammar: compact JSON, sound rewrites, unenforceable keywords refused."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from llguidance import LLMatcher

from brisklm.constrained.email_format import MAX_ADDRESS, email_pattern
from brisklm.constrained.errors import ConstraintError
from brisklm.constrained.json_numbers import (
    check_exact_numbers,
    check_exclusive_bound,
    check_integer_range,
    check_number_range,
)
from brisklm.safe_repr import safe_repr

# One line, spaced like json.dumps: what models see most in training (and what the bundled model
# was trained on), at one extra token per separator over compact JSON.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
SOUND_JSON_OPTIONS: dict[str, Any] = {"lenient": False, "coerce_one_of": False}
# llguidance's default `json_allowed_escapes`.
DEFAULT_JSON_ESCAPES = 'nrbtf\\"u'

_SCHEMA_MAPS = frozenset(
    {"$defs", "definitions", "properties", "patternProperties", "dependentSchemas"}
)
_SCHEMA_VALUES = frozenset(
    {
        "additionalProperties",
        "items",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
# Values of these are JSON instances or options, never schemas: copy them untouched.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "x-guidance"})
_COUNT_KEYWORDS = frozenset(
    {
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "minContains",
        "maxContains",
    }
)
_BOUND_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
# Keywords that assert nothing in these cases (2020-12: `uniqueItems: false` is the default;
# `minContains`/`maxContains` act only beside `contains`): dropped, as llguidance refuses them.
_VACUOUS = {
    "uniqueItems": lambda node: node["uniqueItems"] is False,
    "minContains": lambda node: "contains" not in node,
    "maxContains": lambda node: "contains" not in node,
}
_LEGACY_KEYWORDS = {
    "additionalItems": "draft-07 `additionalItems` (2020-12 uses `items` after `prefixItems`)",
    "dependencies": "draft-07 `dependencies` (2020-12: `dependentRequired`/`dependentSchemas`)",
    "$recursiveRef": "2019-09 `$recursiveRef`",
}
# Keywords whose list JSON Schema requires to hold each entry once.
_UNIQUE_ENTRIES = ("type", "required")

# ECMA-262 character classes, in Rust regex syntax: (outside a class, inside a class).
_ECMA_SPACE = r"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_ECMA_CLASS_ESCAPES = {
    "d": ("[0-9]", "0-9"),
    "D": ("[^0-9]", "[^0-9]"),
    "w": ("[0-9A-Za-z_]", "0-9A-Za-z_"),
    "W": ("[^0-9A-Za-z_]", "[^0-9A-Za-z_]"),
    "s": (f"[{_ECMA_SPACE}]", _ECMA_SPACE),
    "S": (f"[^{_ECMA_SPACE}]", f"[^{_ECMA_SPACE}]"),
}
# Letter escapes that mean the same in ECMA-262 and Rust, or that Rust rejects (b, B, c, k: error).
_SAME_LETTER_ESCAPES = frozenset("bBnrtfvxupPck")
_ECMA_DOT = r"[^\n\r\u2028\u2029]"

_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999, as Python's date
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
# No leap second (23:59:60, which RFC 3339 allows): Python's datetime and time, and so Pydantic's,
# refuse a second of 60.
_TIME = (
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?"
    r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
_LABEL = (
    r"(?:[A-Za-z0-9]|[A-Za-z0-9]{2}|[A-Za-z0-9][A-Za-z0-9-][A-Za-z0-9]"
    r"|[A-Za-z0-9][A-Za-z0-9-]{2}[A-Za-z0-9]"
    r"|[A-Za-z0-9][A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]{0,58}[A-Za-z0-9])"
)
# RFC 3339's duration (Appendix A), with at most as many digits in each number as Pydantic's
# timedelta reads all together (it refuses "PT9999999999S": too large; a duration of every
# number at these bounds is 17 million days, under timedelta's 999,999,999).
_DURATION_TIME = (
    r"T(?:[0-9]{1,5}H(?:[0-9]{1,6}M(?:[0-9]{1,8}S)?)?|[0-9]{1,6}M(?:[0-9]{1,8}S)?|[0-9]{1,8}S)"
)
_DURATION_DATE = (
    r"(?:[0-9]{1,7}D|[0-9]{1,5}M(?:[0-9]{1,7}D)?|[0-9]{1,4}Y(?:[0-9]{1,5}M(?:[0-9]{1,7}D)?)?)"
)
_DURATION = rf"P(?:{_DURATION_DATE}(?:{_DURATION_TIME})?|{_DURATION_TIME}|[0-9]{{1,7}}W)"
# format -> string constraints that replace it (patterns are Rust syntax, already anchored).
_FORMAT_REWRITES: dict[str, dict[str, Any]] = {
    "date": {"pattern": f"^{_DATE}$"},
    "time": {"pattern": f"^{_TIME}$"},
    "date-time": {"pattern": f"^{_DATE}[Tt]{_TIME}$"},
    "hostname": {"pattern": rf"^{_LABEL}(?:\.{_LABEL})*$", "maxLength": 253},
    "duration": {"pattern": f"^{_DURATION}$"},
    # What Pydantic's EmailStr accepts too (llguidance's took bob@example: email_format).
    "email": {"pattern": email_pattern(_LABEL), "maxLength": MAX_ADDRESS},
}


# OpenAPI's integer formats, enforced as bounds (int64's 1,024 inside its ends: the nearest that
# llguidance, which holds bounds as 64-bit floats, reads exactly).
_INTEGER_FORMATS: dict[str, dict[str, int]] = {
    "int32": {"minimum": -(2**31), "maximum": 2**31 - 1},
    "int64": {"minimum": -(2**63) + 1024, "maximum": 2**63 - 1024},
}


def schema_types(node: dict[str, Any]) -> list[Any] | None:
    """A schema's ``type`` as a list (one name or several), None where it names none."""
    kind = node.get("type")
    return None if kind is None else kind if isinstance(kind, list) else [kind]


def holds_integers(node: dict[str, Any]) -> bool:
    """Whether a schema's ``type`` names integers (alone or in a list)."""
    return "integer" in (schema_types(node) or [])


def may_be_integer(node: dict[str, Any], also: tuple[str, ...] = ()) -> bool:
    """Whether llguidance may read a schema's numbers as an integer schema's: its ``type`` names
    integers (or one of ``also``), or it names none, and then a parent's or an ``allOf``
    sibling's type applies (``{"type": "integer", "anyOf": [{"const": -1e19}]}``)."""
    kinds = schema_types(node)
    return kinds is None or any(k == "integer" or k in also for k in kinds)


def ecma_regex_to_rust(pattern: str) -> str:
    """Rewrite an ECMA-262 regex (JSON Schema `pattern`) into the Rust syntax llguidance reads."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            atom, i = _ecma_escape(pattern, i, in_class=False)
            out.append(atom[1])
            continue
        if c == "[":
            negated = pattern.startswith("[^", i)
            j = i + (2 if negated else 1)
            if j < n and pattern[j] == "]":  # ECMA: [] matches nothing, [^] matches anything
                out.append(r"[\x00-\x{10FFFF}]" if negated else r"[^\x00-\x{10FFFF}]")
                i = j + 1
                continue
            body, i = _ecma_class_body(pattern, j)
            out.append(("[^" if negated else "[") + body)
            continue
        out.append(_ECMA_DOT if c == "." else c)
        i += 1
    return "".join(out)


# Characters written escaped in a Rust class: its own syntax there (nesting, negation, ranges,
# and the set operators `&&`, `--`, `~~`), all literal in an ECMA class.
_RUST_CLASS_SPECIAL = frozenset("[]\\^-&~")
_HEX = re.compile("[0-9A-Fa-f]+")


def _ecma_escape(pattern: str, i: int, in_class: bool) -> tuple[tuple[str, str], int]:
    """The escape at ``pattern[i]`` (a backslash) as (kind, Rust text) and the index after it:
    kind "char" for one character, "set" for a class of them (``\\d``, ``\\p{L}``)."""
    n = len(pattern)
    if i + 1 == n:
        raise ConstraintError(f"pattern {pattern!r} ends with a lone backslash")
    e = pattern[i + 1]
    i += 2
    if e in _ECMA_CLASS_ESCAPES:
        return ("set", _ECMA_CLASS_ESCAPES[e][in_class]), i
    if e == "0" and not (i < n and pattern[i].isdigit()):
        return ("char", r"\x00"), i  # ECMA's NUL escape; Rust reads \0 as a backreference
    if in_class and e == "b":
        return ("char", r"\x08"), i  # backspace in an ECMA class (Rust has no \b there)
    if e.isascii() and e.isalpha() and e not in _SAME_LETTER_ESCAPES:
        raise ConstraintError(f"pattern {pattern!r}: escape \\{e} cannot be enforced")
    # The whole escape, so that a range's end is one atom: \xHH, \uHHHH, \u{...}, \p{..}, \pL.
    end = i
    if e in "upP" and pattern.startswith("{", i):
        end = pattern.find("}", i) + 1 or n
    elif e in "xu":
        hex_digits = _HEX.match(pattern, i, i + (2 if e == "x" else 4))
        end = hex_digits.end() if hex_digits else i
    elif e in "pP":
        end = min(i + 1, n)
    kind = "set" if e in "pP" else "char"
    return (kind, "\\" + e + pattern[i:end]), end


def _ecma_class_body(pattern: str, i: int) -> tuple[str, int]:
    """The body of the ECMA class whose first atom is at ``pattern[i]`` in Rust syntax, its
    closing ``]`` included, and the index after that. ECMA's class grammar, written out: ``A-B`` is a range only
    between two single characters (Annex B: beside a class escape, as in ``[\\w-.]``, the ``-``
    is a literal), every other ``-`` is literal, and so are ``[``, ``&&``, ``--``, ``~~``."""
    n = len(pattern)
    atoms: list[tuple[str, str]] = []  # (kind, Rust text); kind "dash" for an unescaped -
    while True:
        if i >= n:  # unclosed (no "]"): left for the regex parser to report
            return "".join(text for _, text in atoms), i
        c = pattern[i]
        if c == "]":
            i += 1
            break
        if c == "\\":
            atom, i = _ecma_escape(pattern, i, in_class=True)
            atoms.append(atom)
            continue
        atoms.append(("dash" if c == "-" else "char", "\\" + c if c in _RUST_CLASS_SPECIAL else c))
        i += 1
    parts: list[str] = []
    k = 0
    while k < len(atoms):
        first = atoms[k]
        if k + 2 < len(atoms) and atoms[k + 1][0] == "dash":
            last = atoms[k + 2]
            if first[0] != "set" and last[0] != "set":
                parts.append(f"{first[1]}-{last[1]}")
            else:  # Annex B: a class escape ends no range; the three are a union
                parts += [first[1], r"\-", last[1]]
            k += 3
            continue
        parts.append(first[1])
        k += 1
    return "".join(parts) + "]", i


# The keywords that count (a string's characters, an array's items, an object's keys), and the
# largest value llguidance reads for each.
_COUNTS = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
)
_MAX_COUNT = 2**64 - 1
_COUNT_LIMITS = {"minLength": 2**32 - 1, "maxLength": 2**32 - 1}


def check_keyword_value(key: str, value: Any, where: str) -> None:
    """ConstraintError for values that JSON Schema forbids and llguidance reads anyway (it took
    a negative multipleOf as its absolute value, and lets the others pass)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key == "multipleOf" and number and value <= 0:
        raise ConstraintError(
            f"multipleOf at {where} must be greater than 0, got {safe_repr(value)}"
        )
    if key in _UNIQUE_ENTRIES and isinstance(value, list):
        seen: set[Any] = set()
        for entry in value:  # (a set: a list of 100,000 names was 50 s of pairwise scans)
            if not isinstance(entry, str):
                continue  # not a type or key name: llguidance's to report
            if entry in seen:
                raise ConstraintError(
                    f"{key} at {where} names {entry!r} more than once (JSON Schema asks for "
                    "each entry once)"
                )
            seen.add(entry)
    limit = _COUNT_LIMITS.get(key, _MAX_COUNT)
    if key in _COUNTS and number and value > limit:
        # (llguidance reads counts as 64-bit; a string's length bounds become a regex's
        # repetition, at most 32-bit: past them it named a pattern the schema does not hold)
        raise ConstraintError(
            f"{key} at {where} is {safe_repr(value)}: more than llguidance handles (at most "
            f"{limit})"
        )
    if key in ("$defs", "definitions") and not isinstance(value, dict):
        raise ConstraintError(
            f"{key} at {where} must be an object of schemas, got {type(value).__name__}"
        )


class _SchemaRewriter:
    """Walks a schema document (not following $ref) and rewrites every place a schema can be.

    With ``strict``, objects that list ``properties`` but say nothing of other keys are closed
    (``additionalProperties: false``), as xgrammar's strict mode and OpenAI's strict schemas do:
    generated objects carry the declared keys only, which every valid-instance consumer accepts
    and which keeps a model from inventing keys. A closed object also declares the keys it
    requires (``required``, ``dependentRequired``) where ``properties`` does not.

    Closing must not change what a combined schema means, so the parts of a combination stay open,
    all the way down (``$ref`` targets included): the members of ``allOf``, the branches of
    ``oneOf`` (closing them could make an instance match one branch where the open schema matches
    two), and the members of an object that has ``properties`` or ``required`` beside
    ``anyOf``/``oneOf``/``allOf``/``$ref``; that object, or one made of ``allOf`` members alone, is
    closed to the keys any of its parts declares. A ``oneOf`` whose branches each require a distinct
    constant discriminator (what Pydantic writes for a discriminated union) matches at most one
    branch, so it is an ``anyOf`` and is written as one (llguidance enforces no other ``oneOf`` it
    cannot prove disjoint).
    """

    def __init__(self, root: Any, strict: bool = False) -> None:
        self.strict = strict
        self.refs = _LocalRefs(root)
        self.open_ids = _combined_parts(root, self.refs) if strict else set()
        # Inside an unknown keyword's value (an annotation: x-ui, metadata), walked for $ref
        # targets; its keys are not schema keywords, so their values are not checked as such.
        self.annotation_depth = 0

    def schema(self, node: Any, path: str, closable: bool = True) -> Any:
        if not isinstance(node, dict):
            return node  # booleans; malformed subschemas are llguidance's to report
        closable = closable and id(node) not in self.open_ids
        out: dict[str, Any] = {}
        for key, value in node.items():
            where = f"{path}/{key}"
            if key in _LEGACY_KEYWORDS:
                raise ConstraintError(f"{_LEGACY_KEYWORDS[key]} at {where} cannot be enforced")
            if not self.annotation_depth:
                check_keyword_value(key, value, where)
            if key == "items" and isinstance(value, list):
                raise ConstraintError(
                    f"draft-07 array-form `items` at {where} cannot be enforced (use `prefixItems`)"
                )
            if key in _VACUOUS and _VACUOUS[key](node):
                continue  # asserts nothing, and llguidance refuses the keyword
            if key in _DATA_KEYWORDS:
                if key in ("const", "enum"):
                    check_exact_numbers(value, where)
                    if may_be_integer(node):
                        check_integer_range(value, where)
                out[key] = value
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {
                    (
                        self.pattern(name, where) if key == "patternProperties" else name
                    ): self.schema(sub, f"{where}/{name}")
                    for name, sub in value.items()
                }
            elif key in _SCHEMA_VALUES:
                out[key] = self.schema(value, where)
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                if key == "oneOf" and _one_of_as_any_of(node, self.refs):
                    key = "anyOf"
                out[key] = [self.schema(sub, f"{where}/{k}") for k, sub in enumerate(value)]
            elif key in _BOUND_KEYWORDS or key == "multipleOf":
                # llguidance reads these as 64-bit floats: a value it rounds would move them.
                check_exact_numbers(value, where)
                check_exclusive_bound(key, value, where)
                # A number's bounds too: an allOf sibling's "integer" makes them an integer's.
                if may_be_integer(node, also=("number",)):
                    check_integer_range(value, where)
                out[key] = value
            elif key == "pattern" and isinstance(value, str):
                out[key] = self.pattern(value, where)
            elif key in _COUNT_KEYWORDS and isinstance(value, float) and value.is_integer():
                out[key] = int(value)  # 2020-12 allows 2.0 for a count; llguidance wants an int
            else:
                # Unknown keywords can still be $ref targets, so their objects are walked too.
                out[key] = self.unknown(value, where)
        self.check_format_of_non_strings(out, path or "#")
        self.rewrite_format(out)
        check_number_range(out, path or "#", self.refs.target)
        if self.strict and closable:
            self.close_object(node, out)
        self.check_min_properties(out, path)
        return out

    def close_object(self, node: dict[str, Any], out: dict[str, Any]) -> None:
        properties = out.get("properties")
        if properties is None and _merges_all_of(node):
            # An object made of allOf members, which stay open: it is closed here, to the keys
            # they declare (if they declare any: allOf of strings declares none).
            properties = {}
        if not isinstance(properties, dict) or any(k in out for k in _OTHER_KEYS_KEYWORDS):
            return
        keys = _declared_keys(node, self.refs, set())
        if keys is None or not (keys or "properties" in out):
            return  # a part we cannot read (a remote $ref) may declare any key
        out["properties"] = {**properties, **{k: {} for k in keys if k not in properties}}
        out["additionalProperties"] = False

    def unknown(self, value: Any, path: str) -> Any:
        self.annotation_depth += 1
        try:
            if isinstance(value, dict):
                return self.schema(value, path)
            if isinstance(value, list):
                return [self.unknown(v, f"{path}/{k}") for k, v in enumerate(value)]
            return value
        finally:
            self.annotation_depth -= 1

    @staticmethod
    def pattern(pattern: str, path: str) -> str:
        try:
            return ecma_regex_to_rust(pattern)
        except ConstraintError as e:
            raise ConstraintError(f"{e} (at {path})") from e

    @staticmethod
    def check_format_of_non_strings(out: dict[str, Any], path: str) -> None:
        """llguidance enforces ``format`` on strings only (an unknown one is its error): on a
        schema that cannot be a string it was silently ignored (``"type": "integer", "format":
        "int32"`` let 99999999999 through). OpenAPI's ``int32`` and ``int64`` on integers become
        their bounds; any other is refused, as an unknown string format is."""
        fmt, kinds = out.get("format"), schema_types(out)
        if fmt is None or kinds is None or "string" in kinds:
            return
        if fmt in _INTEGER_FORMATS and holds_integers(out):
            del out["format"]
            bounds = dict(_INTEGER_FORMATS[fmt])
            all_of = out.get("allOf")
            out["allOf"] = [*all_of, bounds] if isinstance(all_of, list) else [bounds]
            return
        raise ConstraintError(
            f"JSON schema format {fmt!r} at {path} cannot be enforced on a {out['type']!r} schema "
            "(llguidance checks formats of strings only; int32 and int64 are enforced on integers "
            "as their bounds): leave the format out, or give minimum and maximum"
        )

    @staticmethod
    def rewrite_format(out: dict[str, Any]) -> None:
        rewrite = _FORMAT_REWRITES.get(out.get("format"))  # type: ignore[arg-type]
        if rewrite is None:
            return
        del out["format"]
        # pattern/maxLength, like format, only constrain strings, so `allOf` keeps other types free.
        all_of = out.get("allOf")
        out["allOf"] = [*all_of, dict(rewrite)] if isinstance(all_of, list) else [dict(rewrite)]

    @staticmethod
    def check_min_properties(out: dict[str, Any], path: str) -> None:
        min_properties = out.get("minProperties")
        if not isinstance(min_properties, int) or isinstance(min_properties, bool):
            return
        required = out.get("required")
        num_required = len(set(required)) if isinstance(required, list) else 0
        open_keys = out.get("additionalProperties", True) is not False or bool(
            out.get("patternProperties")
        )
        if open_keys and min_properties > max(1, num_required):
            raise ConstraintError(
                f"minProperties ({min_properties}) at {path or '#'} cannot be enforced: keys allowed "
                "by additionalProperties/patternProperties may repeat, so the parsed object can "
                "have fewer properties"
            )


def schema_path_of(schema: Any, matches: Any, path: str = "#") -> str | None:
    """The JSON pointer of the first schema object in ``schema`` that ``matches`` (a predicate on
    dicts), walking into subschemas but not into instances (const, enum, default, examples) and
    not taking a name-to-schema map (``properties``, ``$defs``, ...) for a schema."""
    if isinstance(schema, dict):
        if matches(schema):
            return path
        children = [(k, v) for k, v in schema.items() if k not in _DATA_KEYWORDS]
    elif isinstance(schema, list):
        children = list(enumerate(schema))
    else:
        return None
    for key, child in children:
        where = f"{path}/{_pointer_step(key)}"
        if key in _SCHEMA_MAPS and isinstance(child, dict) and isinstance(schema, dict):
            found = next(
                (
                    hit
                    for name, sub in child.items()
                    if (hit := schema_path_of(sub, matches, f"{where}/{_pointer_step(name)}"))
                ),
                None,
            )
        else:
            found = schema_path_of(child, matches, where)
        if found is not None:
            return found
    return None


def _pointer_step(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def states_keyword(node: dict[str, Any], keyword: str) -> bool:
    """Whether ``node`` holds ``keyword`` with a value that asserts something (not one the
    rewriter drops, as ``uniqueItems: false``)."""
    return keyword in node and not (keyword in _VACUOUS and _VACUOUS[keyword](node))


def nullable_as_json_schema(node: Any) -> Any:
    """``node`` with OpenAPI's ``"nullable": true`` written as JSON Schema: ``anyOf`` the schema
    and ``{"type": "null"}``, at every place a schema can be.

    JSON Schema has no such keyword (it would be ignored, and null refused); transformers writes it
    for an ``Optional[...]`` parameter of a function tool, so tool schemas are read this way.
    """
    if isinstance(node, list):
        return [nullable_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: nullable_as_json_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_VALUES or key in _SCHEMA_LISTS:
            out[key] = nullable_as_json_schema(value)
        else:
            out[key] = value
    if out.pop("nullable", False) is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


class _LocalRefs:
    """Resolves the document's own ``$ref`` pointers (``#``, ``#/$defs/name``); None otherwise."""

    def __init__(self, root: Any) -> None:
        self.root = root

    def target(self, node: Any) -> Any:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        target = self.root
        for part in filter(None, unquote(ref[1:]).split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        return target

    def parts(self, node: dict[str, Any]) -> list[Any]:
        """The schemas an instance of ``node`` must also match, or may match instead: its
        combinators' members and its ``$ref`` target (None where that cannot be read)."""
        found = [sub for key in _COMBINATORS for sub in _list(node.get(key))]
        return [*found, self.target(node)] if "$ref" in node else found


_COMBINATORS = ("allOf", "anyOf", "oneOf")
# The keywords that say what an object's undeclared keys may be.
_OTHER_KEYS_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _combined_parts(root: Any, refs: _LocalRefs) -> set[int]:
    """ids of the schema objects strict mode must leave open: the parts of combinations (see
    ``_SchemaRewriter``) and everything inside them, through ``$ref``."""
    open_ids: set[int] = set()

    def keep_open(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                keep_open(item)
        if not isinstance(node, dict) or id(node) in open_ids:
            return
        open_ids.add(id(node))
        for key, value in node.items():
            if key not in _DATA_KEYWORDS:
                keep_open(value)
        keep_open(refs.target(node))

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        if not isinstance(node, dict):
            return
        all_of = _list(node.get("allOf"))
        if _merges_all_of(node) or (all_of and ("properties" in node or "required" in node)):
            keep_open(all_of)
        if "oneOf" in node and not _one_of_as_any_of(node, refs):
            keep_open(node["oneOf"])
        if "properties" in node or "required" in node:
            keep_open(refs.parts(node))
        for key, value in node.items():
            if key not in _DATA_KEYWORDS:
                walk(value)

    walk(root)
    return open_ids


def _merges_all_of(node: dict[str, Any]) -> bool:
    """Whether ``node`` combines several ``allOf`` members (left open in strict mode: the object
    they make is closed instead)."""
    return len(_list(node.get("allOf"))) > 1


def _lets_other_keys_in(node: Any) -> bool:
    """Whether a schema allows keys it does not declare by saying so (an ``additionalProperties``
    other than false, ``patternProperties``, ``unevaluatedProperties``)."""
    if not isinstance(node, dict):
        return False
    return node.get("additionalProperties", False) is not False or any(
        keyword in node for keyword in ("patternProperties", "unevaluatedProperties")
    )


def _declared_keys(node: Any, refs: _LocalRefs, seen: set[int]) -> dict[str, None] | None:
    """Keys that ``node`` or the parts combined with it declare or require, in the order they are
    written (an ordered set); None where a part cannot be read (a remote ``$ref``) or lets other
    keys in (``additionalProperties`` other than false, ``patternProperties``,
    ``unevaluatedProperties``): closing would refuse keys the schema allows."""
    if node is None:
        return None
    if not isinstance(node, dict) or id(node) in seen:
        return {}
    seen.add(id(node))
    properties = node.get("properties")
    keys = dict.fromkeys(properties) if isinstance(properties, dict) else {}
    keys.update(dict.fromkeys(k for k in _list(node.get("required")) if isinstance(k, str)))
    dependent = node.get("dependentRequired")
    if isinstance(dependent, dict):
        names = [k for ks in dependent.values() for k in _list(ks) if isinstance(k, str)]
        keys.update(dict.fromkeys(names))
    for part in refs.parts(node):
        if _lets_other_keys_in(part):
            return None
        part_keys = _declared_keys(part, refs, seen)
        if part_keys is None:
            return None
        keys.update(part_keys)
    return keys


def _one_of_as_any_of(node: dict[str, Any], refs: _LocalRefs) -> bool:
    """Whether ``node``'s ``oneOf`` is written as an ``anyOf`` (see ``_SchemaRewriter``)."""
    return "anyOf" not in node and _discriminated(_list(node.get("oneOf")), refs)


def _discriminated(branches: list[Any], refs: _LocalRefs) -> bool:
    """True if some property is required by every branch with a constant unique to it, so an
    instance matches at most one branch."""
    resolved = [refs.target(b) if isinstance(b, dict) and "$ref" in b else b for b in branches]
    if len(resolved) < 2 or not all(isinstance(b, dict) for b in resolved):
        return False
    first = resolved[0].get("properties")
    for name in first if isinstance(first, dict) else ():
        values = [_constant(b, name) for b in resolved]
        if None not in values and len(set(values)) == len(values):
            return True
    return False


def _constant(branch: dict[str, Any], name: str) -> tuple[str, Any] | None:
    """The one scalar a required property ``name`` of ``branch`` may hold, as a comparable key."""
    properties = branch.get("properties")
    if name not in _list(branch.get("required")) or not isinstance(properties, dict):
        return None
    sub = properties.get(name)
    if not isinstance(sub, dict):
        return None
    if "const" in sub:
        value = sub["const"]
    elif isinstance(sub.get("enum"), list) and len(sub["enum"]) == 1:
        value = sub["enum"][0]
    else:
        return None
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", value)  # 1 and 1.0 are one JSON number: they compare equal here
    return None


# Why a schema is refused when reading it passes Python's recursion limit.
SCHEMA_TOO_DEEP = "the JSON schema is nested too deeply to read (Python's recursion limit)"


def prepare_json_schema(schema: dict[str, Any] | bool, strict: bool = False) -> dict[str, Any]:
    """The schema rewritten so that llguidance enforces it exactly, or ConstraintError naming why not.

    ``strict`` also closes objects to their declared properties (see ``_SchemaRewriter``).
    """
    if schema is True:
        return {}
    if schema is False:
        raise ConstraintError("the JSON schema `false` accepts no instance")
    if not isinstance(schema, dict):
        raise ConstraintError(
            f"a JSON schema must be an object or a boolean, got {type(schema).__name__}"
        )
    if "x-guidance" in schema:
        check_guidance_options(schema["x-guidance"])
    try:
        return _SchemaRewriter(schema, strict).schema(schema, "#")
    except RecursionError:
        raise ConstraintError(SCHEMA_TOO_DEEP) from None


# JSON whitespace only (RFC 8259: space, tab, line feed, carriage return), as characters, escapes or
# classes of them, grouped and repeated: what a `whitespace_pattern` may be made of.
_JSON_SPACE_ATOM = r"(?:[ \t\n\r]|\\[tnr ]|\\x(?:20|09|0[aAdD]))"
_WHITESPACE_PATTERN = re.compile(
    rf"(?:{_JSON_SPACE_ATOM}|\[{_JSON_SPACE_ATOM}+\]|\(\?:|[()|]|(?:[*+?]|\{{\d+(?:,\d*)?\}})\??)*"
)
_SEPARATORS = {"item_separator": ",", "key_separator": ":"}
_OPTION_KINDS = {
    "whitespace_flexible": bool,
    "whitespace_pattern": str,
    "item_separator": str,
    "key_separator": str,
    "json_allowed_escapes": str,
    "json_allow_general_unicode_escapes": bool,
    "lenient": bool,  # forced off (SOUND_JSON_OPTIONS)
    "coerce_one_of": bool,  # forced off
}


def check_guidance_options(options: Any) -> None:
    """ConstraintError unless a schema's top-level `x-guidance` options keep the output JSON:
    known options of the right type, separators of JSON whitespace around `,` / `:`, a whitespace
    pattern of JSON whitespace, escapes JSON has."""
    if not isinstance(options, dict):
        raise ConstraintError(f"x-guidance must be an object of options, got {options!r}")
    for name, value in options.items():
        kind = _OPTION_KINDS.get(name)
        if kind is None:
            raise ConstraintError(
                f"unknown x-guidance option {name!r}; known: {', '.join(sorted(_OPTION_KINDS))}"
            )
        if value is not None and not isinstance(value, kind):
            raise ConstraintError(f"x-guidance {name} must be a {kind.__name__}, got {value!r}")
    for name, mark in _SEPARATORS.items():
        value = options.get(name)
        if value is not None and not re.fullmatch(rf"[ \t\n\r]*{mark}[ \t\n\r]*", value):
            raise ConstraintError(
                f"x-guidance {name} {value!r} would not be JSON: it must be {mark!r} with JSON "
                "whitespace (space, \\t, \\n, \\r) around it"
            )
    pattern = options.get("whitespace_pattern")
    if pattern is not None and not _WHITESPACE_PATTERN.fullmatch(pattern):
        raise ConstraintError(
            f"x-guidance whitespace_pattern {pattern!r} may match more than JSON whitespace: write "
            "it with space, \\t, \\n, \\r (or classes of them), groups and repetitions only"
        )
    escapes = options.get("json_allowed_escapes")
    if escapes is not None and not set(escapes) <= set('"\\/bfnrtu'):
        raise ConstraintError(
            f"x-guidance json_allowed_escapes {escapes!r} names escapes JSON does not have; "
            'allowed: " \\ / b f n r t u'
        )


def sound_json_options(prepared: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The options that override a prepared schema's (``options``: the defaults and its own
    ``x-guidance``) so that llguidance enforces it exactly: ``SOUND_JSON_OPTIONS``, and no
    ``\\uXXXX`` escapes where an object's other keys sit beside named ones.

    llguidance writes the name of such a key (``additionalProperties``, or keys left open, beside
    ``properties`` or ``patternProperties``) as any JSON string but a named key's text, and lets it
    spell any character as ``\\uXXXX``: ``"\\u0061"`` is the key ``"a"`` to a JSON parser, and
    its value went unchecked by ``a``'s schema (or the same key came twice). Without ``\\u``
    escapes a key has one spelling, so its text decides. The price: such a schema's strings cannot
    hold the control characters that have no short escape (U+0000-U+001F but \\b \\f \\n \\r \\t).
    """
    if not _named_and_other_keys(prepared):
        return dict(SOUND_JSON_OPTIONS)
    escapes = options.get("json_allowed_escapes")
    escapes = DEFAULT_JSON_ESCAPES if escapes is None else escapes
    return {**SOUND_JSON_OPTIONS, "json_allowed_escapes": escapes.replace("u", "")}


def enforced_options(
    prepared: dict[str, Any], defaults: dict[str, Any], own: bool = True
) -> dict[str, Any]:
    """The ``x-guidance`` options that enforce a prepared schema exactly: ``defaults``, the
    schema's own over them (unless not ``own``), and ``sound_json_options`` over both."""
    options = {**defaults, **(prepared.get("x-guidance", {}) if own else {})}
    return {**options, **sound_json_options(prepared, options)}


def _named_and_other_keys(node: Any) -> bool:
    """Whether some object schema in ``node`` has named keys (``properties`` or
    ``patternProperties``) and allows others (``additionalProperties`` not false)."""
    if isinstance(node, list):
        return any(_named_and_other_keys(item) for item in node)
    if not isinstance(node, dict):
        return False
    named = any(
        isinstance(node.get(k), dict) and node[k] for k in ("properties", "patternProperties")
    )
    if named and node.get("additionalProperties", True) is not False:
        return True
    return any(
        _named_and_other_keys(value) for key, value in node.items() if key not in _DATA_KEYWORDS
    )


def json_schema_to_llguidance(schema: dict[str, Any] | bool, strict: bool = False) -> str:
    """llguidance grammar text for a JSON Schema (draft 2020-12); ConstraintError if not enforceable.

    Whitespace policy: one line, spaced like `json.dumps`: `{"a": 1, "b": [1, 2]}` (separators `, ` and
    `: `, no other whitespace), the JSON models see most in training. A schema may override this
    with llguidance's top-level `"x-guidance"` options (e.g. `{"whitespace_flexible": true}`); the
    options that would over-approximate the schema (`lenient`, `coerce_one_of`) are always forced off,
    and options that would write something other than JSON (a `;` separator, a whitespace pattern
    that may match a letter, an unknown option) are refused (``check_guidance_options``).

    llguidance either enforces a keyword exactly or rejects it, with these exceptions, which are
    handled here so that a compiled schema never accepts an invalid instance:
    - `pattern` / `patternProperties` are ECMA-262 regexes but llguidance reads Rust regexes: `.`,
      `\\s`, `\\S`, `\\d`, `\\w` (and negations) are rewritten to their ECMA meaning, and escapes whose
      meaning differs (`\\A`, `\\z`, ...) are rejected.
    - `format` `date`, `time`, `date-time` and `hostname` are over-approximated by llguidance (Feb 29 of
      any year, leap seconds at any minute, punycode, total length); they are replaced by exact or
      stricter patterns (no leap second, which Pydantic's datetime refuses; hostname labels with
      `--` at positions 3-4, i.e. IDN A-labels, are refused). `email` and `duration` are replaced
      by patterns that Pydantic's EmailStr and timedelta accept too (``email_format``).
    - keys matched by `additionalProperties` / `patternProperties` may repeat in the output, which
      defeats `minProperties` above max(1, number of required keys): rejected.
    - draft-07 / 2019-09 keywords that 2020-12 dropped (`items` as an array, `additionalItems`,
      `dependencies`, `$recursiveRef`) would be ignored silently: rejected.
    - numbers llguidance reads or bounds inexactly (``json_numbers``): floats its JSON parser reads as
      other floats, exclusive bounds past 2**53, and integer-free ranges whose integral exclusive
      bound it lets through: rejected.
    Known departures that are not over-approximations: property order follows `properties`, numbers
    are decimal text (`1.0` is not an integer, `1e2` is refused where bounds apply), strings use raw
    UTF-8 rather than `\\uXXXX` escapes for printable characters, and `format` is an assertion.
    One caveat: bounds are exact on the decimal text, so a number written with more than ~17
    significant digits can round, as a float, onto an exclusive bound (`1.99999999999999999` < 2).
    """
    prepared = prepare_json_schema(schema, strict)
    try:
        return LLMatcher.grammar_from_json_schema(
            prepared, defaults=JSON_OPTIONS, overrides=enforced_options(prepared, JSON_OPTIONS)
        )
    except ValueError as e:
        raise ConstraintError(f"invalid JSON schema: {e}") from e
