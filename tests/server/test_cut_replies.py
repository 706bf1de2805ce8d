"""A chat reply cut (max_tokens, a stop token) inside a call: the server's whole reply and its
streamed reply agree, in every format, with or without calls complete before the cut. Under the
tools' grammar a call's start is a call, so one the reply was cut inside is no content."""

from __future__ import annotations

import pytest

from brisklm.outputs import GenerationOutput, StreamChunk, Usage
from brisklm.server.app import _chat_choice, _StreamedReply
from brisklm.tool_formats import ToolCallFormat

HERMES = ToolCallFormat("hermes")
LLAMA = ToolCallFormat("llama3_json", tag_token_id=7)
MISTRAL = ToolCallFormat("mistral", tag_token_id=5)
MISTRAL_V11 = ToolCallFormat("mistral", tag_token_id=5, args_token_id=6)
WHOLE = '{"name": "f", "arguments": {"a": 1}}'

CUT_REPLIES = [
    # (format, reply, content, calls)
    (HERMES, 'Hi\n<tool_call>\n{"name": "f", "argu', "Hi", []),
    (HERMES, f'Hi\n<tool_call>\n{WHOLE}\n</tool_call>\n<tool_call>\n{{"na', "Hi", ["f"]),
    (MISTRAL, 'Hi[TOOL_CALLS][{"name": "f", "argu', "Hi", []),
    (MISTRAL, f'Hi[TOOL_CALLS][{WHOLE}, {{"name": "g', "Hi", ["f"]),
    (MISTRAL_V11, 'Hi[TOOL_CALLS]f[ARGS]{"a"', "Hi", []),
    (MISTRAL_V11, 'Hi[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{"b', "Hi", ["f"]),
    (LLAMA, '{"name": "f", "parameters": {"a": 1', None, []),
    (LLAMA, '{"name": "f", "parameters": {"a": 1}}; {"name": "g', None, ["f"]),
]


def _whole(text: str, format: ToolCallFormat, finish: str, stop_reason: int | None):
    output = GenerationOutput("r", None, [1], text, [2], finish, Usage(1, 1), stop_reason)
    choice = _chat_choice(0, output, format, None)
    message = choice["message"]
    calls = [c["function"]["name"] for c in message.get("tool_calls", [])]
    return message["content"] or None, calls, choice["finish_reason"]


def _streamed(text: str, format: ToolCallFormat, finish: str, stop_reason: int | None):
    reply = _StreamedReply(format, None)
    content, names = "", {}
    for start in range(0, len(text), 3):  # in pieces, the last one finishing the reply
        piece = text[start : start + 3]
        last = start + 3 >= len(text)
        chunk = StreamChunk(
            "r", piece, [], finish_reason=finish if last else None, stop_reason=stop_reason
        )
        delta, reason = reply.take(chunk)
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            names.setdefault(call["index"], call["function"].get("name"))
    return content or None, [names[i] for i in sorted(names)], reason


@pytest.mark.parametrize(("format", "text", "content", "calls"), CUT_REPLIES)
@pytest.mark.parametrize(("finish", "stop_reason"), [("length", None), ("stop", 2)])
def test_a_reply_cut_inside_a_call_streams_as_it_is_answered_whole(
    format, text, content, calls, finish, stop_reason
) -> None:
    # Llama 3 / Mistral replies cut before their first call was whole came back whole as
    # content, tags and all ('Hi[TOOL_CALLS][{"name": ...'), and streamed as "Hi".
    whole = _whole(text, format, finish, stop_reason)
    assert whole[:2] == (content, calls)
    assert _streamed(text, format, finish, stop_reason) == whole


@pytest.mark.parametrize(("finish", "stop_reason"), [("length", None), ("stop", 2)])
def test_a_cut_llama3_json_answer_beside_tools_is_content(finish, stop_reason) -> None:
    """A response_format's answer beside tools, cut: under the grammar an object whose keys are
    not a call's ("name", then "parameters") is no call, so its text is the content, as OpenAI
    gives a cut answer (reviews found it dropped)."""
    for text in ('{"city": "Paris", "temperature": 2', '{"name": "Paris", "population": 21'):
        whole = _whole(text, LLAMA, finish, stop_reason)
        assert whole[:2] == (text, [])
        assert _streamed(text, LLAMA, finish, stop_reason) == whole
    # may still be a call: no content
    for call_start in ('{"na', '{\n  "name": "f", "param', '{"name": "f", "', '{"name": "f'):
        assert _whole(call_start, LLAMA, finish, stop_reason)[:2] == (None, [])
