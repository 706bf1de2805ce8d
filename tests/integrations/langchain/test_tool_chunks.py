"""ToolCallChunker and parse_reply on written text (no model): content, tool-call
chunks, cuts."""

from __future__ import annotations

import json
import random

import pytest
from langchain_core.messages import AIMessageChunk

from brisklm.tool_call_chunks import ToolCallChunker
from brisklm.tool_formats import ToolCallFormat
from langchain_brisklm._tools import (
    cut_call_chunks,
    cut_call_error,
    normalize_tool_choice,
    parse_reply,
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
    messages.append(AIMessageChunk(content=content, tool_call_chunks=chunks))
    messages.append(AIMessageChunk(content="", tool_call_chunks=cut_call_chunks(chunker)))
    messages[-1].chunk_position = "last"
    full = messages[0]
    for message in messages[1:]:
        full = full + message
    return full


@pytest.mark.parametrize(
    "body",
    [
        # arguments given as a JSON string holding the object (parse_tool_call_body reads it):
        # they streamed as that string, which reads as a str, not the object
        '{"name": "f", "arguments": "{\\"a\\": 1}"}',
        # a key after the arguments streamed into them ('{"x": 1}, "id": "z"', not JSON)
        '{"name": "f", "arguments": {"x": {"y": "}"}}, "id": "z"}',
    ],
)
def test_calls_written_otherwise_than_the_grammar_writes_them_stream_their_arguments(
    body: str,
) -> None:
    """The tools' grammar never writes these; a reply decoded freely may (found by an audit)."""
    from brisklm.tool_calls import parse_tool_call_body

    (expected,) = [parse_tool_call_body(body)]
    text = f"<tool_call>\n{body}\n</tool_call>"
    for size in (1, 3, len(text)):
        full = run(text, [size] * len(text))
        assert [(c["name"], c["args"]) for c in full.tool_calls] == [
            (expected.name, expected.arguments)
        ]
        (chunk,) = full.tool_call_chunks
        assert json.loads(chunk["args"]) == expected.arguments


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


@pytest.mark.parametrize("cut", range(1, len("</tool_call>")))
def test_a_reply_cut_inside_the_end_tag_of_a_whole_call_has_that_call(cut: int) -> None:
    # max_tokens ended the reply after "</tool_call" (a token short of ">"): the call was invalid,
    # its args the wrapper's "}" and the tag's markup, in invoke and stream alike.
    text = TEXT[: len(TEXT) - cut]
    content, calls, invalid = parse_reply(text, HERMES, "cut")
    assert (content, [(c.name, c.arguments) for c in calls], invalid) == (
        "Let me check.",
        CALLS,
        [],
    )
    assert not HERMES.ended_inside_call(text)
    for seed in range(5):
        rng = random.Random(seed)
        full = run(text, [rng.randint(1, 6) for _ in range(len(text))])
        assert full.content == "Let me check." and full.invalid_tool_calls == []
        assert [(c["name"], c["args"]) for c in full.tool_calls] == CALLS


def test_a_stream_cut_anywhere_merges_into_what_invoke_reads() -> None:
    """LangChain reads a merged call's arguments as partial JSON: a cut call whose arguments had
    begun merged into a valid call with the arguments so far. Cut at every character, the stream
    has invoke's calls, and its cut call (where one was sent) is invalid, as invoke's is."""
    start = len("Let me check.\n")
    invalid_seen = 0
    for cut in range(start, len(TEXT) + 1):
        text = TEXT[:cut]
        _, calls, invalid = parse_reply(text, HERMES, "cut")
        full = run(text, [3] * len(text))
        assert [(c["name"], c["args"]) for c in full.tool_calls] == [
            (c.name, c.arguments) for c in calls
        ], text
        for streamed, expected in zip(full.invalid_tool_calls, invalid, strict=False):
            assert streamed["name"] == expected["name"]
            assert streamed["args"].startswith(expected["args"].rstrip()), (streamed, expected)
        assert len(full.invalid_tool_calls) <= len(invalid)
        invalid_seen += len(full.invalid_tool_calls)
    # every cut inside the three calls' arguments (some 100 characters)
    assert invalid_seen >= sum(len(json.dumps(a, ensure_ascii=False)) for _, a in CALLS) - 3


def test_name_arrives_before_the_arguments_end() -> None:
    chunker = ToolCallChunker()
    _, chunks = chunker.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert chunks[0]["name"] == "get_weather"
    assert chunks[0]["args"] == '{"city": "Par'


def test_cut_call() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    content, calls, (cut,) = parse_reply(text, HERMES, cut_call_error("length", None))
    assert (content, calls) == ("Sure.", [])
    assert cut["name"] == "get_weather" and cut["args"] == '{"city": "Pa'
    assert cut["error"] == "the reply ended inside this tool call (max_tokens reached)"
    content, calls, invalid = parse_reply(TEXT, HERMES, "unused")
    assert (content, [(c.name, c.arguments) for c in calls], invalid) == (
        "Let me check.",
        CALLS,
        [],
    )
    full = run(text, [7] * 20)
    assert full.content == "Sure."  # the cut call is not content as well


def test_what_cut_a_call_is_named() -> None:
    # A stop sequence inside a call was reported as "max_tokens reached".
    assert cut_call_error("stop", "Pa") == (
        "the stop sequence 'Pa' ended the reply inside this tool call"
    )
    assert cut_call_error("stop", 7) == "the stop token id 7 ended the reply inside this tool call"
    assert "max_tokens reached" in cut_call_error("length", None)
    # The context ended it (fewer tokens than max_tokens): raising max_tokens would do nothing.
    assert cut_call_error("length", None, 200) == (
        "the reply ended inside this tool call: the context of 200 tokens was full (raise "
        "max_seq_len or shorten the conversation)"
    )


MISTRAL = ToolCallFormat("mistral", tag_token_id=5)
MISTRAL_V11 = ToolCallFormat("mistral", tag_token_id=5, args_token_id=6)
LLAMA3 = ToolCallFormat("llama3_json", tag_token_id=7)


HERMES = ToolCallFormat("hermes")
CUT = '{"name": "get_weather", "arguments": {"city": "Pa'  # args so far: {"city": "Pa
# Per format: a reply whose second call is cut (max_tokens, a stop sequence or token).
CUT_REPLIES = {
    "hermes": (
        HERMES,
        'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\n'
        + CUT,
    ),
    "mistral": (MISTRAL, 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, ' + CUT),
    "mistral_v11": (
        MISTRAL_V11,
        'Sure.[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',
    ),
    "llama3_json": (
        LLAMA3,
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; '
        + CUT.replace('"arguments"', '"parameters"'),
    ),
}


@pytest.mark.parametrize("form", CUT_REPLIES)
@pytest.mark.parametrize("calls_before", [0, 1])
def test_every_format_treats_a_cut_call_the_same(form: str, calls_before: int) -> None:
    # Mistral and Llama 3 calls cut by max_tokens or a stop sequence were left in the content,
    # markup and all; then, cut in a later call, they lost the calls before it and were one
    # invalid call named after the first, with all the calls' text as its arguments.
    tool_format, text = CUT_REPLIES[form]
    if not calls_before:  # the same reply without its first call
        text = {
            "hermes": "Sure.\n<tool_call>\n" + CUT,
            "mistral": "Sure. [TOOL_CALLS] [" + CUT,
            "mistral_v11": 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',
            "llama3_json": "<|python_tag|>" + CUT.replace('"arguments"', '"parameters"'),
        }[form]
    content = "" if form == "llama3_json" else "Sure."
    error = cut_call_error("stop", "Pa")
    got_content, calls, invalid = parse_reply(text, tool_format, error)
    assert got_content == content
    assert [(c.name, c.arguments) for c in calls] == [("f", {"a": 1})] * calls_before
    assert [(c["name"], c["args"], c["error"]) for c in invalid] == [
        ("get_weather", '{"city": "Pa', error)
    ]
    for size in (1, 5, len(text)):
        full = run(text, [size] * len(text), tool_format)
        assert full.content == content
        streamed = [(c["name"], c["args"]) for c in full.tool_calls]
        assert streamed == [("f", {"a": 1})] * calls_before
        if form == "hermes":
            # Hermes arguments stream as written: the cut call's chunks went out before the cut
            # showed (LangChain's partial-JSON merge read them as a call); they end unreadable.
            (cut,) = full.invalid_tool_calls
            assert (cut["name"], cut["args"]) == ("get_weather", '{"city": "Pa"]')
        else:  # calls stream whole at the end: the cut one is left out
            assert streamed == [("f", {"a": 1})] * calls_before
            assert len(full.tool_call_chunks) == calls_before


@pytest.mark.parametrize(
    "tool_format, text, content, args",
    [
        (HERMES, "Sure.\n<tool_call>", "Sure.", ""),
        (HERMES, '<tool_call>\n{"na', "", '\n{"na'),
        (MISTRAL, "Sure. [TOOL_CALLS]", "Sure.", ""),
        (MISTRAL, 'Sure. [TOOL_CALLS] [{"na', "Sure.", '{"na'),
        (MISTRAL_V11, "Sure.[TOOL_CALLS]get_wea", "Sure.", "get_wea"),
        (LLAMA3, '{"na', "", '{"na'),
    ],
)
def test_a_call_cut_before_its_name_is_complete(
    tool_format: ToolCallFormat, text: str, content: str, args: str
) -> None:
    got_content, calls, (cut,) = parse_reply(text, tool_format, "cut")
    assert (got_content, calls, cut["name"], cut["args"]) == (content, [], None, args)
    full = run(text, [3] * len(text), tool_format)
    assert full.content == content and full.tool_call_chunks == []


def test_whole_calls_are_no_cut() -> None:
    whole = '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]'
    assert parse_reply(whole, MISTRAL, "cut")[1][0].arguments == {"a": 1}
    # A call complete but for the closing of its calls: a call (as a Hermes call without its end tag).
    content, calls, invalid = parse_reply(whole[:-1], MISTRAL, "cut")
    assert (content, [(c.name, c.arguments) for c in calls], invalid) == ("", [("f", {"a": 1})], [])
    for tool_format, _ in CUT_REPLIES.values():
        assert parse_reply("Just text.", tool_format, "cut") == ("Just text.", [], [])


@pytest.mark.parametrize("text", ['{"answer": "yes"}', '{"sunny": true, "name": "Paris"}'])
def test_a_json_answer_beside_tools_is_the_content(text: str) -> None:
    # Llama 3 calls are bare JSON: the JSON answer of a response_format beside tools came back as
    # an invalid tool call with no content (invoke) and as nothing at all (stream).
    assert parse_reply(text, LLAMA3, "cut") == (text, [], [])
    for size in (1, 4, len(text)):
        full = run(text, [size] * len(text), LLAMA3)
        assert (full.content, full.tool_call_chunks) == (text, [])


def test_tool_choice_spellings() -> None:
    names = ["a", "b"]
    assert normalize_tool_choice(None, names) == "auto"
    assert normalize_tool_choice("any", names) == "required"
    assert normalize_tool_choice(True, names) == "required"
    assert normalize_tool_choice(False, names) == "none"
    assert normalize_tool_choice({"type": "function", "function": {"name": "b"}}, names) == "b"
    assert normalize_tool_choice({"type": "tool", "name": "a"}, names) == "a"
    assert normalize_tool_choice({"type": "any"}, names) == "required"


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "note", "arguments": {"text": "end it with </tool_call> and',
        '<tool_call>\n{"name": "note", "arguments": {"text": "start with <tool_call> then',
        # Both tags, then the cut (the bundled model under a grammar, max_tokens): the block was
        # closed at the inner end tag, its markup content and the rest a call named None.
        '<tool_call>\n{"name": "note", "arguments": {"text": "apples</tool_call> <tool_call> {", "qty": 4',
    ],
)
def test_tags_inside_a_cut_calls_strings_are_its_text(text: str) -> None:
    # split_cut_call looked for the last start tag and any end tag without reading JSON strings:
    # the call's markup came back as content, or as a call named None with a piece of its text.
    content, calls, invalid = parse_reply(text, HERMES, "cut")
    args = text[text.index('{"text"') :]
    assert (content, calls, [(c["name"], c["args"]) for c in invalid]) == ("", [], [("note", args)])
    assert HERMES.ended_inside_call(text)
    for pieces in ([len(text)], [7] * (len(text) // 7 + 1), [1] * len(text)):
        full = run(text, pieces)  # streamed: no markup in the content, the call's text once
        assert full.content == "" and full.tool_calls == []
        (cut,) = full.tool_call_chunks  # its arguments, then the end that makes them unreadable
        assert cut["name"] == "note" and cut["args"][: len(args)] == args
        assert [c["args"] for c in full.invalid_tool_calls] == [cut["args"]]


@pytest.mark.parametrize("form", CUT_REPLIES)
def test_a_reply_cut_inside_a_call_is_told_from_one_that_ended_after_its_calls(form: str) -> None:
    # finish_reason said "tool_calls" (the turn ended after its calls) for a reply a stop sequence
    # ended inside its second call; it is "stop" then, so that the cut shows.
    from brisklm import LLM
    from brisklm.outputs import GenerationOutput, Usage
    from brisklm.tool_calls import turn_finish_reason

    tool_format, text = CUT_REPLIES[form]
    whole = {
        "hermes": TEXT,
        "mistral": '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]',
        "mistral_v11": '[TOOL_CALLS]f[ARGS]{"a": 1}',
        "llama3_json": '<|python_tag|>{"name": "f", "parameters": {"a": 1}}',
    }[form]
    assert tool_format.ended_inside_call(text)
    assert not tool_format.ended_inside_call(whole)
    for reply, expected in ((text, "stop"), (whole, "tool_calls")):
        chunker = ToolCallChunker(tool_format)
        chunker.feed(reply)
        chunker.finish()
        assert chunker.cut == (expected == "stop")
        _, _, invalid = parse_reply(reply, tool_format, "cut")
        assert turn_finish_reason("stop", True, bool(invalid)) == expected
        output = GenerationOutput("r", None, [1], reply, [2], "stop", Usage(1, 1), stop_reason="x")
        chat = LLM.chat_output(output, tool_format)
        assert chat.finish_reason == (expected if chat.tool_calls else "stop")


@pytest.mark.parametrize(
    "tool_format, text",
    [
        (HERMES, '<tool_call>\n{"name": "get_weather", "arguments'),
        (MISTRAL, 'Sure. [TOOL_CALLS] [{"name": "get_weather", '),
        (MISTRAL_V11, "Sure.[TOOL_CALLS]get_weather[ARGS]"),
    ],
)
def test_a_call_cut_after_its_name_has_no_arguments_yet(
    tool_format: ToolCallFormat, text: str
) -> None:
    # Its arguments were the call's markup ('\n{"name": "get_weather", "arguments').
    _, calls, (cut,) = parse_reply(text, tool_format, "cut")
    assert (calls, cut["name"], cut["args"]) == ([], "get_weather", "")


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_a_block_that_fails_to_parse_leaves_the_next_call_its_own_index(size: int) -> None:
    """Decoded freely, a block whose head was whole (its name and arguments went out) may fail to
    parse: it is content, and the call after it streams at the next index, not into it."""
    failed = '<tool_call>\n{"name": "f", "arguments": {"a": 1}, oops}\n</tool_call>'
    unsent = "<tool_call>\n{oops}\n</tool_call>"  # fails before its head: nothing went out
    call = '<tool_call>\n{"name": "%s", "arguments": {"b": [2]}}\n</tool_call>'
    text = f"Hi {failed}\n{call % 'g'}\n{unsent}\n{call % 'h'}"
    full = run(text, [size] * len(text))
    assert [(c["index"], c["name"], c["args"]) for c in full.tool_call_chunks] == [
        (0, "f", '{"a": 1}'),
        (1, "g", '{"b": [2]}'),
        (2, "h", '{"b": [2]}'),
    ]
    content, calls, invalid = parse_reply(text, HERMES, "stop")
    assert content == full.content and [c.name for c in calls] == ["g", "h"] and not invalid
    assert content.startswith(f"Hi {failed}") and content.endswith(unsent)


@pytest.mark.parametrize("size", [1, 3])
def test_a_call_cut_after_a_failed_block_is_at_its_own_index(size: int) -> None:
    failed = '<tool_call>\n{"name": "f", "arguments": {}, oops}\n</tool_call>'
    text = f'{failed}\n<tool_call>\n{{"name": "g", "arguments": {{"b": 1'
    chunker = ToolCallChunker()
    for start in range(0, len(text), size):
        chunker.feed(text[start : start + size])
    chunker.finish()
    assert chunker.cut and chunker.cut_arguments() == [(1, '{"b": 1', len('{"b": 1'))]
