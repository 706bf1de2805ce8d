"""Parsers of structured output that refuse a reply the length limit or a stop sequence cut off.

LangChain's JSON parsers accept partial JSON (they stream partial objects), so a reply cut by
``max_tokens``, a full context or a stop sequence would come back as a result with fields missing
or a string cut short (and the tools parsers skip a cut call: the result was None). The grammar
makes every complete reply valid; these parsers make an incomplete one an error
(``OutputParserException``, in ``parsing_error`` with ``include_raw=True``), the way ChatOpenAI
refuses a structured reply whose finish reason is "length"."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGeneration, Generation

# response_metadata key, True when the reply ended inside a tool call: in a stream's aggregate
# (and so in `invoke` with streaming=True) LangChain's partial-JSON merge turns the cut call's
# chunks into a call with the arguments written so far, where `invoke` has an invalid call.
CUT_TOOL_CALL = "cut_tool_call"


def _json_complete(text: str) -> bool:
    try:
        json.loads(text.strip())
    except ValueError:
        return False
    return True


def _reply_complete(message: BaseMessage) -> bool:
    """A JSON reply is complete when its text is a whole JSON value."""
    return _json_complete(message.text)


def _calls_complete(message: BaseMessage) -> bool:
    """Tool calls are complete when every call parsed (a cut one is an invalid tool call) and,
    in a stream's aggregate, every call's arguments are whole JSON, and the reply did not end
    inside a call (``CUT_TOOL_CALL``: a cut call merged from a stream's chunks parses as partial
    JSON)."""
    if not isinstance(message, AIMessage) or not message.tool_calls or message.invalid_tool_calls:
        return False
    if message.response_metadata.get(CUT_TOOL_CALL):
        return False
    if isinstance(message, AIMessageChunk):
        return all(_json_complete(chunk.get("args") or "") for chunk in message.tool_call_chunks)
    return True


class _WholeReplyOnly:
    """Refuses a reply that its length limit or a stop sequence cut before it was whole (a reply
    that ends whole on its last allowed token is kept)."""

    _complete = staticmethod(_reply_complete)

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        for generation in result:
            message = generation.message if isinstance(generation, ChatGeneration) else None
            if message is None or self._complete(message):
                continue
            cut = _cut_by(message)
            if cut is not None:
                raise OutputParserException(
                    f"the structured reply was cut off{cut}, so it is incomplete",
                    llm_output=message.text,
                )
        return super().parse_result(result, partial=partial)  # type: ignore[misc]


def _cut_by(message: BaseMessage) -> str | None:
    """What ended an incomplete reply early, with what to do about it; None while it runs on."""
    metadata = message.response_metadata
    if metadata.get("finish_reason") == "length":
        # (with n > 1 the usage is the whole call's, the reply's own count in the metadata)
        usage = getattr(message, "usage_metadata", None) or {}
        count = metadata.get("completion_tokens", usage.get("output_tokens"))
        after = f" after {count} tokens" if count else ""
        return (
            f"{after} (finish_reason 'length'): raise max_tokens (or the engine's max_seq_len, "
            "if the context is full)"
        )
    if metadata.get("stop_reason") is not None:
        return (
            f" by the stop sequence {metadata['stop_reason']!r}: leave stop sequences out of "
            "structured output (the grammar ends the reply)"
        )
    if isinstance(message, AIMessage) and message.invalid_tool_calls:
        return " inside its tool call (the call did not parse)"
    if metadata.get(CUT_TOOL_CALL):
        return " inside its tool call"
    return None


class WholeJsonOutputParser(_WholeReplyOnly, JsonOutputParser):
    """JsonOutputParser that refuses a cut reply."""


class WholePydanticOutputParser(_WholeReplyOnly, PydanticOutputParser):
    """PydanticOutputParser that refuses a cut reply."""


class WholeJsonOutputKeyToolsParser(_WholeReplyOnly, JsonOutputKeyToolsParser):
    """JsonOutputKeyToolsParser that refuses a cut call."""

    _complete = staticmethod(_calls_complete)


class WholePydanticToolsParser(_WholeReplyOnly, PydanticToolsParser):
    """PydanticToolsParser that refuses a cut call."""

    _complete = staticmethod(_calls_complete)
