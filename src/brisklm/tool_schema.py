"""JSON schemas for tools given as Python functions (as transformers' get_json_schema) or pydantic models."""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

_DESCRIPTION_RE = re.compile(r"^(.*?)[\n\s]*(Args:|Returns:|Raises:|\Z)", re.DOTALL)
_ARGS_RE = re.compile(r"\n\s*Args:\n(.*?)[\n\s]*(Returns:|Raises:|\Z)", re.DOTALL)
_ARGS_SPLIT_RE = re.compile(
    r"""
(?:^|\n)  # start of the args block, or a newline
([ \t]*)(\w+)(?:[ \t]*\([^()\n]*\))?:\s*  # indentation and argument name, skipping a "(type)"
(.*?)\s*  # the description, possibly over several lines
(?=\n(?!\1[ \t])[ \t]*\w+(?:[ \t]*\([^()\n]*\))?:|\Z)  # up to the next "name:" at the same depth, or the end
""",
    re.DOTALL | re.VERBOSE,
)
_RETURNS_RE = re.compile(r"\n\s*Returns:\n\s*(.*?)[\n\s]*(Raises:|\Z)", re.DOTALL)
_JSON_SCALAR_TYPES = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    type(None): "null",
}
_BASIC_TYPES: dict[Any, dict[str, Any]] = {
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    list: {"type": "array"},
    tuple: {"type": "array"},
    dict: {"type": "object"},
    Any: {},
}


class ToolSchemaError(ValueError):
    """A tool cannot be turned into a JSON schema (missing docstring, type hint or description)."""


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    value_types = list(dict.fromkeys(_JSON_SCALAR_TYPES[type(value)] for value in values))
    return {"type": value_types[0] if len(value_types) == 1 else value_types, "enum": values}


def _type_hint_schema(hint: Any) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin is None and isinstance(hint, type) and issubclass(hint, Enum):
        values = [member.value for member in hint]
        if not values or any(type(value) not in _JSON_SCALAR_TYPES for value in values):
            raise ToolSchemaError(f"the Enum {hint.__name__} needs members with JSON scalar values")
        return _enum_schema(values)
    if origin is None:
        if hint not in _BASIC_TYPES:
            raise ToolSchemaError(
                f"cannot convert the type hint {hint!r} to a JSON schema; use basic types, Enum, Literal, "
                "and list/tuple/dict/Union of those, or pass a JSON schema dict for the tool"
            )
        return dict(_BASIC_TYPES[hint])
    if origin is Union or origin is types.UnionType:
        subtypes = [_type_hint_schema(t) for t in args if t is not type(None)]
        if len(subtypes) == 1:
            schema = subtypes[0]
        elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in subtypes):
            names = sorted({s["type"] for s in subtypes})
            schema = {"type": names[0] if len(names) == 1 else names}
        else:
            schema = {"anyOf": subtypes}
        if type(None) in args:
            schema["nullable"] = True
        return schema
    if origin is Literal and args:
        if any(type(arg) not in _JSON_SCALAR_TYPES for arg in args):
            raise ToolSchemaError("typing.Literal values must be JSON scalars")
        return _enum_schema(list(args))
    if origin is list:
        return {"type": "array", "items": _type_hint_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise ToolSchemaError(
                f"use list[...] instead of {hint}: single-element and variadic tuples are not converted"
            )
        return {"type": "array", "prefixItems": [_type_hint_schema(t) for t in args]}
    if origin is dict:
        schema = {"type": "object"}
        if len(args) == 2:
            schema["additionalProperties"] = _type_hint_schema(args[1])
        return schema
    raise ToolSchemaError(f"cannot convert the type hint {hint!r} to a JSON schema")


def _parameters_schema(func: Callable[..., Any]) -> dict[str, Any]:
    type_hints = get_type_hints(func)
    signature = inspect.signature(func)
    name = getattr(func, "__name__", "operation")
    first = next(iter(signature.parameters), None)
    # An unannotated leading self/cls is the receiver of a method, not a tool argument
    implicit = (
        first
        if first in {"self", "cls"}
        and signature.parameters[first].annotation is inspect.Parameter.empty
        else None
    )
    required = []
    for param_name, param in signature.parameters.items():
        if param_name == implicit:
            continue
        if param.annotation is inspect.Parameter.empty:
            raise ToolSchemaError(f"argument {param_name} of {name} has no type hint")
        if param.default is inspect.Parameter.empty:
            required.append(param_name)
    properties: dict[str, Any] = {}
    for param_name, hint in type_hints.items():
        if param_name == implicit:
            continue
        if param_name == "return":
            # The model never writes the return value, so an unconvertible return hint is left out
            try:
                properties[param_name] = _type_hint_schema(hint)
            except ToolSchemaError:
                pass
        else:
            properties[param_name] = _type_hint_schema(hint)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _parse_google_docstring(docstring: str) -> tuple[str | None, dict[str, str], str | None]:
    description = _DESCRIPTION_RE.search(docstring)
    args_block = _ARGS_RE.search(docstring)
    returns = _RETURNS_RE.search(docstring)
    arg_descriptions: dict[str, str] = {}
    if args_block is not None:
        lines = "\n".join(line for line in args_block.group(1).split("\n") if line.strip())
        for match in _ARGS_SPLIT_RE.findall(lines):
            arg_descriptions[match[1]] = re.sub(r"\s*\n+\s*", " ", match[2].strip())
    return (
        description.group(1).strip() if description else None,
        arg_descriptions,
        returns.group(1).strip() if returns else None,
    )


def function_json_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The tool schema of a function with type hints and a Google-style docstring.

    Same output as transformers' `get_json_schema`: {"type": "function", "function": {"name",
    "description", "parameters"[, "return"]}}, argument descriptions from the Args: block, and
    "(choices: [...])" at the end of a description turned into an enum.
    """
    name = getattr(func, "__name__", "operation")
    doc = inspect.getdoc(func)
    if not doc:
        raise ToolSchemaError(f"cannot build a JSON schema for {name}: it has no docstring")
    main_doc, arg_descriptions, return_doc = _parse_google_docstring(doc.strip())
    parameters = _parameters_schema(func)
    return_schema = parameters["properties"].pop("return", None)
    if return_schema is not None and return_doc is not None:
        return_schema["description"] = return_doc
    for arg, schema in parameters["properties"].items():
        if arg not in arg_descriptions:
            raise ToolSchemaError(
                f"cannot build a JSON schema for {name}: no docstring description for '{arg}'"
            )
        description = arg_descriptions[arg]
        choices = re.search(r"\(choices:\s*(.*?)\)\s*$", description, flags=re.IGNORECASE)
        if choices:
            schema["enum"] = [
                c.strip() if isinstance(c, str) else c for c in json.loads(choices.group(1))
            ]
            description = description[: choices.start()].strip()
        schema["description"] = description
    function: dict[str, Any] = {"name": name, "description": main_doc, "parameters": parameters}
    if return_schema is not None:
        function["return"] = return_schema
    return {"type": "function", "function": function}


def pydantic_json_schema(model: type) -> dict[str, Any]:
    """The tool schema of a pydantic model class: its name, docstring and model_json_schema() parameters."""
    parameters = dict(model.model_json_schema())  # type: ignore[attr-defined]
    parameters.pop("title", None)
    # pydantic's schema holds the class's own docstring; inspect.getdoc would fall back to the
    # parents' (pydantic's 2,284-character BaseModel docstring for a class without one).
    description = parameters.pop("description", None) or ""
    return {
        "type": "function",
        "function": {"name": model.__name__, "description": description, "parameters": parameters},
    }


def check_tools_list(tools: Any) -> None:
    """ValueError unless ``tools`` is a list (or other sequence) of tool definitions; a dict, str
    or None would be iterated as something else (a dict by its keys)."""
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence):
        raise ValueError(
            "tools must be a list of tool definitions (OpenAI-style dicts, functions or "
            f"pydantic classes), got {type(tools).__name__}"
        )


def tool_json_schema(tool: Any) -> dict[str, Any]:
    """A tool as the chat template sees it: dicts unchanged, functions and pydantic models converted."""
    if isinstance(tool, dict):
        return tool
    if isinstance(tool, type) and callable(getattr(tool, "model_json_schema", None)):
        return pydantic_json_schema(tool)
    if inspect.isfunction(tool) or inspect.ismethod(tool):
        return function_json_schema(tool)
    raise ValueError(
        "tools must be JSON schema dicts, functions with type hints and a Google-style docstring, "
        f"or pydantic model classes; got {tool!r}"
    )
