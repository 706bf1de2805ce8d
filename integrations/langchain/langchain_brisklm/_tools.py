"""Tool binding for ChatBrisk: tool schemas, tool_choice, and tool-call chunks for streaming."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.messages.tool import (
    InvalidToolCall,
    invalid_tool_call,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.json import parse_partial_json
from pydantic import BaseModel

from brisklm.tool_call_chunks import CallChunk, ToolCallChunker, call_chunk
from brisklm.tool_calls import (
    ToolChoiceMode,
    check_tool_schema,
)
from brisklm.tool_formats import ToolCallFormat

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool
ToolChoice = str | dict[str, Any] | bool | None

_CHOICE_ALIASES: dict[str, ToolChoiceMode] = {
    "auto": "auto",
    "any": "required",
    "required": "required",
    "none": "none",
}


_TOOL_FORMS = (
    "a pydantic class, a function, a LangChain tool, an OpenAI tool dict "
    '{"type": "function", "function": {"name": ..., "parameters": {...}}}, an OpenAI function '
    'dict {"name": ..., "parameters": {...}}, an Anthropic tool dict {"name": ..., '
    '"input_schema": {...}} or a JSON Schema dict with a "title" (the tool\'s name)'
)
# Dict keys that mark a tool dict rather than a bare JSON Schema.
_TOOL_DICT_KEYS = frozenset({"function", "parameters", "input_schema", "name"})
_CHOICE_FORMS = (
    "use 'auto', 'any'/'required', 'none', True/False, a bound tool's name, "
    '{"type": "function", "function": {"name": ...}} or {"type": "tool", "name": ...}'
)


def format_tools(tools: Iterable[ToolLike] | None) -> list[dict[str, Any]]:
    """OpenAI-style tool dicts for pydantic classes, functions, LangChain tools and dicts.

    A tool given twice, in the same form or in two (a pydantic class and its JSON Schema), is kept
    once: the first. Raises TypeError when `tools` is not a list, and ValueError for a tool that
    cannot be converted, one without a non-empty string name, one whose parameters are not an
    object schema, and two tools of the same name whose arguments' schemas differ.
    """
    if tools is None:
        return []
    # A LangChain tool or other pydantic object is iterable (over its fields): one tool given
    # without its list was read as a list of (field, value) pairs, none of them a tool.
    if isinstance(tools, (str, bytes, dict, BaseModel)) or not isinstance(tools, Iterable):
        got = f"the class {tools.__name__}" if isinstance(tools, type) else type(tools).__name__
        one = " (put a single tool in a list: [tool])" if _is_one_tool(tools) else ""
        raise TypeError(f"tools must be a list of tools ({_TOOL_FORMS}), got {got}{one}")
    formatted: list[dict[str, Any]] = []
    seen: dict[str, tuple[int, Any]] = {}  # name -> (position, what its calls accept)
    for position, tool in enumerate(tools):
        converted = _format_tool(tool, position)
        function = converted["function"]
        name = function["name"]
        accepts = _validation_part(function.get("parameters") or {})
        if name in seen:
            first, first_accepts = seen[name]
            if accepts == first_accepts:
                continue  # the same tool again
            raise ValueError(
                f"tools[{position}] and tools[{first}] are both named {name!r} with different "
                "schemas: tool names must be unique (a call of that name could follow either "
                "schema)"
            )
        seen[name] = (position, accepts)
        formatted.append(converted)
    return formatted


def _is_one_tool(tools: Any) -> bool:
    """Whether ``tools`` is a single tool rather than a list of them."""
    return (
        isinstance(tools, (BaseTool, dict))
        or (isinstance(tools, type) and issubclass(tools, BaseModel))
        or callable(tools)
    )


# JSON Schema annotations: they describe instances but do not change which are valid.
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_DATA_KEYWORDS = frozenset({"enum", "const", "dependentRequired", "required", "x-guidance"})


def _schema_without(schema: Any, drop: Callable[[str, Any], bool]) -> Any:
    """A JSON Schema without the keywords ``drop(key, value)`` picks, at every level; property
    names, enums, constants and other data are left as they are."""
    if isinstance(schema, list):
        return [_schema_without(item, drop) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if drop(key, value):
            continue
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _schema_without(sub, drop) for name, sub in value.items()}
        else:
            out[key] = _schema_without(value, drop)
    return out


def _validation_part(schema: Any) -> Any:
    """A JSON Schema without its annotations: two schemas equal under this accept the same values."""
    return _schema_without(schema, lambda key, _: key in _ANNOTATIONS)


def without_unique_items(schema: Any) -> Any:
    """A pydantic model's JSON Schema without ``uniqueItems: true`` (a ``set`` field's), which the
    grammar cannot enforce: the array is decoded as a list, and pydantic's validation, which the
    caller's model applies to the result (a tool's arguments, a structured reply), makes it the
    set."""
    return _schema_without(schema, lambda key, value: key == "uniqueItems" and value is True)


def _recursive_model_schema(tool: Any) -> dict[str, Any] | None:
    """The arguments schema (``model_json_schema()``, $defs kept) of a pydantic class, or of a
    LangChain tool's pydantic arguments, whose definitions refer to themselves; None otherwise."""
    model = tool.tool_call_schema if isinstance(tool, BaseTool) else tool
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    schema = dict(model.model_json_schema())
    definitions = schema.get("$defs") or {}
    refers = {name: _local_refs(body) for name, body in definitions.items()}

    done: set[str] = set()

    def cycle_from(name: str, path: set[str]) -> bool:  # depth first, each name once
        if name in path:
            return True
        if name in done:
            return False
        path.add(name)
        if any(cycle_from(n, path) for n in refers.get(name, ())):
            return True
        path.discard(name)
        done.add(name)
        return False

    if not any(cycle_from(name, set()) for name in refers):
        return None
    schema.pop("title", None)
    schema.pop("description", None)
    return schema


def _local_refs(schema: Any) -> set[str]:
    """The names of the ``#/$defs/NAME`` definitions a schema refers to (at any depth)."""
    if isinstance(schema, list):
        return set().union(*(_local_refs(item) for item in schema))
    if not isinstance(schema, dict):
        return set()
    found = set().union(*(_local_refs(value) for value in schema.values()))
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found.add(ref.removeprefix("#/$defs/"))
    return found


def response_format_as_function(schema: Any) -> Any:
    """OpenAI's json_schema response format, ``{"type": "json_schema", "json_schema": {...}}`` or
    its entry ``{"name": ..., "schema": {...}, "strict": ...}`` (what ChatOpenAI's
    with_structured_output takes), as a function dict whose parameters are that schema; any other
    value as it is. (LangChain reads the entry as a function dict with no parameters: a tool of no
    arguments, and any JSON for a json_schema answer.)"""
    if (
        isinstance(schema, dict)
        and schema.get("type") == "json_schema"
        and isinstance(schema.get("json_schema"), dict)
    ):
        schema = schema["json_schema"]
    if (
        isinstance(schema, dict)
        and {"name", "schema"} <= schema.keys()
        and not (schema.keys() & {"function", "parameters", "input_schema"})
    ):
        function = {"name": schema["name"], "parameters": schema["schema"]}
        if "description" in schema:
            function["description"] = schema["description"]
        return function
    return schema


def is_bare_json_schema(tool: Any) -> bool:
    """Whether a tool or schema is a JSON Schema dict rather than an OpenAI/Anthropic tool dict."""
    return (
        isinstance(tool, dict)
        and tool.get("type") != "function"
        and not (tool.keys() & _TOOL_DICT_KEYS)
    )


def _format_tool(tool: Any, position: int) -> dict[str, Any]:
    where = f"tools[{position}]"
    tool = response_format_as_function(tool)
    if is_bare_json_schema(tool):
        # A bare JSON Schema: langchain keeps only its properties, so another type would be lost.
        kind = tool.get("type", "object")
        if kind != "object":
            raise ValueError(
                f"{where} is a JSON Schema of type {kind!r}; a tool's schema (its arguments) "
                "must be an object schema"
            )
    try:
        converted = convert_to_openai_tool(tool)
    except Exception as e:  # langchain raises ValueError, TypeError, KeyError... for odd input
        raise ValueError(
            f"{where} cannot be used as a tool ({type(e).__name__}: {' '.join(str(e).split())}); "
            f"a tool is {_TOOL_FORMS}"
        ) from e
    function = converted.get("function") if isinstance(converted, dict) else None
    if not isinstance(function, dict):
        raise ValueError(f"{where} is not a tool: {tool!r}; a tool is {_TOOL_FORMS}")
    recursive = _recursive_model_schema(tool)
    if recursive is not None:
        # langchain inlines $defs and cuts a cycle with {} (any value): the grammar would let
        # through arguments the model rejects. Its own schema, with its $defs, keeps the cycle.
        function["parameters"] = recursive
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"{where} needs a non-empty string name, got {name!r}: {tool!r}"
            if name is not None
            else f"{where} has no name: {tool!r}; a tool needs a non-empty string name"
        )
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise ValueError(
                f"the parameters of {where} ({name!r}) must be a JSON Schema object, "
                f"got {type(parameters).__name__}"
            )
        if parameters.get("type", "object") != "object":
            raise ValueError(
                f"the parameters of {where} ({name!r}) must be an object schema, "
                f"got type {parameters['type']!r}"
            )
        if not isinstance(tool, dict):  # a pydantic class, function or tool: pydantic validates
            function["parameters"] = without_unique_items(parameters)
    try:  # here, where the tool is given, rather than when a call compiles its grammar
        check_tool_schema(converted)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    return converted


def normalize_tool_choice(tool_choice: ToolChoice, tool_names: Sequence[str]) -> str:
    """ "auto", "required", "none", or the name of the one tool to call.

    Accepts LangChain's spellings: None/"auto", "any"/"required"/True, "none"/False, a tool name,
    and the dict forms `{"type": "function", "function": {"name": ...}}` (OpenAI) and
    `{"type": "tool", "name": ...}` / `{"type": "any" | "auto" | "none"}` (Anthropic).
    """
    if tool_choice is None or tool_choice is True or tool_choice is False:
        choice: str = {None: "auto", True: "required", False: "none"}[tool_choice]
    elif isinstance(tool_choice, str):
        choice = tool_choice
    elif isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            choice = function["name"]
        elif isinstance(tool_choice.get("name"), str):
            choice = tool_choice["name"]
        elif tool_choice.get("type") in _CHOICE_ALIASES:
            choice = tool_choice["type"]
        else:
            raise ValueError(f"unrecognised tool_choice {tool_choice!r}; {_CHOICE_FORMS}")
    else:
        raise ValueError(f"unrecognised tool_choice {tool_choice!r}; {_CHOICE_FORMS}")
    if choice in _CHOICE_ALIASES:
        choice = _CHOICE_ALIASES[choice]
        if choice == "required" and not tool_names:
            raise _needs_tools(tool_choice)
        return choice
    if not tool_names:
        raise _needs_tools(tool_choice)
    if choice not in tool_names:
        raise ValueError(
            f"tool_choice names the tool {choice!r}, which is not bound; bound tools: "
            f"{', '.join(tool_names) or 'none'} (or use 'auto', 'any'/'required', 'none')"
        )
    return choice


def _needs_tools(tool_choice: ToolChoice) -> ValueError:
    return ValueError(
        f"tool_choice={tool_choice!r} needs at least one tool, and none is bound: pass tools "
        "(bind_tools or tools=), or use tool_choice 'auto' or 'none'"
    )


def cut_call_error(
    finish_reason: str | None,
    stop_reason: str | int | None,
    context: int | None = None,
) -> str:
    """What ended a reply inside a tool call, for the cut call's error; ``context``: the
    engine's max_seq_len when the context, not max_tokens, ended a reply of finish reason
    "length" (what to raise differs)."""
    if finish_reason == "length" and context is not None:
        return (
            f"the reply ended inside this tool call: the context of {context} tokens was full "
            "(raise max_seq_len or shorten the conversation)"
        )
    if finish_reason == "length":
        return "the reply ended inside this tool call (max_tokens reached)"
    if isinstance(stop_reason, str):
        return f"the stop sequence {stop_reason!r} ended the reply inside this tool call"
    if stop_reason is not None:
        return f"the stop token id {stop_reason} ended the reply inside this tool call"
    return f"the reply ended inside this tool call (finish reason {finish_reason!r})"


# A JSON call's name, once its string is closed, and the start of its arguments (Hermes and
# Mistral v0.3 write "arguments", Llama 3 "parameters").
_JSON_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_JSON_ARGUMENTS = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)')
# A Mistral v11+ call's name, once what follows it shows it complete, and its arguments' start.
_V11_NAME = re.compile(r"\s*([^\s\[\]{}\"]+)\s*(?=\[CALL_ID\]|\[ARGS\]|\{)")
_V11_ARGUMENTS = re.compile(r"(?:\[CALL_ID\]\s*[A-Za-z0-9]+\s*)?(?:\[ARGS\]\s*)?(?=\{)")


# Ends after which LangChain's partial-JSON merge reads no arguments: a bracket that closes
# nothing open (after a quote ending an open string, and an escape's letter after a lone
# backslash). One of them fits every prefix of an arguments object.
_UNREADABLE_ENDS = ("]", "}", '"]', '"}', 'n"]', 'n"}')


def unreadable_end(arguments: str) -> str:
    """What a stream appends to a cut call's arguments (its JSON so far) so that the merged chunks
    make it an invalid tool call: LangChain parses a merged call's arguments as partial JSON,
    which closes open strings and brackets, so the arguments so far made a valid call (an agent
    ran the tool with a value cut short, or a required one missing)."""
    for end in _UNREADABLE_ENDS:
        try:
            read = parse_partial_json(arguments + end)
        except Exception:  # what LangChain's merge catches, the call then invalid
            return end
        if not isinstance(read, dict):
            return end
    raise AssertionError(f"no end leaves {arguments!r} unreadable")  # not reached for a prefix


def cut_call_chunks(chunker: ToolCallChunker) -> list[CallChunk]:
    """After the chunker's ``finish``, a chunk for each call the reply ended inside that has sent
    its arguments so far: the rest of them, ending unreadable, so that LangChain's merge makes
    the call an invalid tool call, as in invoke's message (it read the arguments so far as a
    call)."""
    return [
        call_chunk(args=args[sent:] + unreadable_end(args), index=index)
        for index, args, sent in chunker.cut_arguments()
    ]


def cut_call(text: str, error: str, call_id: str) -> InvalidToolCall:
    """A call the reply ended inside, from its text in any format, as an invalid tool call: its
    name once written whole, and its arguments so far once begun ("" when the name was whole and
    the arguments not yet begun); all of its text while even the name was not whole."""
    name: str | None = None
    args = text
    json_name = _JSON_NAME.match(text)
    if json_name is not None:
        name = json.loads(json_name.group(1))
        arguments = _JSON_ARGUMENTS.match(text, json_name.end())
        args = text[arguments.end() :] if arguments else ""
    elif (v11_name := _V11_NAME.match(text)) is not None:
        name = v11_name.group(1)
        arguments = _V11_ARGUMENTS.match(text, v11_name.end())
        args = text[arguments.end() :] if arguments else ""
    return invalid_tool_call(name=name, args=args, id=call_id, error=error)


def parse_reply(
    text: str, tool_format: ToolCallFormat, error: str, was_cut: bool = True
) -> tuple[str, list[Any], list[InvalidToolCall]]:
    """A reply's content, tool calls and cut call in its format, decoded under the tools'
    grammar, as ``LLM.chat_output`` and the server read it (``ToolCallFormat.read_reply``): the
    calls complete before a cut are calls, and the call it ended inside an invalid call whose
    error is ``error`` (what cut it). ``was_cut``: max_tokens, a stop string or a stop token
    ended the reply (False: eos)."""
    content, calls, cut, _ = tool_format.read_reply(text, was_cut, under_grammar=True)
    invalid = [] if cut is None else [cut_call(cut, error, tool_format.new_id())]
    return content, calls, invalid
