"""Lark rules (llguidance dialect) for a closed JSON object whose properties may come in any order.

llguidance's JSON Schema compiler writes an object's properties in the order of `properties`.
JSON Schema does not order them, and a model may write them in another order: the order a
request mentions the values in, for one (the bundled model writes tool-call arguments that way).
`any_order_object_rules` spells such an object out as one Lark rule per set of properties already
written, each property value under its own subschema (`%json`, with the `$defs` it reaches
through `$ref`). That is 2^n rules for n
properties, so it applies to small, closed, flat objects only (`MAX_ANY_ORDER_PROPERTIES`); for
any other schema it returns None and the caller keeps the ordered `%json` rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from brisklm.constrained.json_schema import JSON_OPTIONS
from brisklm.constrained.lark_json import PREPARED_MARK, mark_prepared
from brisklm.constrained.spec import lark_literal

MAX_ANY_ORDER_PROPERTIES = 6
# Top-level keywords that constrain nothing beyond `properties`/`required`/`additionalProperties`.
_PLAIN_OBJECT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "title",
        "description",
        "$defs",
        "definitions",
        "$schema",
        "$comment",
        "examples",
        "default",
        "x-guidance",
        PREPARED_MARK,
    }
)
_DEFINITION_MAPS = ("$defs", "definitions")
# Keywords that would make a property's subschema mean something else once cut out of its document.
_CONTEXT_KEYWORDS = frozenset(
    {"$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"}
)


def _entries(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of every mapping in a JSON document, depth first."""
    if isinstance(node, list):
        for value in node:
            yield from _entries(value)
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield key, value
            yield from _entries(value)


def _refs(node: Any) -> list[str]:
    return [value for key, value in _entries(node) if key == "$ref" and isinstance(value, str)]


def _self_contained(node: Any) -> bool:
    """True when every `$ref` under `node` points into the document's `$defs`/`definitions`,
    so that the node, given those maps, means what it meant in the whole document."""
    return all(
        key not in _CONTEXT_KEYWORDS
        and (
            key != "$ref"
            or (isinstance(value, str) and value.startswith(("#/$defs/", "#/definitions/")))
        )
        for key, value in _entries(node)
    )


def _definitions_used(node: Any, definitions: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of `definitions` ({"$defs": {...}, "definitions": {...}}) that `node` reaches
    through `$ref`, directly or through other definitions; all of them for a ref that names its
    definition with JSON-pointer or percent escapes."""
    used: dict[str, dict[str, Any]] = {}
    pending = _refs(node)
    while pending:
        ref = pending.pop()
        where, _, rest = ref[2:].partition("/")
        name = rest.split("/", 1)[0]
        table = definitions.get(where)
        if not isinstance(table, Mapping) or any(c in name for c in "~%"):
            return dict(definitions)
        if name in used.setdefault(where, {}) or name not in table:
            continue  # a dangling ref stays dangling: llguidance reports it as before
        used[where][name] = table[name]
        pending.extend(_refs(table[name]))
    return {where: found for where, found in used.items() if found}


def any_order_object_rules(rule: str, schema: Mapping[str, Any]) -> list[str] | None:
    """Lark lines defining `rule` as the objects `schema` accepts, properties in any order.

    `schema` must already be prepared for llguidance (``prepare_json_schema``) and carry
    ``JSON_OPTIONS`` in its `x-guidance` (as tool-call schemas do): those options carry over to
    every property value, and the keys and separators the rules write themselves are
    `json.dumps`' (`"key": value, "key": value`). None without those options, or when the schema
    is not a closed (`additionalProperties: false`) object of 2 to ``MAX_ANY_ORDER_PROPERTIES``
    properties with only plain object keywords, or
    when a property's subschema depends on the rest of the document beyond `$defs`.
    """
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        return None
    if not set(schema) <= _PLAIN_OBJECT_KEYWORDS:
        return None
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not 2 <= len(properties) <= MAX_ANY_ORDER_PROPERTIES:
        return None
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(
        isinstance(name, str) and name in properties for name in required
    ):
        return None
    options = schema.get("x-guidance")
    if not isinstance(options, Mapping) or any(
        options.get(k, not v) != v for k, v in JSON_OPTIONS.items()
    ):
        # The rules write json.dumps' separators between the properties; the values must be
        # written alike, which only options that say so explicitly guarantee (llguidance's own
        # defaults differ).
        return None
    definitions = {k: schema[k] for k in _DEFINITION_MAPS if k in schema}
    if not _self_contained(definitions) or not _self_contained(properties):
        return None

    names: list[str] = []
    lines: list[str] = []
    for name, subschema in properties.items():
        if subschema is False:
            continue  # the property can never appear (a required one: no object at all)
        if subschema is True:
            subschema = {}
        if not isinstance(subschema, Mapping) or any(k in subschema for k in _DEFINITION_MAPS):
            return None
        value = mark_prepared(
            {**_definitions_used(subschema, definitions), **subschema, "x-guidance": options}
        )
        lines.append(f"{rule}_v{len(names)}: %json {json.dumps(value, ensure_ascii=False)}")
        names.append(name)
    if len(names) < 2 or any(name not in names for name in required):
        return None
    required_mask = sum(1 << i for i, name in enumerate(names) if name in required)
    full = (1 << len(names)) - 1

    def key(i: int) -> str:
        return json.dumps(names[i], ensure_ascii=False) + ": "

    def after(mask: int) -> str:
        """The reference that continues from `mask` (nothing when no property can follow)."""
        return "" if mask == full else f" {rule}_s{mask}"

    for mask in range(full):  # the state after writing the properties in `mask`
        lead = ", " if mask else ""
        alternatives = [
            f"{lark_literal(lead + key(i))} {rule}_v{i}{after(mask | 1 << i)}"
            for i in range(len(names))
            if not mask & 1 << i
        ]
        body = " | ".join(alternatives)
        closable = mask & required_mask == required_mask
        lines.append(f"{rule}_s{mask}: ({body})" + ("?" if closable else ""))
    lines.insert(0, f'{rule}: "{{" {rule}_s0 "}}"')
    return lines
