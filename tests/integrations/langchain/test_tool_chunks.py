"""ToolCallChunker and split_cut_call on written text (no model): content, tool-call chunks, cuts."""

from __future__ import annotations

import json
import random

import pytest
from langchain_core.messages import AIMessageChunk

from langchain_brisklm._tools import ToolCallChunker, normalize_tool_choice, split_cut_call

CALLS = [
    ("get_weather", {"city": "Zürich", "unit": "C", "nested": {"a": [1, {"b": "}"}]}}),
    ("search", {"q": "東京 } 天気 ☀", "limit": 3}),
    ("now", {}),
]
TEXT = "Let me check.\n" + "\n".join(
    "<tool_call>\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
    for n, a in CALLS
)


def run(text: str, pieces: list[int]) -> AIMessageChunk:
    chunker = ToolCallChunker()
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
    rest, cut = split_cut_call(text)
    assert rest == "Sure.\n"
    assert cut is not None
    assert cut["name"] == "get_weather" and cut["args"] == '{"city": "Pa'
    assert split_cut_call(TEXT) == (TEXT, None)
    full = run(text, [7] * 20)
    assert full.content == "Sure."  # the cut call is not content as well


def test_tool_choice_spellings() -> None:
    names = ["a", "b"]
    assert normalize_tool_choice(None, names) == "auto"
    assert normalize_tool_choice("any", names) == "required"
    assert normalize_tool_choice(True, names) == "required"
    assert normalize_tool_choice(False, names) == "none"
    assert normalize_tool_choice({"type": "function", "function": {"name": "b"}}, names) == "b"
    assert normalize_tool_choice({"type": "tool", "name": "a"}, names) == "a"
    assert normalize_tool_choice({"type": "any"}, names) == "required"
