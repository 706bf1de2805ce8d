"""ToolCallChunker, split_cut_call and parse_reply on written text (no model): content, tool-call
chunks, cuts."""

from __future__ import annotations

import json
import random

import pytest
from langchain_core.messages import AIMessageChunk

from brisklm.tool_formats import ToolCallFormat
from langchain_brisklm._tools import (
    ToolCallChunker,
    cut_call_error,
    normalize_tool_choice,
    parse_reply,
    split_cut_call,
)

CALLS = [
    ("get_weather", {"city": "Zürich", "unit": "C", "nested": {"a": [1, {"b": "}"}]}}),
    ("search", {"q": "東京 } 天気 ☀", "limit": 3}),
    ("now", {}),
]
TEXT = "Let me check.\n" + "\n".join(
    "<tool_call>\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
    for n, a in CALLS
)


def run(text: str, pieces: list[int], tool_format: ToolCallFormat | None = None) -> AIMessageChunk:
    chunker = ToolCallChunker(tool_format)
    messages = []
    position = 0
    for size in pieces:
        content, chunks = chunker.feed(text[position : position + size])
        messages.append(AIMessageChunk(content=content, tool_call_chunks=chunks))
        position += size
    content, chunks = chunker.finish()
    messages.append(AIMessageChunk(content=content, tool_call_chunks=chunks, chunk_position="last"))
    full = messages[0]
    for message in messages[1:]:
        full = full + message
    return full


@pytest.mark.parametrize("seed", range(20))
def test_chunks_rebuild_the_calls_for_any_split(seed: int) -> None:
    rng = random.Random(seed)
    pieces = [rng.randint(1, 6) for _ in range(len(TEXT))]
    full = run(TEXT, pieces)
    assert full.content == "Let me check."
    assert [(c["name"], c["args"]) for c in full.tool_calls] == CALLS
    assert [c["index"] for c in full.tool_call_chunks] == [0, 1, 2]
    for chunk, (_, arguments) in zip(full.tool_call_chunks, CALLS):
        assert chunk["args"] == json.dumps(arguments, ensure_ascii=False)
        assert chunk["id"].startswith("call_")


def test_name_arrives_before_the_arguments_end() -> None:
    chunker = ToolCallChunker()
    _, chunks = chunker.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert chunks[0]["name"] == "get_weather"
    assert chunks[0]["args"] == '{"city": "Par'


def test_cut_call() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    rest, cut = split_cut_call(text, cut_call_error("length", None))
    assert rest == "Sure.\n"
    assert cut is not None
    assert cut["name"] == "get_weather" and cut["args"] == '{"city": "Pa'
    assert cut["error"] == "the reply ended inside this tool call (max_tokens reached)"
    assert split_cut_call(TEXT, "unused") == (TEXT, None)
    full = run(text, [7] * 20)
    assert full.content == "Sure."  # the cut call is not content as well


def test_what_cut_a_call_is_named() -> None:
    # A stop sequence inside a call was reported as "max_tokens reached".
    assert cut_call_error("stop", "Pa") == (
        "the stop sequence 'Pa' ended the reply inside this tool call"
    )
    assert cut_call_error("stop", 7) == "the stop token id 7 ended the reply inside this tool call"
    assert "max_tokens reached" in cut_call_error("length", None)


MISTRAL = ToolCallFormat("mistral", tag_token_id=5)
MISTRAL_V11 = ToolCallFormat("mistral", tag_token_id=5, args_token_id=6)
LLAMA3 = ToolCallFormat("llama3_json", tag_token_id=7)


@pytest.mark.parametrize(
    "tool_format, text, content, name, args",
    [
        (
            MISTRAL,
            'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Pa',
            "Sure.",
            "get_weather",
            '[{"name": "get_weather", "arguments": {"city": "Pa',
        ),
        (
            MISTRAL_V11,
            'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',
            "Sure.",
            "get_weather",
            'get_weather[ARGS]{"city": "Pa',
        ),
        (
            LLAMA3,
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Pa',
            "",
            "get_weather",
            '{"name": "get_weather", "parameters": {"city": "Pa',
        ),
        (LLAMA3, '{"na', "", None, '{"na'),
    ],
)
def test_cut_calls_of_every_format_are_invalid_calls_not_content(
    tool_format: ToolCallFormat, text: str, content: str, name: str | None, args: str
) -> None:
    # Mistral and Llama 3 calls cut by max_tokens or a stop sequence were left in the content,
    # markup and all.
    error = cut_call_error("stop", "Pa")
    got_content, calls, invalid = parse_reply(text, tool_format, error)
    assert (got_content, calls) == (content, [])
    assert len(invalid) == 1
    assert (invalid[0]["name"], invalid[0]["args"], invalid[0]["error"]) == (name, args, error)
    full = run(text, [5] * 30, tool_format)
    assert full.content == content and full.tool_call_chunks == []
    # Whole calls are unchanged.
    whole = '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]'
    assert parse_reply(whole, MISTRAL, error)[1][0].arguments == {"a": 1}
    assert parse_reply("Just text.", tool_format, error) == ("Just text.", [], [])


def test_tool_choice_spellings() -> None:
    names = ["a", "b"]
    assert normalize_tool_choice(None, names) == "auto"
    assert normalize_tool_choice("any", names) == "required"
    assert normalize_tool_choice(True, names) == "required"
    assert normalize_tool_choice(False, names) == "none"
    assert normalize_tool_choice({"type": "function", "function": {"name": "b"}}, names) == "b"
    assert normalize_tool_choice({"type": "tool", "name": "a"}, names) == "a"
    assert normalize_tool_choice({"type": "any"}, names) == "required"
