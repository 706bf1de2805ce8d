"""Tool calls in the Hermes / Qwen2.5 chat format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


def new_tool_call_id() -> str:
    """A fresh id in the OpenAI style, `call_` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One call the assistant asked for: the function name, its JSON arguments and a unique id."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_tool_call_id)


def parse_tool_call_body(body: str) -> ToolCall | None:
    """The call written between the tags, or None unless it is a JSON object with a string "name".

    "arguments" may be missing (no arguments), an object, or a string holding a JSON object; some models
    write "parameters" instead.
    """
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
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

    Blocks run from TOOL_CALL_START to the next TOOL_CALL_END; a final block the model left unclosed
    counts if its body parses. Blocks that do not parse stay in the content verbatim, tags included.
    The content is the text outside the parsed blocks with surrounding whitespace stripped.
    """
    content: list[str] = []
    calls: list[ToolCall] = []
    position = 0
    while True:
        start = text.find(TOOL_CALL_START, position)
        if start < 0:
            content.append(text[position:])
            break
        content.append(text[position:start])
        body_start = start + len(TOOL_CALL_START)
        end = text.find(TOOL_CALL_END, body_start)
        block_end = len(text) if end < 0 else end + len(TOOL_CALL_END)
        call = parse_tool_call_body(text[body_start : len(text) if end < 0 else end])
        if call is None:
            content.append(text[start:block_end])
        else:
            calls.append(call)
        if end < 0:
            break
        position = block_end
    return "".join(content).strip(), calls


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


def _partial_tag_length(text: str, tag: str) -> int:
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
            found = self._buffer.find(tag)
            if found < 0:
                settled = len(self._buffer) - _partial_tag_length(self._buffer, tag)
                self._take(self._buffer[:settled], events)
                self._buffer = self._buffer[settled:]
                return events
            self._take(self._buffer[:found], events)
            self._buffer = self._buffer[found + len(tag) :]
            if self._in_block:
                self._close_block(events, closed=True)
            else:
                self._in_block, self._block = True, ""

    def finish(self) -> list[ToolCallEvent]:
        """End of generation: settle held-back text and an unclosed final block."""
        events: list[ToolCallEvent] = []
        self._take(self._buffer, events)
        self._buffer = ""
        if self._in_block:
            self._close_block(events, closed=False)
        self._pending_whitespace = ""  # trailing whitespace of the content is stripped
        return events

    def _take(self, text: str, events: list[ToolCallEvent]) -> None:
        if not text:
            return
        if self._in_block:
            self._block += text
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
