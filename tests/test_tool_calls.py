"""Hermes-style tool-call parsing: batch parser and the streaming parser against it."""

from __future__ import annotations

import random

import pytest

from brisklm.tool_calls import (
    TOOL_CALL_END,
    TOOL_CALL_START,
    ContentDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallDelta,
    ToolCallStreamParser,
    parse_tool_calls,
    unclosed_block_start,
)

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}\n</tool_call>'
SEARCH = (
    '<tool_call>\n{"name": "search", "arguments": {"q": "東京 天気 ☀", "limit": 3}}\n</tool_call>'
)
NO_ARGS = '<tool_call>{"name": "now"}</tool_call>'
STRING_ARGS = '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>'
MALFORMED = '<tool_call>\n{"name": "broken", "arguments": {"x": }\n</tool_call>'
NOT_AN_OBJECT = "<tool_call>[1, 2]</tool_call>"
NO_NAME = '<tool_call>{"arguments": {"x": 1}}</tool_call>'


def _summary(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(call.name, call.arguments) for call in calls]


def test_one_call() -> None:
    content, calls = parse_tool_calls(WEATHER)
    assert content == ""
    assert _summary(calls) == [("get_weather", {"city": "Zürich", "unit": "celsius"})]
    assert calls[0].id.startswith("call_") and len(calls[0].id) == len("call_") + 24


def test_several_calls_in_order_with_unique_ids() -> None:
    content, calls = parse_tool_calls(f"{WEATHER}\n{SEARCH}\n{NO_ARGS}\n{STRING_ARGS}")
    assert content == ""
    assert _summary(calls) == [
        ("get_weather", {"city": "Zürich", "unit": "celsius"}),
        ("search", {"q": "東京 天気 ☀", "limit": 3}),
        ("now", {}),
        ("add", {"a": 1, "b": 2}),
    ]
    assert len({call.id for call in calls}) == 4


def test_no_calls_leaves_text_alone() -> None:
    text = "Plain answer with <b>markup</b> and a <tool_ mention, 😀 done."
    assert parse_tool_calls(text) == (text, [])
    assert parse_tool_calls("") == ("", [])


def test_text_before_between_and_after_calls() -> None:
    content, calls = parse_tool_calls(
        f"Let me check the weather.\n{WEATHER}\nand search:\n{SEARCH}\n"
    )
    assert content == "Let me check the weather.\n\nand search:"
    assert [call.name for call in calls] == ["get_weather", "search"]


@pytest.mark.parametrize("block", [MALFORMED, NOT_AN_OBJECT, NO_NAME])
def test_malformed_blocks_stay_in_content(block: str) -> None:
    content, calls = parse_tool_calls(f"Before {block} {WEATHER} after")
    assert content == f"Before {block}  after"
    assert [call.name for call in calls] == ["get_weather"]


def test_unclosed_final_block() -> None:
    content, calls = parse_tool_calls('Sure.\n<tool_call>\n{"name": "now", "arguments": {}}\n')
    assert (content, _summary(calls)) == ("Sure.", [("now", {})])
    content, calls = parse_tool_calls('Sure.\n<tool_call>\n{"name": "now", "argu')
    assert (content, calls) == ('Sure.\n<tool_call>\n{"name": "now", "argu', [])


def test_a_reply_cut_inside_the_end_tag_of_a_whole_call_has_that_call() -> None:
    # It was content, markup and all ("<tool_call>...</tool_call")
    for cut in range(1, len("</tool_call>")):
        content, calls = parse_tool_calls(
            'Sure.\n<tool_call>\n{"name": "now", "arguments": {}}\n' + "</tool_call>"[:-cut]
        )
        assert (content, _summary(calls)) == ("Sure.", [("now", {})])
    # What is cut off is only an end tag when the call is whole before it
    text = 'Sure.\n<tool_call>\n{"name": "now", "arguments": {}</tool_call'
    assert parse_tool_calls(text) == (text, [])


def test_nested_start_tag_makes_the_block_malformed() -> None:
    text = f"{TOOL_CALL_START} oops {WEATHER}"
    content, calls = parse_tool_calls(text)
    assert calls == []
    assert content == text


# The grammar lets a string argument hold the end tag; it does not end the block.
END_TAG_IN_STRING = (
    '<tool_call>\n{"name": "note", "arguments": {"text": "a </tool_call> b \\" </tool_call>"}}'
    "\n</tool_call> after"
)


def test_end_tag_inside_a_json_string_does_not_end_the_block() -> None:
    content, calls = parse_tool_calls(END_TAG_IN_STRING)
    assert content == "after"
    assert _summary(calls) == [("note", {"text": 'a </tool_call> b " </tool_call>'})]


# A block whose JSON left a string open swallowed the calls after it (its end tag was read as
# inside the string): the block ends at its first end tag when another block follows.
UNCLOSED_STRING_THEN_CALLS = (
    '<tool_call>\n{"name": "a", "arguments": {"q": "x}}\n</tool_call>\nThen '
    f"{WEATHER} and {NO_ARGS}"
)


def test_a_block_with_an_open_string_does_not_swallow_the_calls_after_it() -> None:
    content, calls = parse_tool_calls(UNCLOSED_STRING_THEN_CALLS)
    assert content == '<tool_call>\n{"name": "a", "arguments": {"q": "x}}\n</tool_call>\nThen  and'
    assert [c.name for c in calls] == ["get_weather", "now"]
    # Without a block after it, the block runs on: a call cut inside a string argument that
    # holds the end tag stays one block (content here, an invalid call in LangChain).
    cut = '<tool_call>\n{"name": "note", "arguments": {"text": "end it with </tool_call> and'
    assert parse_tool_calls(cut) == (cut, [])
    # Nor when the tags that follow open no call: a grammar's string may hold both tags (the
    # bundled model wrote this one, cut by max_tokens).
    assert parse_tool_calls(CUT_STRING_WITH_BOTH_TAGS) == (CUT_STRING_WITH_BOTH_TAGS, [])
    assert unclosed_block_start(CUT_STRING_WITH_BOTH_TAGS) == 0  # one block, cut


CUT_STRING_WITH_BOTH_TAGS = (
    '<tool_call>\n{"name": "Order", "arguments": {"items": [{"name": "apples</tool_call> '
    '<tool_call> {", "qty": 4'
)


def _stream(text: str, cuts: list[int]) -> tuple[str, list[ToolCall], list]:
    parser = ToolCallStreamParser()
    events = []
    previous = 0
    for cut in [*cuts, len(text)]:
        events += parser.feed(text[previous:cut])
        previous = cut
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [e.call for e in events if isinstance(e, ToolCallComplete)]
    return content, calls, events


STREAM_TEXTS = [
    WEATHER,
    f"Let me check.\n{WEATHER}\n{SEARCH}",
    f"  padded  {NO_ARGS}  tail  ",
    f"Before {MALFORMED} middle {STRING_ARGS}\n",
    f"{NOT_AN_OBJECT}{NO_NAME}{WEATHER}",
    f"{TOOL_CALL_START} oops {WEATHER}",
    'Sure.\n<tool_call>\n{"name": "now", "arguments": {}}\n',
    'Sure.\n<tool_call>\n{"name": "now", "argu',
    "no calls at all, just < and </ and <tool and </tool_call without start",
    "ends with a partial tag <tool_ca",
    "",
    "   \n  ",
    f"{WEATHER}<",
    END_TAG_IN_STRING,
    UNCLOSED_STRING_THEN_CALLS,
    '<tool_call>\n{"name": "note", "arguments": {"text": "end it with </tool_call> and',
    '<tool_call>\n{"name": "a", "arguments": {"q": "x}}\n</tool_call> no block after',
    CUT_STRING_WITH_BOTH_TAGS,
    # cut inside the end tag of a whole call: the call
    f"Sure.\n{WEATHER[:-1]}",
    f"{WEATHER}\n{SEARCH[:-4]}",
    '<tool_call>\n{"name": "now", "arguments": {}}</tool',
    # blanks after a partial end tag: not a cut inside the tag (the stream parser kept it as
    # content while the batch parser took the call)
    'Sure.\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call\n',
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call ',
]


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_stream_parser_equals_batch_parser_on_random_chunkings(text: str) -> None:
    expected_content, expected_calls = parse_tool_calls(text)
    rng = random.Random(text)
    chunkings = [[], list(range(1, len(text)))]
    for _ in range(60):
        chunkings.append(
            sorted(rng.sample(range(1, len(text)), rng.randint(0, min(8, max(0, len(text) - 1)))))
        )
    for cuts in chunkings:
        content, calls, events = _stream(text, cuts)
        assert content == expected_content, cuts
        assert _summary(calls) == _summary(expected_calls), cuts
        assert [e.index for e in events if isinstance(e, ToolCallComplete)] == list(
            range(len(calls))
        )


def test_stream_separates_content_from_tool_call_text() -> None:
    text = f"Checking 😀\n{WEATHER}"
    content, calls, events = _stream(text, list(range(1, len(text))))
    call_text = "".join(e.text for e in events if isinstance(e, ToolCallDelta))
    assert call_text == WEATHER[len(TOOL_CALL_START) : -len(TOOL_CALL_END)]
    assert all(TOOL_CALL_START[:2] not in e.text for e in events if isinstance(e, ContentDelta))
    assert content == "Checking 😀"
    first_call_event = next(i for i, e in enumerate(events) if not isinstance(e, ContentDelta))
    assert all(isinstance(e, ContentDelta) for e in events[:first_call_event])
    assert isinstance(events[-1], ToolCallComplete) and events[-1].call.name == "get_weather"


def test_stream_emits_content_before_the_end() -> None:
    parser = ToolCallStreamParser()
    assert parser.feed("Hello wor") == [ContentDelta("Hello wor")]
    assert parser.feed("ld <tool") == [ContentDelta("ld")]  # " <tool" may start a tag: held back
    assert parser.feed("box> yes ") == [ContentDelta(" <toolbox> yes")]
    assert parser.finish() == []
    assert parser.num_calls == 0
