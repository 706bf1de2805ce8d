"""Tool calls, and the Hermes / Qwen2.5 chat format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The other families' formats (Llama 3 JSON, Mistral) build on these pieces in ``brisklm.tool_formats``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llguidance import LLMatcher

from brisklm.constrained.any_order import any_order_object_rules
from brisklm.constrained.compiler import check_json_schema_grammar
from brisklm.constrained.errors import ConstraintError
from brisklm.constrained.json_schema import (
    JSON_OPTIONS,
    SCHEMA_TOO_DEEP,
    enforced_options,
    nullable_as_json_schema,
    prepare_json_schema,
)
from brisklm.constrained.lark_json import mark_prepared
from brisklm.constrained.spec import lark_literal
from brisklm.tool_call_ids import new_tool_call_id
from brisklm.tool_schema import tool_json_schema

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
# Separators of json.dumps' defaults, as chat templates (`tojson`) write the calls in the history.
ToolChoiceMode = Literal["auto", "required", "none"]


@dataclass
class ToolCall:
    """One call the assistant asked for: the function name, its JSON arguments and a unique id."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_tool_call_id)

    def to_message_dict(self) -> dict[str, Any]:
        """The call as chat templates read it in an assistant message's ``tool_calls``: the
        OpenAI shape, ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def parse_tool_call_body(body: str) -> ToolCall | None:
    """The call written between the tags, or None unless it is a JSON object with a string "name".

    "arguments" may be missing (no arguments), an object, or a string holding a JSON object; some models
    write "parameters" instead.
    """
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    return tool_call_from_json(data)


def unclosed_block_call(body: str) -> ToolCall | None:
    """The call of a last block that no end tag closes: its body's, or, for a reply that ended
    inside the end tag (``...}}\n</tool_call``), the body's without that partial tag."""
    call = parse_tool_call_body(body)
    if call is None and (whole := without_partial_end_tag(body)) is not None:
        call = parse_tool_call_body(whole)
    return call


def without_partial_end_tag(body: str) -> str | None:
    """``body`` without the start of an end tag it ends in, or None if it ends in none (a
    reply cut inside the tag ends right there: nothing follows a partial tag, blanks included)."""
    cut = partial_tag_length(body, TOOL_CALL_END)
    return body[: len(body) - cut] if cut else None


def tool_call_from_json(data: Any) -> ToolCall | None:
    """A decoded JSON value as a call (see ``parse_tool_call_body``), or None."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name=data["name"], arguments=arguments)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split an assistant message into its content and its tool calls, in order.

    Blocks run from TOOL_CALL_START to the next TOOL_CALL_END outside the call's JSON strings; a
    final block the model left unclosed counts if its body parses. Blocks that do not parse stay in
    the content verbatim, tags included. A block with an unclosed string (malformed JSON) that
    another block follows ends at its first end tag (``block_end``), so the calls after it count.
    The content is the text outside the parsed blocks with surrounding whitespace stripped.
    """
    content: list[str] = []
    calls: list[ToolCall] = []
    position = 0
    for start, body_start, end in _blocks(text):
        content.append(text[position:start])
        block_end_at = len(text) if end < 0 else end + len(TOOL_CALL_END)
        if end < 0:
            call = unclosed_block_call(text[body_start:])
        else:
            call = parse_tool_call_body(text[body_start:end])
        if call is None:
            content.append(text[start:block_end_at])
        else:
            calls.append(call)
        position = block_end_at
    content.append(text[position:])
    return "".join(content).strip(), calls


def _blocks(text: str) -> Iterator[tuple[int, int, int]]:
    """The tool-call blocks of a reply, in order: (start tag, body start, end tag or -1 for a last
    block left unclosed)."""
    position = 0
    while (start := text.find(TOOL_CALL_START, position)) >= 0:
        body_start = start + len(TOOL_CALL_START)
        end = block_end(text, body_start)
        yield start, body_start, end
        if end < 0:
            return
        position = end + len(TOOL_CALL_END)


def block_end(text: str, body_start: int) -> int:
    """Where the tool-call block whose body starts at ``body_start`` ends (its end tag), or -1.

    The first end tag outside the call's JSON strings, where the arguments may hold the tag. When
    there is none and the rest does not parse, a string was left open (malformed JSON, or a call
    cut inside a string): if a call follows the first end tag, the model closed this block there
    (so that the calls after it count); otherwise the block runs on, a call cut inside a string
    that holds the tags (as a grammar's strings may: ``"a</tool_call> <tool_call> {"`` then the
    cut).
    """
    end = find_unquoted(text, TOOL_CALL_END, body_start)
    if end >= 0:
        return end
    plain = text.find(TOOL_CALL_END, body_start)
    if plain < 0 or parse_tool_call_body(text[body_start:]) is not None:
        return -1
    return plain if parse_tool_calls(text[plain + len(TOOL_CALL_END) :])[1] else -1


def unclosed_block_start(text: str) -> int:
    """Where the reply's last tool-call block starts if no end tag closes it, else -1; blocks are
    read as ``parse_tool_calls`` reads them (a tag inside a call's JSON strings is text)."""
    return next((start for start, _, end in _blocks(text) if end < 0), -1)


def turn_finish_reason(finish_reason: str | None, has_calls: bool, cut: bool) -> str | None:
    """OpenAI's convention: a turn that ended after calling tools finishes with "tool_calls"; one
    that a stop ended inside a call (``cut``) keeps "stop", so that the cut is seen."""
    return "tool_calls" if has_calls and finish_reason == "stop" and not cut else finish_reason


@dataclass(frozen=True)
class ContentDelta:
    """New plain text of the message."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """Raw text inside the tool-call block `index` (provisional: a block that fails to parse turns into content)."""

    index: int
    text: str


@dataclass(frozen=True)
class ToolCallComplete:
    """A tool-call block closed and parsed; `index` counts parsed calls from 0."""

    index: int
    call: ToolCall


ToolCallEvent = ContentDelta | ToolCallDelta | ToolCallComplete


def json_string_state(text: str, in_string: bool, escaped: bool) -> tuple[bool, bool]:
    """Whether a JSON string is open (and a backslash pending) after ``text``, from a state."""
    for char in text:
        if not in_string:
            in_string = char == '"'
        elif escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            in_string = False
    return in_string, escaped


def find_unquoted(
    text: str, tag: str, start: int = 0, in_string: bool = False, escaped: bool = False
) -> int:
    """The first ``tag`` in ``text[start:]`` outside JSON strings (-1 if none): a call's
    arguments may hold "</tool_call>", which the grammar allows and which does not end the block."""
    position = start
    while True:
        found = text.find(tag, position)
        if found < 0:
            return -1
        in_string, escaped = json_string_state(text[position:found], in_string, escaped)
        if not in_string:
            return found
        in_string, escaped = json_string_state(tag[:1], in_string, escaped)
        position = found + 1


def partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could be the start of `tag` (0 if none)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class ToolCallStreamParser:
    """Incremental `parse_tool_calls`: feed text deltas, get content and tool-call events.

    Text that may be the start of a tag is held back until the next delta decides it, and so is
    whitespace at the end of the content (the batch parser strips it). After `finish()`, the
    ContentDelta texts joined equal the batch content and the ToolCallComplete calls equal its calls.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._in_block = False
        self._block = ""
        self._string_state = (False, False)  # (in a JSON string, after a backslash) in the block
        self._num_calls = 0
        self._content_started = False
        self._pending_whitespace = ""

    @property
    def num_calls(self) -> int:
        """Tool calls completed so far."""
        return self._num_calls

    def feed(self, delta: str) -> list[ToolCallEvent]:
        """Take the next piece of generated text and return the events it settles."""
        events: list[ToolCallEvent] = []
        self._buffer += delta
        while True:
            tag = TOOL_CALL_END if self._in_block else TOOL_CALL_START
            if self._in_block:
                found = find_unquoted(self._buffer, tag, 0, *self._string_state)
            else:
                found = self._buffer.find(tag)
            if found < 0:
                settled = len(self._buffer) - partial_tag_length(self._buffer, tag)
                self._take(self._buffer[:settled], events)
                self._buffer = self._buffer[settled:]
                return events
            self._take(self._buffer[:found], events)
            self._buffer = self._buffer[found + len(tag) :]
            if self._in_block:
                self._close_block(events, closed=True)
            else:
                self._in_block, self._block = True, ""
                self._string_state = (False, False)

    def finish(self) -> list[ToolCallEvent]:
        """End of generation: settle held-back text and an unclosed final block."""
        events: list[ToolCallEvent] = []
        if self._in_block:
            # Held back as a possible end tag: the reply ended inside the end tag of a call that
            # is whole without it (as ``unclosed_block_call`` reads it).
            held = self._block + self._buffer
            whole = without_partial_end_tag(held)
            if (
                whole is not None
                and len(whole) >= len(self._block)
                and parse_tool_call_body(held) is None
                and parse_tool_call_body(whole) is not None
            ):
                self._buffer = whole[len(self._block) :]
        self._take(self._buffer, events)
        self._buffer = ""
        if self._in_block:
            end = block_end(self._block, 0)
            if end < 0:
                self._close_block(events, closed=False)
            else:  # an open string: the block ended at its first end tag (see block_end)
                rest = self._block[end + len(TOOL_CALL_END) :]
                self._block = self._block[:end]
                self._close_block(events, closed=True)
                events += self.feed(rest)
                return events + self.finish()
        self._pending_whitespace = ""  # trailing whitespace of the content is stripped
        return events

    def _take(self, text: str, events: list[ToolCallEvent]) -> None:
        if not text:
            return
        if self._in_block:
            self._block += text
            self._string_state = json_string_state(text, *self._string_state)
            events.append(ToolCallDelta(self._num_calls, text))
        else:
            self._content(text, events)

    def _close_block(self, events: list[ToolCallEvent], closed: bool) -> None:
        self._in_block = False
        call = parse_tool_call_body(self._block)
        if call is not None:
            events.append(ToolCallComplete(self._num_calls, call))
            self._num_calls += 1
        else:
            self._content(TOOL_CALL_START + self._block + (TOOL_CALL_END if closed else ""), events)

    def _content(self, text: str, events: list[ToolCallEvent]) -> None:
        if not self._content_started:
            text = text.lstrip()
            if not text:
                return
        body = text.rstrip()
        if not body:
            self._pending_whitespace += text
            return
        events.append(ContentDelta(self._pending_whitespace + body))
        self._pending_whitespace = text[len(body) :]
        self._content_started = True


def _tool_function(tool: Any) -> dict[str, Any]:
    schema = tool_json_schema(tool)
    function = schema.get("function", schema)
    if schema.get("type", "function") != "function":
        # (rendered, as the template may show it, but no call of it can be decoded or parsed)
        raise ValueError(
            f"a tool of type {schema.get('type')!r} cannot be called under a grammar: tool_choice, "
            "parallel_tool_calls and response_format take function tools ({'type': 'function', "
            f"'function': {{'name': ...}}}} and typed functions), got {schema!r}"
        )
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"a tool needs a string name: {schema!r}")
    return dict(function)


def _arguments_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise ValueError(
            f"the parameters of tool {function['name']!r} must be a JSON schema object"
        )
    if "type" not in parameters:
        parameters = {"type": "object", **parameters}
    elif parameters["type"] != "object":
        raise ValueError(
            f"the parameters of tool {function['name']!r} must be an object schema, "
            f"got type {parameters['type']!r}"
        )
    # Closed objects (declared keys only) and the sound rewrites of structured output.
    name = function["name"]
    try:
        # OpenAPI's `nullable` (transformers writes it for Optional[...] parameters) as JSON
        # Schema; the arguments object itself is never null.
        arguments = {k: v for k, v in parameters.items() if k != "nullable"}
        return _enforced_schema(nullable_as_json_schema(arguments), own_options=False)
    except ConstraintError as e:
        raise ConstraintError(f"the parameters of tool {name!r}: {e}") from e
    except RecursionError:
        raise ConstraintError(f"the parameters of tool {name!r}: {SCHEMA_TOO_DEEP}") from None


def json_answer_rule(schema: Mapping[str, Any] | bool, name: str = "answer") -> str:
    """A Lark rule ``name`` for a reply that is JSON under ``schema``, enforced as a
    ``json_schema`` constraint enforces it (strict, spaced like ``json.dumps`` unless the schema's
    ``x-guidance`` says otherwise); ConstraintError for a schema that cannot be enforced."""
    try:
        prepared = _enforced_schema(schema if isinstance(schema, bool) else dict(schema))
        return f"{name}: %json {json.dumps(prepared, ensure_ascii=False)}"
    except RecursionError:
        raise ConstraintError(f"the answer schema: {SCHEMA_TOO_DEEP}") from None


def start_rule(lines: Sequence[str]) -> tuple[int, str]:
    """Where the ``start`` rule of a Lark grammar (as its lines) is, and its body."""
    index = next(i for i, line in enumerate(lines) if line.startswith("start: "))
    return index, lines[index].removeprefix("start: ")


def answer_grammar(schema: Mapping[str, Any] | bool) -> str:
    """A Lark grammar of a reply that is JSON under ``schema`` (``json_answer_rule``)."""
    return f"%llguidance {{}}\nstart: answer\n{json_answer_rule(schema)}\n"


def _enforced_schema(schema: Any, own_options: bool = True) -> dict[str, Any]:
    """``schema`` (strict) as a Lark ``%json`` embed enforces it exactly, with brisklm's JSON
    options (and, with ``own_options``, the schema's own ``x-guidance`` over them); checked
    to compile (ConstraintError). Kept per schema text: a chat with tools asks it for each tool
    on every call (~0.2 ms each, mostly llguidance's check)."""
    try:
        key = json.dumps(schema, allow_nan=False)  # in its own key order: properties' order counts
        plain_json = json.loads(key) == schema
    except (TypeError, ValueError, RecursionError):  # prepare_json_schema names what is wrong
        plain_json = False
    if not plain_json:  # (int keys, tuples: not what it reads)
        return _enforce_schema(schema, own_options)
    return json.loads(_enforced_schema_text(key, own_options))


@functools.lru_cache(maxsize=256)
def _enforced_schema_text(key: str, own_options: bool) -> str:
    return json.dumps(_enforce_schema(json.loads(key), own_options), ensure_ascii=False)


def _enforce_schema(schema: Any, own_options: bool) -> dict[str, Any]:
    prepared = prepare_json_schema(schema, strict=True)
    prepared["x-guidance"] = enforced_options(prepared, JSON_OPTIONS, own=own_options)
    check_json_schema_grammar(LLMatcher.grammar_from_json_schema(prepared), schema)
    return mark_prepared(prepared)


def check_tool_schema(tool: Any) -> None:
    """ValueError when ``tool`` cannot be offered: no string name, parameters that are not an
    object schema, or a schema that cannot be enforced (ConstraintError, naming the tool), as
    ``tool_call_grammar`` would find it when a request compiles."""
    _arguments_schema(_tool_function(tool))


def tool_name(tool: Any) -> str:
    """A tool's name (a tool as ``tool_json_schema`` takes it: a dict, function or pydantic
    class)."""
    return _tool_function(tool)["name"]


def grammar_mode(tools: Sequence[Any], tool_choice: str) -> tuple[ToolChoiceMode, list[Any]]:
    """The grammar mode and the tools it allows for a tool choice: "auto", "required", "none",
    or the name of the one tool to call (then "required", that tool alone)."""
    if tool_choice in ("auto", "required", "none"):
        return tool_choice, list(tools)  # type: ignore[return-value]
    return "required", [t for t in tools if tool_name(t) == tool_choice]


def check_parallel_tool_calls(parallel_tool_calls: Any) -> None:
    """TypeError unless parallel_tool_calls is True, False or None."""
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise TypeError(
            "parallel_tool_calls must be True, False or None, got "
            f"{parallel_tool_calls!r} ({type(parallel_tool_calls).__name__})"
        )


_OPENAI_CHOICES = '"auto", "required", "none" or {"type": "function", "function": {"name": ...}}'


def openai_tool_choice(choice: Any, names: Sequence[str]) -> str:
    """OpenAI's ``tool_choice`` (None: "auto"; "auto", "required", "none", or
    ``{"type": "function", "function": {"name": ...}}``, one of ``names``) as "auto",
    "required", "none" or the one tool's name; ValueError naming what is allowed."""
    if choice is None:
        return "auto"
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if (
            choice.get("type") != "function"
            or not isinstance(function, Mapping)
            or not isinstance(function.get("name"), str)
        ):
            raise ValueError(f"tool_choice must be {_OPENAI_CHOICES}, got {choice!r}")
        name = function["name"]
        if name not in names:
            raise ValueError(
                f"tool_choice names the function {name!r}, which is not among the tools "
                f"({', '.join(names) or 'none given'})"
            )
        return name
    if choice not in ("auto", "required", "none"):
        raise ValueError(f"tool_choice must be {_OPENAI_CHOICES} (a tool named so), got {choice!r}")
    if choice == "required" and not names:
        raise ValueError('tool_choice "required" needs tools')
    return choice


def check_tool_choice_mode(mode: Any) -> None:
    if mode not in ("auto", "required", "none"):
        raise ValueError(f"mode must be 'auto', 'required' or 'none', got {mode!r}")


def call_alternatives(
    tools: Sequence[Any],
    mode: str,
    arguments_key: str,
    head: str = "",
    tail: str = "",
    *,
    name_then: str | None = None,
    tail_item: str | None = None,
) -> list[str]:
    """Lark rules ``call`` (one alternative per tool: ``{"name": NAME, "<arguments_key>": ARGS}``
    between ``head`` and ``tail``, then ``tail_item``, a Lark item such as a token ``<[id]>``) and
    ``arguments_<k>`` (ARGS under the tool's parameters schema; the arguments of a small flat
    schema may come in any order, see ``constrained.any_order``).

    ``name_then`` (a Lark item, e.g. a token ``<[id]>``) writes a call as the bare name, that item,
    then ARGS instead (Mistral's v11 layout)."""
    functions: list[dict[str, Any]] = []
    for tool in tools:
        function = _tool_function(tool)
        if function not in functions:  # two tools of one name: a call may follow either schema
            functions.append(function)
    if not functions:
        raise ValueError(f"mode {mode!r} needs at least one tool")
    alternatives = []
    for k, function in enumerate(functions):
        if name_then is not None:
            alternatives.append(f"{lark_literal(function['name'])} {name_then} arguments_{k}")
            continue
        name = json.dumps(function["name"], ensure_ascii=False)
        # "{" a lexeme of its own: beside a JSON answer (``json_answer_rule``), which also opens
        # with "{", llguidance lexed one long literal and lost the answer.
        start = f'"name": {name}, "{arguments_key}": '
        alternatives.append(
            f"{lark_literal(head + '{')} {lark_literal(start)} arguments_{k} "
            f"{lark_literal('}' + tail)}" + (f" {tail_item}" if tail_item else "")
        )
    lines = ["call: " + "\n    | ".join(alternatives)]
    for k, function in enumerate(functions):
        schema = _arguments_schema(function)
        any_order = any_order_object_rules(f"arguments_{k}", schema)
        if any_order is not None:
            lines.extend(any_order)
        else:
            lines.append(f"arguments_{k}: %json {json.dumps(schema, ensure_ascii=False)}")
    return lines


# The lexemes of free text that begin the tools' grammars (here and in brisklm.tool_formats).
REPLY_TEXTS = ("TEXT", "TEXT_WITHOUT_CALLS")


def text_without(tag: str) -> str:
    """A Lark regex lexeme for any text that does not hold ``tag``, spelled out of any tokens
    (regex and-not): where the tag is a special token, text still must not spell it, or the
    parser, which reads text, would find a call there that no tool schema checked."""
    return f"/(?s:.*)/ & ~/(?s:.*){re.escape(tag)}(?s:.*)/"


def tool_call_grammar(
    tools: Sequence[Any],
    mode: ToolChoiceMode = "auto",
    *,
    parallel: bool = True,
    start_token_id: int | None = None,
    end_token_id: int | None = None,
) -> str:
    """A Lark grammar (llguidance dialect) for one assistant turn that may call `tools`.

    Calls are written as the Hermes chat templates write them, `<tool_call>\\n{"name": NAME,
    "arguments": ARGS}\\n</tool_call>`, several joined by "\\n"; each tool is one alternative with
    its name fixed and ARGS under its parameters schema (`%json`, strict: declared keys only), so
    every call parses and validates. Other families' formats: ``brisklm.tool_formats``.

    - "auto": free text, which may end in tool calls: `<tool_call>` (a lazy lexeme, so plain text
      stays free) commits the model to a valid call; after the calls only more calls or the end.
    - "required": one or more calls and nothing else; pass a single tool to force that tool.
    - "none": free text that never contains `<tool_call>`.

    `parallel=False` allows exactly one call. ``start_token_id`` / ``end_token_id``: the ids of
    `<tool_call>` / `</tool_call>` where they are special tokens (Hermes 3 on Llama 3.1), which
    text cannot produce: the grammar writes them as those tokens. Tools are OpenAI-style dicts
    (`{"type": "function", "function": {...}}` or the bare function), functions or pydantic classes.
    Raises ValueError for an unknown mode, no tools, or parameters that are not an object schema, and
    ConstraintError (a ValueError) for a schema that cannot be enforced.
    """
    check_tool_choice_mode(mode)
    lines = ["%llguidance {}"]
    # Any text, minus the texts that contain the tag (regex and-not; the tag has no metacharacters).
    text_without_calls = f"TEXT_WITHOUT_CALLS: {text_without(TOOL_CALL_START)}"
    if mode == "none":
        lines.append("start: TEXT_WITHOUT_CALLS")
        lines.append(text_without_calls)
        return "\n".join(lines) + "\n"
    end = f"<[{end_token_id}]>" if end_token_id is not None else None
    rules = call_alternatives(
        tools,
        mode,
        "arguments",
        head="\n",
        tail="\n" if end else "\n" + TOOL_CALL_END,
        tail_item=end,
    )
    if start_token_id is not None:
        start = f"<[{start_token_id}]>"
        more = f' ("\\n" {start} call)*' if parallel else ""
        # Text cannot produce a special token, so text and calls need no lazy split; nor may it
        # spell the tag out of other tokens (the parser would read an unchecked call there).
        lines.append(
            f"start: TEXT_WITHOUT_CALLS ({start} call{more})?"
            if mode == "auto"
            else f"start: {start} call{more}"
        )
        lines.append(text_without_calls)
        lines.extend(rules)
        return "\n".join(lines) + "\n"
    more = f" ({lark_literal(chr(10) + TOOL_CALL_START)} call)*" if parallel else ""
    if mode == "auto":
        lines.append(f"start: TEXT | text_then_call call{more}")
        lines.append(f"text_then_call[lazy]: TEXT {lark_literal(TOOL_CALL_START)}")
        lines.append("TEXT: /(?s:.*)/")
    else:
        lines.append(f"start: {lark_literal(TOOL_CALL_START)} call{more}")
    lines.extend(rules)
    return "\n".join(lines) + "\n"
