"""Tool-call formats of Llama 3 and Mistral beside Hermes: detection, parsing, streaming, grammars,
and chat turns end to end on tiny models whose templates show calls in each format."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from brisklm import LLM, SamplingParams
from brisklm.tool_calls import ContentDelta, ToolCall, ToolCallComplete
from brisklm.tool_formats import (
    LLAMA_TAG,
    MISTRAL_TAG,
    ReplyCalls,
    ToolCallFormat,
    detect_tool_call_format,
)
from tests.tiny import make_tiny_checkpoint

# Compact templates in the two families' layouts (written for these tests).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message.role == 'user' %}"
    "{% if tools and loop.last %}[AVAILABLE_TOOLS] {{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST] {{ message.content }}[/INST]"
    "{% elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS] ["
    "{% for call in message.tool_calls %}"
    "{% if call.id is not defined or call.id|length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{% endif %}"
    '{"name": {{ call.function.name|tojson }}, "arguments": {{ call.function.arguments|tojson }}, '
    '"id": "{{ call.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}'
    "{% elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}"
    "{% elif message.role == 'tool' %}[TOOL_RESULTS] "
    '{"content": {{ message.content|tojson }}, "call_id": "{{ message.tool_call_id }}"}'
    "[/TOOL_RESULTS]"
    "{% endif %}{% endfor %}"
)
# Mistral v11+ (Mistral Small 3.x): [TOOL_CALLS]NAME[ARGS]{...} per call.
MISTRAL_V11_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message.role == 'user' %}"
    "{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST]{{ message.content }}[/INST]"
    "{% elif message.role == 'assistant' and message.tool_calls %}"
    "{% for call in message.tool_calls %}"
    "[TOOL_CALLS]{{ call.function.name }}[ARGS]{{ call.function.arguments|tojson }}"
    "{% endfor %}{{ eos_token }}"
    "{% elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}"
    "{% elif message.role == 'tool' %}[TOOL_RESULTS]{{ message.content|tojson }}[/TOOL_RESULTS]"
    "{% endif %}{% endfor %}"
)
LLAMA_TEMPLATE = (
    "{% for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n"
    "{% if message.tool_calls %}{% set call = message.tool_calls[0].function %}"
    '{"name": "{{ call.name }}", "parameters": {{ call.arguments|tojson }}}'
    "{% elif message.content is mapping %}{{ message.content|tojson }}"
    "{% else %}{{ message.content }}{% endif %}<|eot_id|>{% endfor %}"
    "{% if tools %}Respond in the format "
    '{"name": function name, "parameters": dictionary of argument name and its value}. '
    "{{ tools|tojson }}{% endif %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
        },
    },
}
FAMILIES = ["mistral", "mistral_v11", "llama3_json"]
HERMES = ToolCallFormat("hermes")
LLAMA = ToolCallFormat("llama3_json", 7)
MISTRAL = ToolCallFormat("mistral", 9)


def test_grammar_arguments_of_the_wrong_type_are_named() -> None:
    # A dict of tools was iterated by its keys ("got 'type'"); answer_schema="x" was "dictionary
    # update sequence element #0 has length 1; 2 is required".
    for tools in (WEATHER, None, "weather"):
        with pytest.raises(ValueError, match="tools must be a list of tool definitions"):
            HERMES.grammar(tools)  # type: ignore[arg-type]
    for schema in ("x", 5, [1]):
        with pytest.raises(ValueError, match="answer_schema must be a JSON schema"):
            LLAMA.grammar([WEATHER], answer_schema=schema)  # type: ignore[arg-type]


def test_detection_from_the_template() -> None:
    ids = {MISTRAL_TAG: 9, LLAMA_TAG: 7, "[ARGS]": 11}.get
    assert detect_tool_call_format(MISTRAL_TEMPLATE, ids) == MISTRAL
    assert detect_tool_call_format(MISTRAL_V11_TEMPLATE, ids) == ToolCallFormat("mistral", 9, 11)
    assert detect_tool_call_format(LLAMA_TEMPLATE, ids) == LLAMA
    assert detect_tool_call_format("{{ '<tool_call>' }}", ids) == HERMES
    assert detect_tool_call_format(None, ids) == HERMES
    # Hermes tags that are special tokens (Hermes 3 on Llama 3.1) are kept as tokens.
    tags = {"<tool_call>": 5, "</tool_call>": 6}.get
    assert detect_tool_call_format("{{ '<tool_call>' }}", tags) == HERMES
    special = detect_tool_call_format("{{ '<tool_call>' }}", tags, {5, 6})
    assert special == ToolCallFormat("hermes", 5, end_token_id=6) and special.keeps_special_tokens
    assert (HERMES.tag, special.tag) == (None, "<tool_call>")  # a tag only where it is a token
    # A tag the vocabulary lacks: the format still parses, but decoding has nothing to keep.
    assert not detect_tool_call_format(MISTRAL_TEMPLATE, lambda _: None).keeps_special_tokens
    with pytest.raises(ValueError, match="unknown tool-call format 'json'"):
        ToolCallFormat("json")


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('{"name": "f", "parameters": {"x": 1}}', "", [("f", {"x": 1})]),
        (LLAMA_TAG + '{"name": "f", "arguments": {}}', "", [("f", {})]),
        (
            ' {"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
            "",
            [("f", {"x": 1}), ("g", {})],
        ),
        ('{"name": "Ada", "age": 36}', '{"name": "Ada", "age": 36}', []),  # an answer, not a call
        ("Paris is sunny.", "Paris is sunny.", []),
        ('{"name": "f", "parameters": {"x": 1}} trailing', None, []),  # not a call: content
        ('{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON that is not a call
        ('{"name": "f", "parameters": {"x": ', None, []),  # cut off
    ],
)
def test_llama3_json_parse(text: str, content: str | None, calls: list) -> None:
    got_content, got = LLAMA.parse(text)
    assert got_content == (text.strip() if content is None else content)
    assert [(c.name, c.arguments) for c in got] == calls


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (MISTRAL_TAG + ' [{"name": "f", "arguments": {"x": "é"}}]', "", [("f", {"x": "é"})]),
        (
            "Let me check."
            + MISTRAL_TAG
            + '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]',
            "Let me check.",
            [("f", {}), ("g", {})],
        ),
        (MISTRAL_TAG + '{"name": "f", "arguments": {"x": 2}}', "", [("f", {"x": 2})]),
        ("No tools needed.", "No tools needed.", []),
        (MISTRAL_TAG + ' [{"name": "f", "arguments": {"x"', None, []),
        (MISTRAL_TAG + ' [{"oops": 1}]', None, []),
        (MISTRAL_TAG + ' [{"name": "f"}]', None, []),  # a call names its arguments
        # The v11+ layout: NAME, optionally [CALL_ID]ID, [ARGS], then the arguments.
        ("Sure." + MISTRAL_TAG + 'f[ARGS]{"x": "é"}', "Sure.", [("f", {"x": "é"})]),
        (
            MISTRAL_TAG + "f[ARGS]{}" + MISTRAL_TAG + 'g[CALL_ID]a1b2c3d4e[ARGS]{"y": 1}',
            "",
            [("f", {}), ("g", {"y": 1})],
        ),
        (MISTRAL_TAG + 'f{"x": 2}', "", [("f", {"x": 2})]),
        (MISTRAL_TAG + 'f[ARGS]{"x": 2', None, []),
        (MISTRAL_TAG + "two words[ARGS]{}", None, []),
        # An argument may hold the tag's text (the calls were split at every tag: no call parsed).
        (
            MISTRAL_TAG + 'say[ARGS]{"text": "a [TOOL_CALLS] b"}' + MISTRAL_TAG + "g[ARGS]{}",
            "",
            [("say", {"text": "a [TOOL_CALLS] b"}), ("g", {})],
        ),
        (MISTRAL_TAG + 'f[ARGS]{"x": 1} junk', None, []),
    ],
)
def test_mistral_parse(text: str, content: str | None, calls: list) -> None:
    got_content, got = MISTRAL.parse(text)
    assert got_content == (text.strip() if content is None else content)
    assert [(c.name, c.arguments) for c in got] == calls
    for call in got:  # Mistral's templates accept only 9 alphanumeric characters
        assert len(call.id) == 9 and call.id.isalnum()


@pytest.mark.parametrize(
    "tool_format, text, cut",
    [
        (
            LLAMA,
            '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "param',
            ("", ["f"], '{"name": "g", "param'),
        ),
        (LLAMA, LLAMA_TAG, ("", [], "")),
        (MISTRAL, 'Hi. [TOOL_CALLS] [{"name": "f", "arguments": {}}, {"na', ("Hi.", ["f"], '{"na')),
        (MISTRAL, 'Hi. [TOOL_CALLS] [{"name": "f", "arguments": {}}', ("Hi.", ["f"], None)),
        (MISTRAL, "Hi. " + MISTRAL_TAG, ("Hi.", [], "")),
        (
            MISTRAL,
            MISTRAL_TAG + "f[ARGS]{}" + MISTRAL_TAG + 'g[ARGS]{"y',
            ("", ["f"], 'g[ARGS]{"y'),
        ),
        (MISTRAL, 'Hi. [TOOL_CALLS] [{"name": "f", "arguments": {}}]', None),
        (
            MISTRAL,
            MISTRAL_TAG + 'f[ARGS]{"t": "[TOOL_CALLS]"}' + MISTRAL_TAG + 'g[ARGS]{"t": "[TOOL',
            ("", ["f"], 'g[ARGS]{"t": "[TOOL'),
        ),
        (LLAMA, "Just text.", None),
        # A whole JSON value that is no call is an answer (JSON mode, an answer beside tools).
        (LLAMA, ' {"answer": "yes"} ', None),
        (LLAMA, '{"answer": {"name": "f", "parameters": {}}}', None),
        (HERMES, '<tool_call>{"name": "f"', None),
    ],
)
def test_cut_calls(tool_format: ToolCallFormat, text: str, cut: tuple | None) -> None:
    got = tool_format.cut_calls(text)
    if cut is None:
        assert got is None
        return
    # The content, the calls complete before the cut, the text of the call cut (None: no call is).
    assert got is not None
    assert (got[0], [c.name for c in got[1]], got[2]) == cut


@pytest.mark.parametrize(
    ("tool_format", "text", "start"),
    [
        (HERMES, 'Sure. <tool_call>{"name": "f"}</tool_call><tool_call>', 6),
        (HERMES, "No call, only </tool_call> text.", -1),
        (MISTRAL, 'Hi [TOOL_CALLS][{"name": "f"', 3),
        (MISTRAL, "Hi [TOOL_CALLS", -1),
        (LLAMA, ' \n {"name": "f", "parameters": {}}', 3),
        (LLAMA, LLAMA_TAG + '{"name": "f"', 0),
        (LLAMA, 'Text, then {"name": "f"}', -1),  # (parse reads a call only as the whole reply)
        (LLAMA, "  ", -1),
    ],
)
def test_calls_start(tool_format: ToolCallFormat, text: str, start: int) -> None:
    """Where stop strings stop applying: the first call's start, however the text grew."""
    assert tool_format.calls_start(text) == start
    for searched in range(len(text) + 1):  # the text before ``searched`` held no call yet
        if start < 0 or searched <= start:
            assert tool_format.calls_start(text, searched) == start


THOUGHT = "<think>\nuse <tool_call> or [TOOL_CALLS] or {x}\n</think>\n\n"


@pytest.mark.parametrize(
    ("tool_format", "reasoning_start", "text", "start"),
    [
        (HERMES, None, THOUGHT + "<tool_call>{", THOUGHT.index("<tool_call>")),  # no thinking
        (HERMES, False, THOUGHT + "Sure. <tool_call>{", len(THOUGHT) + 6),
        (HERMES, False, THOUGHT[:-12], -1),  # a block cut short: all thinking
        (HERMES, False, "Sure. <tool_call>{", 6),  # a reply that opens no block
        (HERMES, False, " \n<thi", -1),  # not yet known whether it opens one
        (HERMES, True, THOUGHT[8:] + "<tool_call>", len(THOUGHT) - 8),  # the prompt opened it
        (MISTRAL, False, THOUGHT + "[TOOL_CALLS][{", len(THOUGHT)),
        (LLAMA, False, THOUGHT + '{"name": "f"', len(THOUGHT)),
        (LLAMA, False, THOUGHT + 'Text {"name": "f"', -1),
    ],
)
def test_calls_after_the_thinking(tool_format, reasoning_start, text, start) -> None:
    """A call (or its tag) written in the thinking is no call: stop strings stay on past it.
    The same position however the reply grew."""
    calls = ReplyCalls(tool_format, reasoning_start)
    assert calls.calls_start()(text, 0) == start
    for size in (1, 3, 7):
        find, found = calls.calls_start(), -1
        for end in range(size, len(text) + size, size):
            found = find(text[:end], end - size)
            if found >= 0:
                break
        assert found == start, size


@pytest.mark.parametrize("tool_format", [HERMES, LLAMA, MISTRAL], ids=lambda f: f.name)
def test_stream_parser_adds_up_to_the_batch_parse(tool_format: ToolCallFormat) -> None:
    texts = [
        '{"name": "f", "parameters": {"x": 1}}',
        ' \n{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
        LLAMA_TAG + '{"name": "f", "parameters": {}}',
        "<|python_tagline is text",
        "Plain answer,\n with  spaces. ",
        "Checking." + MISTRAL_TAG + ' [{"name": "f", "arguments": {"a": [1, 2]}}]',
        "Checking. " + MISTRAL_TAG + " not json",
        "Two: " + MISTRAL_TAG + 'f[ARGS]{"a": "[ARGS]"}' + MISTRAL_TAG + "g[ARGS]{}",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        "",
    ]
    rng = random.Random(5)
    for text in texts:
        for _ in range(20):
            cuts = sorted(rng.sample(range(1, max(len(text), 2)), min(4, max(len(text) - 1, 0))))
            pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            parser = tool_format.stream_parser()
            events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
            content = "".join(e.text for e in events if isinstance(e, ContentDelta))
            calls = [e.call for e in events if isinstance(e, ToolCallComplete)]
            want_content, want_calls = tool_format.parse(text)
            assert content == want_content, (tool_format.name, pieces)
            assert [(c.name, c.arguments) for c in calls] == [
                (c.name, c.arguments) for c in want_calls
            ]
            assert parser.num_calls == len(want_calls)


def test_content_streams_before_the_calls_begin() -> None:
    parser = MISTRAL.stream_parser()
    assert parser.feed("Let me look ") == [ContentDelta("Let me look")]
    assert parser.feed("that up. [TOOL") == [ContentDelta(" that up.")]
    assert parser.feed('_CALLS] [{"name": "f", "arguments": {}}]') == []
    assert [type(e) for e in parser.finish()] == [ToolCallComplete]
    parser = LLAMA.stream_parser()
    assert parser.feed(" <|py") == []  # may be the tag
    assert parser.feed("thon_tag|>{") == []
    parser = LLAMA.stream_parser()
    assert parser.feed("Sure") == [ContentDelta("Sure")]


def test_tool_call_message_dict_is_the_openai_shape() -> None:
    call = ToolCall("f", {"x": 1}, id="abc123XYZ")
    assert call.to_message_dict() == {
        "id": "abc123XYZ",
        "type": "function",
        "function": {"name": "f", "arguments": {"x": 1}},
    }


def test_mistral_templates_get_nine_character_ids() -> None:
    """Ids from elsewhere (OpenAI's "call_...", LangChain's) are mapped to the 9 characters
    Mistral's templates demand, the same in the call and in the result that answers it."""
    from brisklm.chat_template import render_chat_template

    function = {"name": "get_weather", "arguments": {"unit": "celsius"}}
    call = {"id": "call_0b62d4bd61ca4ba4a01005c2", "type": "function", "function": function}
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "21"},
    ]
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    rendered = render_chat_template(MISTRAL_TEMPLATE, history, [WEATHER], True, special)
    mapped = rendered.split('"id": "')[1][:9]
    assert mapped.isalnum() and rendered.split('"id": "')[1][9] == '"'
    assert call["id"] not in rendered
    assert f'"call_id": "{mapped}"' in rendered  # the result still answers its call
    assert render_chat_template(MISTRAL_TEMPLATE, history, [WEATHER], True, special) == rendered
    history[1] = {"role": "assistant", "tool_calls": [{**call, "id": "abc123XYZ"}]}
    kept = render_chat_template(MISTRAL_TEMPLATE, history, None, True, special)
    assert '"id": "abc123XYZ"' in kept


@pytest.mark.parametrize("source", ["call_1234", "ñandú1234", "١٢٣٤٥٦٧٨٩", "abc 12345"])
def test_nine_characters_other_than_ascii_letters_and_digits_are_mapped(source) -> None:
    # Mistral's ids are [A-Za-z0-9]{9}; str.isalnum() also took Unicode letters and digits.
    from brisklm.tool_call_ids import mistral_tool_call_id

    mapped = mistral_tool_call_id(source)
    assert mapped != source and len(mapped) == 9
    assert re.fullmatch(r"[A-Za-z0-9]{9}", mapped) and mistral_tool_call_id(source) == mapped
    assert mistral_tool_call_id("Ab3dE6gH9") == "Ab3dE6gH9"


# ----------------------------------------------------------------- end to end on tiny models


def _checkpoint(directory: Path, template: str) -> Path:
    from tokenizers import AddedToken, Tokenizer

    make_tiny_checkpoint(directory)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_special_tokens(
        [AddedToken(tag, special=True) for tag in (MISTRAL_TAG, LLAMA_TAG, "[ARGS]")]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    templates = {
        "mistral": MISTRAL_TEMPLATE,
        "mistral_v11": MISTRAL_V11_TEMPLATE,
        "llama3_json": LLAMA_TEMPLATE,
    }
    return {name: _checkpoint(root / name, template) for name, template in templates.items()}


@pytest.fixture(scope="module")
def family_llms(family_dirs: dict[str, Path]):
    llms = {name: LLM.from_pretrained(path, max_batch_size=2) for name, path in family_dirs.items()}
    yield llms
    for llm in llms.values():
        llm.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_forced_call_parses_and_round_trips(family_llms, family: str) -> None:
    llm = family_llms[family]
    tool_format = llm.tool_call_format()
    assert tool_format.name == family.removesuffix("_v11")
    with pytest.raises(ValueError, match="is neither a template of this tokenizer"):
        llm.tool_call_format("no-such-template")  # it was hermes, silently
    assert tool_format.tag_token_id == llm.tokenizer.token_to_id(tool_format.tag)
    assert (tool_format.args_token_id is not None) == (family == "mistral_v11")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    grammar = tool_format.grammar([WEATHER], "required", parallel=False)
    params = SamplingParams(temperature=0.0, max_tokens=160, grammar=grammar)
    reply = llm.chat(messages, params, tools=[WEATHER])
    assert reply.finish_reason == "tool_calls", reply.output.text
    assert [c.name for c in reply.tool_calls] == ["get_weather"]
    assert reply.tool_calls[0].arguments["unit"] in ("celsius", "fahrenheit")
    if family.startswith("mistral"):
        assert reply.output.text.startswith(MISTRAL_TAG)  # the special tag is kept for parsing
        assert len(reply.tool_calls[0].id) == 9
    streamed = "".join(llm.stream_chat(messages, params, tools=[WEATHER]))
    assert streamed == reply.output.text
    # The turn and a tool result go back into the history; the template reads the calls.
    history = [
        *messages,
        reply.message(),
        {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": {"temp": 21}},
    ]
    prompt = llm.tokenizer.decode(llm.chat_prompt_ids(history, tools=[WEATHER]), False)
    assert "get_weather" in prompt and '{"temp": 21}' in prompt


def call_opener(llm: LLM, family: str) -> int:
    """The token that starts the calls: the special tag, or "{" for Llama's bare JSON."""
    if family.startswith("mistral"):
        return llm.tool_call_format().tag_token_id
    (opener,) = llm.tokenizer.encode("{", add_special_tokens=False)
    return opener


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_and_none_grammars(family_llms, family: str) -> None:
    llm = family_llms[family]
    tool_format = llm.tool_call_format()
    messages = [{"role": "user", "content": "Hello"}]
    opener = call_opener(llm, family)

    def reply(mode: str, bias: float, end_bias: float = 0.0):
        grammar = tool_format.grammar([WEATHER], mode, parallel=False)
        eos = llm.tokenizer.eos_token_ids[0]
        params = SamplingParams(
            temperature=0.0,
            max_tokens=160,
            grammar=grammar,
            logit_bias={opener: bias, eos: end_bias},
        )
        return llm.chat(messages, params, tools=[WEATHER])

    # "auto": a model that wants to call gets a valid call ...
    called = reply("auto", 100.0)
    assert [c.name for c in called.tool_calls] == ["get_weather"], called.output.text
    # ... and one that does not writes text, which never starts a call.
    text = reply("auto", -100.0)
    assert not text.tool_calls and text.content
    # ... and may end its text reply whenever it wants (the calls are optional after text).
    ended = reply("auto", -100.0, end_bias=100.0)
    assert ended.finish_reason == "stop" and not ended.tool_calls
    assert len(ended.output.token_ids) == 1
    # "none": the calls' opener is refused however much the model wants it.
    refused = reply("none", 100.0)
    assert not refused.tool_calls
    if family.startswith("mistral"):
        assert MISTRAL_TAG not in refused.output.text
    else:
        assert not refused.output.text.lstrip().startswith("{")


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_takes_openais_tool_choice_and_response_format(family_llms, family: str) -> None:
    """LLM.chat decodes under the tools' grammar as the server and ChatBrisk do, where asked:
    tool_choice "auto" (a model that starts a call makes a valid one), "required", a named
    function, "none", parallel_tool_calls and response_format. Before, chat took no such
    option (a TypeError): the caller had to build the grammar. Without them, as before, the
    reply is decoded freely and its calls parsed."""
    llm = family_llms[family]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    opener = call_opener(llm, family)
    wants_call = SamplingParams(temperature=0, max_tokens=160, logit_bias={opener: 100.0})
    free = llm.chat(ask, wants_call, tools=[WEATHER])
    prompt = llm.chat_prompt_ids(ask, [WEATHER])
    assert free.output.token_ids == llm.generate(prompt, wants_call).token_ids
    for options in ({"tool_choice": "auto"}, {"parallel_tool_calls": False}):
        called = llm.chat(ask, wants_call, tools=[WEATHER], **options)
        assert called.tool_calls[0].name == "get_weather", called.output.text
        assert len(called.tool_calls) == 1 or "parallel_tool_calls" not in options
    assert called.tool_calls[0].arguments["unit"] in ("celsius", "fahrenheit")
    assert not llm.chat(ask, wants_call, tools=[WEATHER], tool_choice="none").tool_calls
    plain = SamplingParams(temperature=0, max_tokens=160)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        forced = llm.chat(
            ask, plain, tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False
        )
        assert forced.finish_reason == "tool_calls" and len(forced.tool_calls) == 1, choice
        streamed = llm.stream_chat(ask, plain, tools=[WEATHER], tool_choice=choice)
        again = asyncio.run(llm.achat(ask, plain, tools=[WEATHER], tool_choice=choice))
        assert "".join(streamed) == again.output.text
    schema = {"type": "object", "properties": {"sunny": {"type": "boolean"}}, "required": ["sunny"]}
    answer = {"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}
    for tools in (None, [WEATHER]):  # (with tools: the answer, not a call)
        reply = llm.chat(
            ask,
            plain.with_changes(max_tokens=20),
            tools,
            tool_choice="none",
            response_format=answer,
        )
        assert isinstance(json.loads(reply.content)["sunny"], bool), tools
    # Bad options are refused, and chat goes on.
    for options, error, words in [
        ({"tool_choice": "required"}, ValueError, "needs tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "x"}}}, ValueError, "not among"),
        ({"tool_choice": "any", "tools": [WEATHER]}, ValueError, 'must be "auto"'),
        (
            {"parallel_tool_calls": "no", "tools": [WEATHER]},
            TypeError,
            "must be True, False or None",
        ),
        ({"parallel_tool_calls": 1, "tools": [WEATHER]}, TypeError, "must be True, False or None"),
        ({"response_format": {"type": "xml"}}, ValueError, "response_format"),
    ]:
        with pytest.raises(error, match=words):
            llm.chat(ask, plain, **options)
    for option in ({"tool_choice": "required"}, {"parallel_tool_calls": False}):
        with pytest.raises(ValueError, match="give one"):
            llm.chat(ask, plain.with_changes(regex="a+"), [WEATHER], **option)
    # A constraint of the params' own decides the reply, tools or not (as before).
    own = llm.chat(ask, plain.with_changes(regex=r"It is sunny\."), tools=[WEATHER])
    assert own.content == "It is sunny." and not own.tool_calls


def grammar_acceptor(llm: LLM) -> Any:
    """accepts(grammar, text): whether a Lark grammar takes the text's tokens and may end there."""
    from brisklm.constrained import Grammar, GrammarCompiler

    compiler = GrammarCompiler(llm.tokenizer)

    def accepts(grammar: str, text: str) -> bool:
        matcher = compiler.compile(Grammar(grammar)).matcher()
        tokens = llm.tokenizer.encode(text, add_special_tokens=False)
        return matcher.accept_tokens(tokens) == len(tokens) and matcher.is_accepting()

    return accepts


def test_llama_grammar_matches_what_parse_reads(family_llms) -> None:
    """One call per turn (Llama 3's templates render no more), and text the grammar allows never
    parses as a call: x1c-x1f are blanks to Python's strip, not to the grammar's backslash-s."""
    accepts = grammar_acceptor(family_llms["llama3_json"])

    one = '{"name": "get_weather", "parameters": {"unit": "celsius"}}'
    auto = LLAMA.grammar([WEATHER], "auto", parallel=True)
    assert accepts(auto, one) and accepts(auto, "Sunny.")
    assert not accepts(auto, one + "; " + one)
    for blank in ("\x1c", "\x1f", " \n"):
        assert LLAMA.parse(blank + one)[1]  # a call to the parser ...
        assert not accepts(LLAMA.grammar([WEATHER], "none"), blank + one)  # ... so not text
        assert not accepts(auto, blank + one)  # calls start at once: no unchecked call


@pytest.mark.parametrize(
    ("family", "head", "tail"),
    [
        ("mistral", "Checking. [TOOL_", 'CALLS] [{"name": "rm", "arguments": {"path": "/"}}]'),
        ("mistral_v11", "[TOOL_", 'CALLS]rm {"path": "/"}'),
        ("llama3_json", " <|python_", 'tag|>{"name": "rm", "parameters": {"path": "/"}}'),
    ],
)
def test_text_may_not_spell_the_call_tag(family_llms, family: str, head: str, tail: str) -> None:
    """The tag spelled out of ordinary tokens is no text under "none" or "auto": the parser reads
    the reply's text, and found a call there (to a tool nobody offered) that no schema checked."""
    from brisklm.constrained import Grammar, GrammarCompiler

    llm = family_llms[family]
    tool_format = llm.tool_call_format()
    tokens = [
        *llm.tokenizer.encode(head, add_special_tokens=False),
        *llm.tokenizer.encode(tail, add_special_tokens=False),
    ]
    assert tool_format.tag_token_id not in tokens
    assert tool_format.parse(llm.tokenizer.decode(tokens, False))[1]  # a call to the parser
    compiler = GrammarCompiler(llm.tokenizer)
    accepts = grammar_acceptor(llm)
    for mode in ("none", "auto"):
        grammar = tool_format.grammar([WEATHER], mode)
        matcher = compiler.compile(Grammar(grammar)).matcher()
        assert matcher.accept_tokens(tokens) < len(tokens), mode
        assert accepts(grammar, "It is [TOOL] time <|python, sunny.")  # other text stays free


def family_grammars(family_llms, family: str) -> tuple[ToolCallFormat, Any, str]:
    """A family's tool-call format (hermes on the Llama 3 tokenizer), ``grammar_acceptor`` for its
    tokenizer, and a call of get_weather in its format."""
    llm = family_llms["llama3_json" if family == "hermes" else family]
    tool_format = HERMES if family == "hermes" else llm.tool_call_format()
    arguments = '{"unit": "celsius"}'
    call = {
        "hermes": f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>',
        "mistral": f'{MISTRAL_TAG}[{{"name": "get_weather", "arguments": {arguments}}}]',
        "mistral_v11": f"{MISTRAL_TAG}get_weather[ARGS]{arguments}",
        "llama3_json": f'{{"name": "get_weather", "parameters": {arguments}}}',
    }[family]
    return tool_format, grammar_acceptor(llm), call


@pytest.mark.parametrize("family", ["hermes", "mistral", "llama3_json"])
def test_tools_beside_an_answer_schema_give_calls_or_that_json(family_llms, family) -> None:
    # OpenAI's tools with a response_format (create_agent's structured answer): the reply is the
    # calls or JSON under the schema, never free text; "required" is calls, "none" the JSON.
    tool_format, accepts, call = family_grammars(family_llms, family)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
    }
    answer = '{"city": "Paris", "sunny": true}'

    def grammar(mode: str) -> str:
        return tool_format.grammar([WEATHER], mode, parallel=False, answer_schema=schema)

    assert accepts(grammar("auto"), answer) and accepts(grammar("auto"), call)
    for wrong in ("Sunny in Paris.", '{"city": "Paris"}', answer + " Bye."):
        assert not accepts(grammar("auto"), wrong)
    assert accepts(grammar("none"), answer) and not accepts(grammar("none"), call)
    assert accepts(grammar("required"), call) and not accepts(grammar("required"), answer)
    assert tool_format.parse(answer) == (answer, [])  # the answer is the reply's content
    assert tool_format.cut_calls(answer) is None and not tool_format.ended_inside_call(answer)
    with pytest.raises(ValueError, match="mode"):
        tool_format.grammar([WEATHER], "bogus", answer_schema=schema)


@pytest.mark.parametrize("family", ["hermes", "mistral", "mistral_v11", "llama3_json"])
def test_a_reasoning_models_thinking_comes_before_the_tools_grammar(family_llms, family) -> None:
    """``thinking`` (LLM.reasoning_start's): the thinking block is free text, where a call tag or
    a "{" is no call, and the grammar applies after it. The Hermes "auto" grammar refused
    "<think>use <tool_call> now</think>..." (the tag committed the reply to a call), and a
    forced call or answer left no room for the block."""
    tool_format, accepts, call = family_grammars(family_llms, family)
    wrong_call = call.replace("celsius", "kelvin")
    thought = "use <tool_call> or {x} now"
    opened, inside = f"<think>\n{thought}\n</think>\n\n", f"\n{thought}\n</think>\n\n"

    def grammar(mode: str, thinking: bool | None, answer: Any = None) -> str:
        return tool_format.grammar([WEATHER], mode, thinking=thinking, answer_schema=answer)

    replies = {"auto": ["Sunny.", call], "required": [call], "none": ["Sunny."]}
    for mode, texts in replies.items():
        for text in texts:
            assert accepts(grammar(mode, False), opened + text), (mode, text)
            assert accepts(grammar(mode, False), text)  # the block is the reply's to open
            assert accepts(grammar(mode, True), inside + text)
            assert not accepts(grammar(mode, True), text)  # ... but the prompt's it must close
        if mode != "none":  # the calls after the thinking are held to their schemas
            assert not accepts(grammar(mode, False), opened + wrong_call)
            assert not accepts(grammar(mode, True), inside + wrong_call)
    assert not accepts(grammar("none", False), opened + call)
    # Blanks before the tag as the reasoning splitter strips them (\x1c-\x1f too, which are no
    # blanks to llguidance's \s): the tag opens the block, so a call in it is no call either.
    assert accepts(grammar("auto", False), "\x1c" + opened + "Sunny.")
    assert not accepts(grammar("auto", False), f"\x1c<think>\nlet me {call}")
    assert not accepts(grammar("required", False), "<think>\nhm")  # a forced call must come
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for mode in ("auto", "none"):
        assert accepts(grammar(mode, False, schema), opened + '{"city": "Paris"}')
        assert accepts(grammar(mode, True, schema), inside + '{"city": "Paris"}')
        assert not accepts(grammar(mode, True, schema), inside + "Sunny.")
    # Without thinking (a template that knows none) the grammar is as it was.
    assert grammar("auto", None) == tool_format.grammar([WEATHER], "auto")
    if family == "hermes":  # the tag in the thinking started a call that had to be whole
        assert not accepts(grammar("auto", None), opened + "Sunny.")


def weather_caller(directory: Any) -> Any:
    """A greedy ChatBrisk on ``directory`` that must call get_weather."""
    pytest.importorskip("langchain_brisklm")
    from langchain_brisklm import ChatBrisk

    chat = ChatBrisk(model=str(directory), temperature=0, max_tokens=160)
    return chat.bind_tools([WEATHER], tool_choice="get_weather")


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_strings_do_not_cut_tool_calls(family_llms, family_dirs, family: str) -> None:
    """A stop string that occurs inside a call (an argument's text, the call's markup) cut the
    call, which came back as content or not at all; as with OpenAI, it now applies only to the
    text before the calls."""
    llm = family_llms[family]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    grammar = llm.tool_call_format().grammar([WEATHER], "required", parallel=False)
    params = SamplingParams(temperature=0.0, max_tokens=160, grammar=grammar)
    whole = llm.chat(messages, params, tools=[WEATHER])
    assert whole.finish_reason == "tool_calls"
    text = whole.output.text
    inside = [text[len(text) // 2 : len(text) // 2 + 3], '"unit"', "}"]
    assert all(piece in text for piece in inside)
    stopped = params.with_changes(stop=inside)
    reply = llm.chat(messages, stopped, tools=[WEATHER])
    assert (reply.finish_reason, reply.output.stop_reason) == ("tool_calls", None)
    assert reply.output.text == text and reply.tool_calls[0].arguments == (
        whole.tool_calls[0].arguments
    )
    assert "".join(llm.stream_chat(messages, stopped, tools=[WEATHER])) == text
    # The same prompt and params as a plain generate cuts at the first one, as asked.
    prompt = llm.chat_prompt_ids(messages, tools=[WEATHER])
    cut = llm.generate(prompt, stopped.with_changes(skip_special_tokens=False))
    assert cut.finish_reason == "stop" and cut.stop_reason in inside and len(cut.text) < len(text)
    message = weather_caller(family_dirs[family]).invoke("Weather in Paris?", stop=inside)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.tool_calls[0]["args"] == whole.tool_calls[0].arguments


@pytest.mark.parametrize("family", FAMILIES)
def test_langchain_tool_calls_in_the_models_format(family_dirs, family: str) -> None:
    bound = weather_caller(family_dirs[family])
    message = bound.invoke("Weather in Paris?")
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    assert message.tool_calls[0]["args"]["unit"] in ("celsius", "fahrenheit")
    streamed = None
    for chunk in bound.stream("Weather in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [
        (c["name"], c["args"]) for c in message.tool_calls
    ]
    if family.startswith("mistral"):
        assert all(len(c["id"]) == 9 for c in streamed.tool_calls + message.tool_calls)


@pytest.mark.parametrize("family", FAMILIES)
def test_langchain_cut_calls_in_the_models_format(family_dirs, family: str) -> None:
    # A call cut by max_tokens was left in the content, markup and all (Hermes made it invalid).
    bound = weather_caller(family_dirs[family])
    whole = bound.invoke("Weather in Paris?")
    cut_at = whole.usage_metadata["output_tokens"] - 3  # inside the call's arguments
    message = bound.invoke("Weather in Paris?", max_tokens=cut_at)
    assert message.response_metadata["finish_reason"] == "length"
    assert (message.content, message.tool_calls) == ("", [])
    (cut,) = message.invalid_tool_calls
    assert cut["name"] == "get_weather"
    assert cut["error"] == "the reply ended inside this tool call (max_tokens reached)"
    assert cut["args"].startswith("{") and MISTRAL_TAG not in cut["args"]
    streamed = None
    for chunk in bound.stream("Weather in Paris?", max_tokens=cut_at):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    assert (streamed.content, streamed.tool_calls, streamed.tool_call_chunks) == ("", [], [])
    assert streamed.response_metadata["finish_reason"] == "length"


def test_hermes_tags_that_are_special_tokens(tmp_path) -> None:
    # Hermes 3 (Llama 3.1) has <tool_call> and </tool_call> as special tokens: decoding dropped
    # them, so no call parsed, and grammars spelled the tags out of other tokens.
    from tokenizers import AddedToken, Tokenizer

    bundled = Path(__file__).parents[1] / "src/brisklm/assets/brisk-chat/tokenizer_config.json"
    directory = _checkpoint(tmp_path / "hermes3", json.loads(bundled.read_text())["chat_template"])
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True) for t in ("<tool_call>", "</tool_call>")]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    with LLM.from_pretrained(directory, max_batch_size=2) as llm:
        start, end = (llm.tokenizer.token_to_id(t) for t in ("<tool_call>", "</tool_call>"))
        tool_format = llm.tool_call_format()
        assert tool_format == ToolCallFormat("hermes", start, end_token_id=end)
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        grammar = tool_format.grammar([WEATHER], "required", parallel=False)
        params = SamplingParams(temperature=0.0, max_tokens=80, grammar=grammar)
        reply = llm.chat(messages, params, tools=[WEATHER])
        assert reply.finish_reason == "tool_calls", reply.output.text
        assert [c.name for c in reply.tool_calls] == ["get_weather"] and reply.content == ""
        ids = reply.output.token_ids
        assert ids[0] == start and ids.count(start) == ids.count(end) == 1
        assert "".join(llm.stream_chat(messages, params, tools=[WEATHER])) == reply.output.text
        history = [*messages, reply.message(), {"role": "tool", "content": "21"}]
        assert llm.chat(history, SamplingParams(max_tokens=2), tools=[WEATHER]).usage
        accepts = grammar_acceptor(llm)
        auto = tool_format.grammar([WEATHER], "auto")
        assert accepts(auto, "It is sunny.")
        # The tag spelled out of other tokens (an unchecked call to the parser) is no text.
        from brisklm.constrained import Grammar, GrammarCompiler

        spelled = [
            *llm.tokenizer.encode("Checking. <tool_", add_special_tokens=False),
            *llm.tokenizer.encode(
                'call>\n{"name": "f", "arguments": {}}', add_special_tokens=False
            ),
        ]
        assert start not in spelled
        matcher = GrammarCompiler(llm.tokenizer).compile(Grammar(auto)).matcher()
        assert matcher.accept_tokens(spelled) < len(spelled)
        assert accepts(auto, "Checking.<tool_call>\n" + ('{"name": "get_weather", "arguments": '
                       '{"unit": "celsius"}}\n</tool_call>'))  # fmt: skip
        call = (
            '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "celsius"}}\n</tool_call>'
        )
        required = tool_format.grammar([WEATHER], "required")
        assert accepts(required, call + "\n" + call) and not accepts(required, "It is sunny.")


@pytest.mark.parametrize(
    ("tool_format", "text"),
    [
        (MISTRAL, 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "argu'),
        (LLAMA, '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "param'),
    ],
)
def test_chat_keeps_the_calls_before_a_cut(tool_format: ToolCallFormat, text: str) -> None:
    # LLM.chat read such a reply as content, markup and all, with no calls (a Hermes reply, and
    # LangChain's reading of every format, keep the calls complete before the cut).
    from brisklm.outputs import GenerationOutput, Usage

    output = GenerationOutput("r", None, [1], text, [2], "length", Usage(1, 1))
    reply = LLM.chat_output(output, tool_format)
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("f", {"a": 1})]
    assert reply.content == ("Sure." if tool_format is MISTRAL else "")
    assert reply.finish_reason == "length"
    assert reply.cut_call == text[text.rindex('{"name": "g') :]  # neither content nor a call
    # Ended at eos, the same text is no cut: content, as parse reads it.
    at_eos = LLM.chat_output(
        GenerationOutput("r", None, [1], text, [2], "stop", Usage(1, 1)), tool_format
    )
    assert (at_eos.content, at_eos.tool_calls) == (text.strip(), [])


def test_chat_drops_a_hermes_call_block_it_ended_inside() -> None:
    """As the server reads it: content and calls before the cut block. LLM.chat kept the block's
    markup as content beside the calls, so reply.message() put a broken call in the history."""
    from brisklm.outputs import GenerationOutput, Usage

    whole = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    for text, content, calls, cut in [
        (f'Sure. {whole}\n<tool_call>\n{{"name": "g', "Sure.", [("f", {"a": 1})], '\n{"name": "g'),
        (
            'Let me see. <tool_call>\n{"name": "f", "argu',
            "Let me see.",
            [],
            '\n{"name": "f", "argu',
        ),
    ]:
        output = GenerationOutput("r", None, [1], text, [2], "length", Usage(1, 1))
        reply = LLM.chat_output(output, HERMES)
        assert (reply.content, [(c.name, c.arguments) for c in reply.tool_calls]) == (
            content,
            calls,
        )
        assert reply.finish_reason == "length" and reply.cut_call == cut
        assert "<tool_call>" not in str(reply.message()["content"])


@pytest.mark.parametrize("finish", [("stop", None), ("length", None), ("stop", "\n\n")])
@pytest.mark.parametrize(
    ("tool_format", "text"),
    [
        (LLAMA, "{x | x > 0} is the set of positive numbers."),
        (LLAMA, '<|python_tag|>brave_search.call(query="weather")'),
        (MISTRAL, "Sure. [TOOL_CALLS] I cannot call that."),
    ],
)
def test_chat_keeps_text_that_only_looks_like_calls(tool_format, text, finish) -> None:
    # With no complete call before it, such text was dropped from the content (it came back "").
    from brisklm.outputs import GenerationOutput, Usage

    reason, stop_reason = finish
    output = GenerationOutput("r", None, [1], text, [2], reason, Usage(1, 1), stop_reason)
    reply = LLM.chat_output(output, tool_format)
    assert (reply.content, reply.tool_calls, reply.cut_call) == (text, [], None)


def test_an_empty_tool_list_renders_as_transformers_renders_it(tmp_path) -> None:
    """tools=[] is a list of no tools, not None (Llama 3.1's template then still writes its
    ipython environment, Mistral Nemo its empty [AVAILABLE_TOOLS]); chat rendered it as None."""
    import transformers

    template = "{{ 'none' if tools is none else tools|length }}|{{ messages[0].content }}"
    directory = _checkpoint(tmp_path / "tools", template)
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    messages = [{"role": "user", "content": "hi"}]
    with LLM.from_pretrained(directory, max_batch_size=1) as llm:
        for tools in ([], None, [WEATHER]):
            ids = llm.chat_prompt_ids(messages, tools=tools)
            expected = reference.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
            assert llm.tokenizer.decode(ids, False) == expected, tools
        assert llm.tokenizer.decode(llm.chat_prompt_ids(messages, tools=[]), False) == "0|hi"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_chat_reply_cut_inside_its_first_call_under_the_grammar_holds_no_markup(
    family_llms, family: str
) -> None:
    """Under the tools' grammar a call's start is a call: a reply max_tokens cut inside its
    first call has no content and no calls (as the server streams it); decoded freely, the
    text stays content (it may only look like a call's start)."""
    llm = family_llms[family]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    short = SamplingParams(temperature=0, max_tokens=4)
    for chat in (llm.chat, lambda *a, **k: asyncio.run(llm.achat(*a, **k))):
        cut = chat(ask, short, tools=[WEATHER], tool_choice="required")
        assert cut.output.finish_reason == "length" and cut.output.text, cut.output.text
        assert (cut.content, cut.tool_calls, cut.finish_reason) == ("", [], "length")
    free = llm.chat_output(cut.output, llm.tool_call_format())
    assert free.content == cut.output.text.strip() and not free.tool_calls


def test_a_mistral_json_call_keeps_the_id_the_model_wrote() -> None:
    """As a v11 reply's [CALL_ID] is kept, so that the next prompt shows the model's own id (an
    audit found it replaced by a random one); an id a Mistral template would refuse is not."""
    for body, kept in [('"id": "abcDEF123"', True), ('"id": "call_1234"', False), ("", False)]:
        text = f'[TOOL_CALLS] [{{"name": "f", "arguments": {{}}{", " if body else ""}{body}}}]'
        (call,) = MISTRAL.parse(text)[1]
        assert (call.id == "abcDEF123") is kept and len(call.id) == 9 and call.id.isalnum()
        if kept:  # and in a reply cut in the call after it
            cut = MISTRAL.cut_calls(text[:-1] + ', {"name": "g')
            assert cut is not None and cut[1][0].id == "abcDEF123"
    # results come back matched by id: one the reply has given already is not kept (a review
    # found two calls with one id), nor is a Llama 3 call's (its calls get call_ ids)
    twice = '{"name": "f", "arguments": {}, "id": "abcDEF123"}'
    ids = [c.id for c in MISTRAL.parse(f"[TOOL_CALLS] [{twice}, {twice}]")[1]]
    assert ids[0] == "abcDEF123" and ids[1] != ids[0]
    v11 = ToolCallFormat("mistral", 9, 11)
    ids = [
        c.id
        for c in v11.parse("[TOOL_CALLS]f[CALL_ID]abc[ARGS]{}[TOOL_CALLS]g[CALL_ID]abc[ARGS]{}")[1]
    ]
    assert ids[0] == "abc" and ids[1] != "abc"
    (llama_call,) = LLAMA.parse('{"name": "f", "parameters": {}, "id": "abcDEF123"}')[1]
    assert llama_call.id.startswith("call_")
