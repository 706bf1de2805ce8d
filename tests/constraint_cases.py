"""JSON Schemas and pydantic models shared by the constrained-decoding tests (bounded so that even a
random model terminates)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

SCHEMAS: dict[str, dict[str, Any]] = {
    "types": {
        "type": "object",
        "properties": {
            "s": {"type": "string", "maxLength": 6},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "z": {"type": "null"},
            "u": {"type": ["string", "null"], "maxLength": 3},
        },
        "required": ["s", "i", "n", "b", "z", "u"],
        "additionalProperties": False,
    },
    "enum_const": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", 3, None, [1, 2]]},
            "version": {"const": {"major": 1, "tags": ["x"]}},
        },
        "required": ["color", "version"],
    },
    "nested_optional": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "owner": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 5},
                    "age": {"type": "integer"},
                },
                "required": ["name"],
                "additionalProperties": False,
            },
            "note": {"type": "string", "maxLength": 4},
        },
        "required": ["id", "owner"],
        "additionalProperties": False,
    },
    "array_bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 2,
        "maxItems": 4,
    },
    "prefix_items": {
        "type": "array",
        "prefixItems": [{"type": "boolean"}, {"const": "x"}],
        "items": False,
    },
    "any_of": {"anyOf": [{"type": "integer", "maximum": 0}, {"type": "string", "maxLength": 3}]},
    "one_of": {
        "oneOf": [
            {"type": "integer"},
            {"type": "array", "maxItems": 2, "items": {"type": "boolean"}},
        ]
    },
    "all_of": {"allOf": [{"type": "integer", "minimum": 10}, {"maximum": 20}, {"multipleOf": 3}]},
    "ref_defs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer", "minimum": 0, "maximum": 9},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1},
                },
                "required": ["v"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "pattern_formats": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "day": {"type": "string", "format": "date"},
            "mail": {"type": "string", "format": "email", "maxLength": 20},
            "id": {"type": "string", "format": "uuid"},
            "at": {"type": "string", "format": "date-time"},
            "host": {"type": "string", "format": "hostname", "maxLength": 12},
        },
        "required": ["code", "day", "mail", "id", "at", "host"],
        "additionalProperties": False,
    },
    "numeric_bounds": {
        "type": "array",
        "prefixItems": [
            {"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25},
            {"type": "integer", "exclusiveMinimum": 10, "maximum": 20},
            {"type": "integer", "multipleOf": 7},
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        ],
        "minItems": 4,
        "items": False,
    },
    "map": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    "string_lengths": {"type": "string", "minLength": 2, "maxLength": 4},
}


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    city: str = Field(max_length=6)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=8)
    age: int = Field(ge=0, le=130)
    role: Literal["admin", "user"]
    favourite: Color
    address: Address
    previous: list[Address] = Field(max_length=2)
    tags: list[str] = Field(default_factory=list, max_length=2)
    nickname: Optional[str] = Field(default=None, max_length=4)  # noqa: UP045 - testing Optional
    score: float | None = None


class Team(BaseModel):
    lead: Person
    size: int = Field(ge=1, le=9)
