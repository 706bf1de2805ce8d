"""LangChain messages -> the chat-template message dicts that brisklm renders."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

# Content blocks that carry no text for the prompt: the model's own tool calls (rendered from
# `tool_calls`; a provider's server-side tools and their results have no place in a local
# model's history) and reasoning, which templates drop from the history.
_SKIPPED_BLOCKS = frozenset(
    {
        "tool_use",
        "tool_call",
        "tool_call_chunk",
        "invalid_tool_call",
        "server_tool_call",
        "server_tool_call_chunk",
        "server_tool_result",
        "thinking",
        "reasoning",
    }
)
_MEDIA_BLOCKS = frozenset(
    {"image", "image_url", "audio", "input_audio", "video", "file", "document", "media"}
)
_READ_BLOCKS = (
    "brisklm reads text, text-plain (with its text), refusal and json blocks and skips tool-call, "
    "server-tool and reasoning blocks"
)
# Roles whose consecutive messages are merged (tool results stay separate: each answers one call).
_MERGED_ROLES = frozenset({"system", "user", "assistant"})


def content_text(content: str | list[Any], role: str) -> str:
    """The text of a message's content: a string, or the text of its content blocks joined."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
            continue
        if not isinstance(block, dict):
            raise ValueError(f"unsupported content block in a {role} message: {block!r}")
        kind = block.get("type")
        if kind == "text" or (kind == "text-plain" and "text" in block):
            parts.append(str(block.get("text", "")))
        elif kind == "refusal":  # an assistant's refusal is what it said
            parts.append(str(block.get("refusal", "")))
        elif kind in _SKIPPED_BLOCKS:
            continue
        elif kind in _MEDIA_BLOCKS or kind == "text-plain":  # text-plain here: a file by reference
            what = (
                " that refers to a file instead of holding its text" if kind == "text-plain" else ""
            )
            raise ValueError(
                f"brisklm models read text only; {_a(role)} message has {_a(repr(kind))} content "
                f"block{what}; {_READ_BLOCKS}"
            )
        elif kind == "json" and "json" in block:
            parts.append(json.dumps(block["json"], ensure_ascii=False))
        else:
            raise ValueError(
                f"unsupported content block type {kind!r} in {_a(role)} message; {_READ_BLOCKS}"
            )
    return "".join(parts)


def _a(word: str) -> str:
    """The word with its indefinite article."""
    return ("an " if word.lstrip("'").lower()[:1] in "aeiou" else "a ") + word


def _tool_result_text(content: Any) -> str:
    if isinstance(content, (str, list)):
        return content_text(content, "tool")
    return json.dumps(content, ensure_ascii=False)


def _assistant_tool_calls(message: AIMessage) -> list[dict[str, Any]]:
    """OpenAI-style entries with the arguments as an object, as Hugging Face templates expect.
    Invalid calls (a reply cut inside one, arguments that did not parse) go in too, as
    ChatOpenAI sends them, so a tool result answering one answers a call the prompt shows: their
    arguments as the object they spell if they parse, else as their text."""
    calls = [(call.get("id"), call["name"], call.get("args") or {}) for call in message.tool_calls]
    for invalid in message.invalid_tool_calls:
        if isinstance(invalid.get("name"), str) and invalid["name"]:
            calls.append((invalid.get("id"), invalid["name"], _arguments(invalid.get("args"))))
    return [
        {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
        for id, name, arguments in calls
    ]


def _arguments(text: str | None) -> dict[str, Any] | str:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return text or ""
    return value if isinstance(value, dict) else text or ""


def _one_message(message: BaseMessage, tool_names: dict[str, str]) -> dict[str, Any]:
    if isinstance(message, SystemMessage):
        out: dict[str, Any] = {"role": "system", "content": content_text(message.content, "system")}
    elif isinstance(message, HumanMessage):
        out = {"role": "user", "content": content_text(message.content, "human")}
    elif isinstance(message, AIMessage):
        out = {"role": "assistant", "content": content_text(message.content, "AI")}
        reasoning = message.additional_kwargs.get("reasoning_content")
        if isinstance(reasoning, str):  # (Qwen3's template shows it within a tool loop)
            out["reasoning_content"] = reasoning
        calls = _assistant_tool_calls(message)
        if calls:
            out["tool_calls"] = calls
            for call in calls:
                if call["id"]:
                    tool_names[call["id"]] = call["function"]["name"]
    elif isinstance(message, ToolMessage):
        out = {
            "role": "tool",
            "content": _tool_result_text(message.content),
            "tool_call_id": message.tool_call_id,
        }
        name = message.name or tool_names.get(message.tool_call_id)
        if name:
            out["name"] = name
        return out
    elif isinstance(message, FunctionMessage):
        return {"role": "tool", "content": _tool_result_text(message.content), "name": message.name}
    elif isinstance(message, ChatMessage):
        out = {"role": message.role, "content": content_text(message.content, message.role)}
    else:
        raise ValueError(f"unsupported message type {type(message).__name__}")
    if message.name:
        out["name"] = message.name
    return out


def _mergeable(previous: dict[str, Any], current: dict[str, Any]) -> bool:
    return (
        previous["role"] == current["role"]
        and current["role"] in _MERGED_ROLES
        and previous.get("name") == current.get("name")
    )


def to_template_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Message dicts for a chat template: {"role", "content"} plus "name", "tool_calls", "tool_call_id".

    AI tool calls become OpenAI-style `{"id", "type": "function", "function": {"name", "arguments"}}`;
    a tool message without a name takes the name of the call it answers. Consecutive system, human or
    AI messages from the same speaker are merged (texts joined by a blank line, tool calls kept in
    order), since many templates insist that roles alternate. Media content raises ValueError.
    """
    tool_names: dict[str, str] = {}
    merged: list[dict[str, Any]] = []
    for message in messages:
        current = _one_message(message, tool_names)
        if merged and _mergeable(merged[-1], current):
            previous = merged[-1]
            texts = [t for t in (previous["content"], current["content"]) if t]
            previous["content"] = "\n\n".join(texts)
            if current.get("tool_calls"):
                previous["tool_calls"] = previous.get("tool_calls", []) + current["tool_calls"]
        else:
            merged.append(current)
    return merged
