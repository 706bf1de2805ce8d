"""A streamed reply's tool calls as chunks: each call's index, id and name once its name is
whole, then the pieces of its arguments JSON as the model writes them (the pieces joined are the
arguments exactly). ChatBrisk's stream sends them as LangChain's ``tool_call_chunks`` (the
chunks are that shape), and ``brisklm serve`` as OpenAI's ``tool_calls`` deltas."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from brisklm.tool_call_ids import new_tool_call_id
from brisklm.tool_calls import (
    TOOL_CALL_START,
    ContentDelta,
    ToolCallComplete,
    ToolCallDelta,
)
from brisklm.tool_formats import ToolCallFormat

# {"name", "args", "id", "index", "type": "tool_call_chunk"}: LangChain's ToolCallChunk.
CallChunk = dict[str, Any]


def call_chunk(
    name: str | None = None,
    args: str | None = None,
    id: str | None = None,
    index: int | None = None,
) -> CallChunk:
    return {"name": name, "args": args, "id": id, "index": index, "type": "tool_call_chunk"}


# The start of a call as the grammar writes it, up to its arguments object. It matches once
# the object has begun, so the whitespace before it is never an argument piece; arguments given
# otherwise (a JSON string holding the object) are sent whole when the call is.
_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')


@dataclass
class _CallState:
    raw: str = ""
    id: str = field(default_factory=new_tool_call_id)
    head_end: int | None = None  # in ``raw``, where the arguments begin
    emitted: int = 0  # characters of the arguments sent
    # How far the arguments object has been read (``settle``): characters, brackets open, in a
    # string, after a backslash there, and where the object ends once it has.
    scanned: int = 0
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    end: int | None = None

    def settle(self) -> int:
        """How many characters of the arguments written so far are theirs: all, until their
        object ends (text after it, as another key of the call, is not theirs). Reads only
        what came since the last call."""
        assert self.head_end is not None
        raw, start = self.raw, self.head_end
        at = start + self.scanned
        while self.end is None and at < len(raw):
            char = raw[at]
            at += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = at - start
        self.scanned = at - start
        return self.scanned if self.end is None else self.end

    def settled(self) -> str:
        """The arguments written so far, to the end of their object once it has come."""
        assert self.head_end is not None
        return self.raw[self.head_end : self.head_end + self.settle()]

    def unsent(self) -> str:
        """The arguments' characters settled since the last call, marked sent."""
        assert self.head_end is not None
        settled = self.settle()
        piece = self.raw[self.head_end + self.emitted : self.head_end + settled]
        self.emitted = settled
        return piece


class ToolCallChunker:
    """Turns generated text into message content and `tool_call_chunks`, as the text streams.

    Each call gets a first chunk with its index, id and name once its name is complete, then
    chunks with pieces of its arguments JSON; the pieces joined are the arguments exactly.
    """

    def __init__(self, tool_format: ToolCallFormat | None = None) -> None:
        self._format = tool_format or ToolCallFormat()
        self._parser = self._format.stream_parser()
        self._calls: dict[int, _CallState] = {}
        self._text = ""
        self._num_calls_before_cut = 0
        # Blocks that failed to parse after their chunks went out: the calls after each take
        # the next index, so that their chunks do not merge into the failed one's.
        self._failed_sent = 0
        self.cut = False  # the reply ended inside a call (known at finish)

    def feed(self, text: str) -> tuple[str, list[CallChunk]]:
        self._text += text
        return self._convert(self._parser.feed(text))

    def finish(self) -> tuple[str, list[CallChunk]]:
        cut_calls, self.cut = self._format.read_cut(self._text)
        events = self._parser.finish()
        if cut_calls is not None:
            # Calls (llama3_json, mistral: parsed whole at the end) the reply ended inside: the
            # content went out before them; the calls complete before the cut go out.
            _, calls, _ = cut_calls
            self._num_calls_before_cut = len(calls)
            return "", [
                self._complete(index, _CallState(), call)[0] for index, call in enumerate(calls)
            ]
        last = events[-1] if events else None
        cut = isinstance(last, ContentDelta) and last.text.lstrip().startswith(TOOL_CALL_START)
        if cut:
            # A call the reply ended inside is not content, as in the reply's message (which
            # lists it as invalid). Its chunks went out already once its name was complete; the
            # merged chunks hold the partial call.
            events = events[:-1]
        return self._convert(events)

    def cut_arguments(self) -> list[tuple[int, str, int]]:
        """After ``finish``: each call the reply ended inside whose chunks went out (its name and
        arguments so far, in the Hermes format), as its index, its arguments so far (to the end
        of their object where it came) and how many of their characters went out."""
        if not self.cut:
            return []
        return [
            (index + self._failed_sent, state.settled(), state.emitted)
            for index, state in sorted(self._calls.items())
            if state.head_end is not None
        ]

    @property
    def num_calls(self) -> int:
        """Calls complete so far (a call cut by the reply's end is none)."""
        return self._parser.num_calls + self._num_calls_before_cut

    def _convert(self, events: list[Any]) -> tuple[str, list[CallChunk]]:
        content: list[str] = []
        chunks: list[CallChunk] = []
        for event in events:
            if isinstance(event, ContentDelta):
                # Content while a block's deltas are open: the block failed to parse and is
                # content (the parser writes content only outside blocks).
                for failed in self._calls.values():
                    self._failed_sent += failed.head_end is not None
                self._calls.clear()
                content.append(event.text)
            elif isinstance(event, ToolCallDelta):
                state = self._calls.setdefault(event.index, _CallState())
                state.raw += event.text
                chunks.extend(self._progress(event.index + self._failed_sent, state))
            elif isinstance(event, ToolCallComplete):
                state = self._calls.pop(event.index, _CallState())
                chunks.extend(self._complete(event.index + self._failed_sent, state, event.call))
        return "".join(content), _coalesce(chunks)

    def _progress(self, index: int, state: _CallState) -> list[CallChunk]:
        out: list[CallChunk] = []
        if state.head_end is None:
            blank = len(state.raw) - len(state.raw.lstrip())  # (until the short head is whole)
            match = _CALL_HEAD.match(state.raw, blank)
            if match is None:
                return out
            state.head_end = match.end()
            name = json.loads(match.group(1))
            out.append(call_chunk(name=name, args="", id=state.id, index=index))
        piece = state.unsent()
        if piece:
            out.append(call_chunk(args=piece, index=index))
        return out

    @staticmethod
    def _complete(index: int, state: _CallState, call: Any) -> list[CallChunk]:
        if (
            state.head_end is None
        ):  # not streamed (another format, or another layout): send it whole
            args = json.dumps(call.arguments, ensure_ascii=False)
            return [call_chunk(name=call.name, args=args, id=call.id, index=index)]
        rest = state.unsent()
        return [call_chunk(args=rest, index=index)] if rest else []


def _coalesce(chunks: list[CallChunk]) -> list[CallChunk]:
    """One chunk per call index: a message whose chunk list repeats an index merges out of order."""
    by_index: dict[int | None, CallChunk] = {}
    for chunk in chunks:
        first = by_index.get(chunk["index"])
        if first is None:
            by_index[chunk["index"]] = chunk
        else:
            first["args"] = (first["args"] or "") + (chunk["args"] or "")
            first["name"] = first["name"] or chunk["name"]
            first["id"] = first["id"] or chunk["id"]
    return list(by_index.values())
