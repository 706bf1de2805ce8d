"""Chat template rendering: parity with transformers' apply_chat_template(tokenize=False), tools and errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Literal

import pytest

from brisklm.chat_template import ChatTemplateError, compile_chat_template, render_chat_template
from brisklm.tokenizer import Tokenizer
from brisklm.tool_schema import ToolSchemaError, function_json_schema, pydantic_json_schema
from tests.tokenizer_fixtures import build_byte_level_bpe, build_sentencepiece

transformers = pytest.importorskip("transformers")

QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%Y") %}
{%- endif %}
{%- set ns = namespace(system="", count=0) %}
{%- for message in messages %}
    {%- if message.role == "system" %}{% set ns.system = message.content | trim %}{% continue %}{% endif %}
    {%- set ns.count = ns.count + 1 %}
{%- endfor %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\nToday Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "Tools:\\n" }}
    {%- for t in tools %}{{ t | tojson(indent=4) }}{{ "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- ns.system + "<|eot_id|>" }}
{%- for message in messages if message.role != "system" %}
    {%- if loop.index > 50 %}{% break %}{% endif %}
    {% generation %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

ALTERNATING_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

TOJSON_TEMPLATE = """{%- if tools %}<tools>
{{ tools | tojson(indent=2) }}
</tools>
{% endif %}
{%- for m in messages %}[{{ m.role }}] {{ m | tojson(indent=4, sort_keys=true) }}
{% endfor %}
{%- if add_generation_prompt %}[assistant] {% endif %}{{ dict(a=1, b=[2]) | tojson }}{{ extra_flag }}"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo actuelle d'une ville — température en °C",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "Nom de la ville, p. ex. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant. Réponds en français."},
    {"role": "user", "content": "Ça va? 日本語で答えて 😀 <not a tag>"},
]
TOOL_ROUND_TRIP = [
    {"role": "system", "content": "Use tools when useful."},
    {"role": "user", "content": "What's the weather in Zürich?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {"city": "Zürich", "unit": "celsius"},
                },
            },
            {
                "type": "function",
                "function": {"name": "search", "arguments": {"q": "Zürich météo"}},
            },
        ],
    },
    {"role": "tool", "content": '{"temperature": 21, "sky": "☀"}'},
    {"role": "tool", "content": "no results"},
    {"role": "assistant", "content": "It is 21 °C and sunny ☀."},
    {"role": "user", "content": "Thanks!"},
]
USER_ONLY = [{"role": "user", "content": "  hello  "}]
CONVERSATIONS = [SYSTEM_USER, TOOL_ROUND_TRIP, USER_ONLY]


# In the manner of Qwen3's: the last user query found walking the messages backwards through a
# namespace, reasoning split out of an assistant's content (or taken from reasoning_content) and
# shown only after that query, tool results gathered into one user turn, enable_thinking.
REASONING_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- 'Tools you may call, one <tool_call> block each:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(looking=true, last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.looking and message.role == 'user' and message.content is string
    and not (message.content.startswith('<tool_response>')
    and message.content.endswith('</tool_response>')) %}
{%- set ns.looking = false %}{%- set ns.last_query = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{%- set content = message.content if message.content is string else '' %}
{%- set reasoning = '' %}
{%- if message.reasoning_content is defined and message.reasoning_content is not none %}
{%- set reasoning = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>assistant\n' + content }}
{%- endif %}
{%- for call in message.tool_calls or [] %}
{%- if (loop.first and content) or not loop.first %}{{- '\n' }}{%- endif %}
{%- set call = call.function if call.function else call %}
{{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
{{- call.arguments if call.arguments is string else call.arguments | tojson }}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""
REASONED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "<think>\nThe user wants the weather.\n</think>\n\n",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
    },
    {"role": "tool", "content": '{"temperature": 21}'},
    {"role": "tool", "content": "no alerts"},
    {"role": "assistant", "content": "21 °C.", "reasoning_content": "From the tool."},
    {"role": "user", "content": "<tool_response>\nlate\n</tool_response>"},
]


@pytest.fixture(scope="module")
def chatml_pair(tmp_path_factory: pytest.TempPathFactory):
    directory = build_byte_level_bpe(
        tmp_path_factory.mktemp("chatml") / "tok",
        config_overrides={
            "chat_template": [
                {"name": "default", "template": QWEN25_TEMPLATE},
                {"name": "tool_use", "template": TOJSON_TEMPLATE},
            ]
        },
    )
    return Tokenizer.from_pretrained(directory), transformers.AutoTokenizer.from_pretrained(
        directory
    )


@pytest.fixture(scope="module")
def llama2_pair(tmp_path_factory: pytest.TempPathFactory):
    directory = build_sentencepiece(
        tmp_path_factory.mktemp("llama2") / "tok",
        config_overrides={"chat_template": ALTERNATING_TEMPLATE},
    )
    return Tokenizer.from_pretrained(directory), transformers.AutoTokenizer.from_pretrained(
        directory
    )


@pytest.mark.parametrize(
    "template",
    [QWEN25_TEMPLATE, LLAMA3_TEMPLATE, TOJSON_TEMPLATE, REASONING_TEMPLATE],
    ids=["qwen25", "llama3", "tojson", "reasoning"],
)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL, SEARCH_TOOL]], ids=["no_tools", "tools"])
def test_rendering_matches_transformers(
    chatml_pair, template, add_generation_prompt, tools
) -> None:
    ours, reference = chatml_pair
    conversations = [*CONVERSATIONS, REASONED] if template is REASONING_TEMPLATE else CONVERSATIONS
    for messages in conversations:
        expected = reference.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            chat_template=template,
        )
        rendered = ours.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template=template,
        )
        assert rendered == expected


def test_checkpoint_templates_and_tool_use_selection(chatml_pair) -> None:
    ours, reference = chatml_pair
    assert ours.chat_template == QWEN25_TEMPLATE
    assert set(ours.chat_templates) == {"default", "tool_use"}
    for tools in (None, [WEATHER_TOOL]):
        for messages in CONVERSATIONS:
            expected = reference.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
            assert ours.apply_chat_template(messages, tools=tools) == expected
    assert ours.apply_chat_template(USER_ONLY, tools=[WEATHER_TOOL]).startswith("<tools>\n[\n  {")
    assert ours.apply_chat_template(USER_ONLY).endswith("<|im_start|>assistant\n")
    # transformers' output options: tokenize=False is what this does; the others were template
    # variables, silently (tokenize=True still returned text).
    assert ours.apply_chat_template(USER_ONLY, tokenize=False) == ours.apply_chat_template(
        USER_ONLY
    )
    for option in ({"tokenize": True}, {"return_tensors": "pt"}, {"return_dict": True}):
        with pytest.raises(TypeError, match="returns the rendered text .* tokenizer.encode"):
            ours.apply_chat_template(USER_ONLY, **option)
    assert not ours.apply_chat_template(USER_ONLY, add_generation_prompt=False).endswith(
        "assistant\n"
    )


def test_extra_kwargs_reach_the_template(chatml_pair) -> None:
    ours, reference = chatml_pair
    kwargs = {"date_string": "26 Jul 2024", "extra_flag": "<on>"}
    for template in (LLAMA3_TEMPLATE, TOJSON_TEMPLATE):
        expected = reference.apply_chat_template(
            SYSTEM_USER, tokenize=False, chat_template=template, **kwargs
        )
        rendered = ours.apply_chat_template(
            SYSTEM_USER, add_generation_prompt=False, chat_template=template, **kwargs
        )
        assert rendered == expected
        assert ("26 Jul 2024" in rendered) or ("<on>" in rendered)


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_a_reasoning_template_renders_as_transformers_with_thinking_on_or_off(
    chatml_pair, enable_thinking
) -> None:
    ours, reference = chatml_pair
    messages = REASONED[:-1] + [{"role": "user", "content": "And tomorrow?"}]
    kwargs = {"chat_template": REASONING_TEMPLATE, "enable_thinking": enable_thinking}
    expected = reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert ours.apply_chat_template(messages, add_generation_prompt=True, **kwargs) == expected
    # Reasoning before the last query is dropped; an empty block closes the prompt without it.
    assert "The user wants the weather" not in expected
    assert expected.endswith("assistant\n" if enable_thinking else "<think>\n\n</think>\n\n")


def test_sentencepiece_template_with_bos_eos_and_raise_exception(llama2_pair) -> None:
    ours, reference = llama2_pair
    good = [
        {"role": "user", "content": "Bonjour 😀"},
        {"role": "assistant", "content": "Salut !"},
        {"role": "user", "content": "日本語?"},
    ]
    expected = reference.apply_chat_template(good, tokenize=False)
    assert (
        ours.apply_chat_template(good)
        == expected
        == "<s>[INST] Bonjour 😀 [/INST]Salut !</s>[INST] 日本語? [/INST]"
    )
    with pytest.raises(ValueError, match="Only user and assistant roles are supported"):
        ours.apply_chat_template([*good, {"role": "tool", "content": "c"}])
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        ours.apply_chat_template([{"role": "assistant", "content": "first"}])


def test_message_objects_and_none_fields_render_like_transformers(chatml_pair) -> None:
    ours, reference = chatml_pair

    @dataclass
    class Message:
        role: str
        content: str | None
        tool_calls: list | None = None

    messages = [
        Message("user", "hi"),
        Message("assistant", "hello", None),
        Message("user", "again"),
    ]
    expected = reference.apply_chat_template(
        messages, tokenize=False, chat_template=QWEN25_TEMPLATE
    )
    assert (
        ours.apply_chat_template(
            messages, add_generation_prompt=False, chat_template=QWEN25_TEMPLATE
        )
        == expected
    )
    # Any iterable of them (a generator's were refused as "must be dicts, dataclasses ...")
    assert (
        ours.apply_chat_template(
            (m for m in messages), add_generation_prompt=False, chat_template=QWEN25_TEMPLATE
        )
        == expected
    )


def test_template_errors_are_clear(chatml_pair, tmp_path: Path) -> None:
    ours, _ = chatml_pair
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ours.apply_chat_template(USER_ONLY, chat_template="{% for m in messages %}{{ m.content }")
    with pytest.raises(ChatTemplateError, match="underscore"):
        ours.apply_chat_template(
            USER_ONLY, chat_template="{% set ns = namespace(_x=1) %}{{ ns._x }}"
        )
    with pytest.raises(ChatTemplateError):
        ours.apply_chat_template(USER_ONLY, chat_template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="empty conversation"):
        ours.apply_chat_template([])
    # A str was read character by character ("got 'h'"), None failed in the template's loop.
    for messages in ("hi", None, {"role": "user", "content": "hi"}):
        with pytest.raises(ValueError, match="messages must be a list of message dicts"):
            ours.apply_chat_template(messages)
    with pytest.raises(TypeError, match="chat_template must be a str"):
        ours.apply_chat_template(USER_ONLY, chat_template=5)
    with pytest.raises(ValueError, match="add_generation_prompt must be True or False, got 'no'"):
        ours.apply_chat_template(USER_ONLY, add_generation_prompt="no")
    # A message without content (None or left out) that the template reads is named; a message
    # with tool calls and no content is not (templates write its calls).
    concat = "{% for m in messages %}{{ m['content'] + '|' }}{% endfor %}"
    messages = [
        {"role": "user", "content": None},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        {"role": "user"},
    ]
    with pytest.raises(
        ChatTemplateError,
        match=r"messages\[0\] \(user\), messages\[2\] \(user\) have no content \(None or left",
    ):
        ours.apply_chat_template(messages, chat_template=concat)
    with pytest.raises(ChatTemplateError, match=r"; messages\[0\] \(user\) has no content"):
        ours.apply_chat_template(messages[:1], chat_template=concat)
    with pytest.raises(ChatTemplateError) as other:  # another undefined name: no such hint
        ours.apply_chat_template(messages[:1], chat_template="{{ undefined_thing.x }}")
    assert "content" not in str(other.value)
    plain = Tokenizer.from_pretrained(build_byte_level_bpe(tmp_path / "plain"))
    assert plain.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template(USER_ONLY)


@pytest.mark.parametrize(
    "messages, message",
    [
        ([{"role": 5, "content": "Hi"}], r"messages\[0\]\.role must be a non-empty str, got 5"),
        ([{"content": "Hi"}], r"messages\[0\]\.role must be a non-empty str, got None"),
        (
            [{"role": "system", "content": {5}}, {"role": "user", "content": "Hi"}],
            r"messages\[0\]\.content must be a str, a number, a dict or a list of content blocks "
            r"\(dicts\), got set",
        ),
        ([{"role": "user", "content": ["Hi"]}], r"messages\[0\]\.content must be a str"),
        (
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": "x"}],
            r"messages\[1\]\.tool_calls must be a list, got str",
        ),
        (
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [{"foo": 1}]}],
            r"messages\[1\]\.tool_calls\[0\] must be a dict with a function name",
        ),
    ],
)
def test_malformed_messages_name_the_field(chatml_pair, messages, message) -> None:
    ours, _ = chatml_pair
    with pytest.raises(ValueError, match=message):
        ours.apply_chat_template(messages)


def test_a_number_as_content_renders_as_transformers_renders_it(chatml_pair) -> None:
    # A tool's result given as a number was refused (an audit against transformers, session 75).
    ours, theirs = chatml_pair
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": 4},
    ]
    for tools in (None, [WEATHER_TOOL]):  # (Qwen2.5's template prints it, the other's tojson)
        expected = theirs.apply_chat_template(messages, tools=tools, tokenize=False)
        assert ours.apply_chat_template(messages, tools, add_generation_prompt=False) == expected
        assert "4\n</tool_response>" in expected or '"content": 4,' in expected
    # A template that adds it to a string fails in both, ours naming the types as the cause.
    number_system = [{"role": "system", "content": 7}, {"role": "user", "content": "Hi"}]
    with pytest.raises(TypeError):
        theirs.apply_chat_template(number_system, tokenize=False)
    with pytest.raises(ChatTemplateError, match="check the types of the message fields"):
        ours.apply_chat_template(number_system)


@pytest.mark.parametrize(
    "tools, message",
    [
        ([{"type": "function", "function": {"parameters": {}}}], r"tools\[0\] needs a non-empty"),
        ([{"name": "", "parameters": {}}], r"tools\[0\] needs a non-empty str name, got ''"),
        ([{"name": "f", "parameters": "x"}], r"tools\[0\] \('f'\): parameters must be a JSON"),
        ([{"name": "f"}, {"name": "g"}, {"name": "f"}], r"tools\[2\] and tools\[0\] are both"),
    ],
)
def test_malformed_tools_are_named(chatml_pair, tools, message) -> None:
    ours, _ = chatml_pair
    with pytest.raises(ValueError, match=message):
        ours.apply_chat_template(USER_ONLY, tools=tools)


def test_a_template_name_that_is_not_there_is_an_error_not_the_text(chatml_pair) -> None:
    ours, _ = chatml_pair
    # transformers renders an unknown name as the template: "chatml", whatever the messages.
    with pytest.raises(ValueError, match=r"'chatml' is neither a template of this tokenizer "):
        ours.apply_chat_template(USER_ONLY, chat_template="chatml")
    with pytest.raises(ValueError, match=r"\['default', 'tool_use'\]"):
        ours.apply_chat_template(USER_ONLY, chat_template="tool-use")
    assert ours.apply_chat_template(USER_ONLY, chat_template="tool_use").startswith("[user] {")
    assert (
        ours.apply_chat_template(USER_ONLY, chat_template="{{ messages[0].content }}")
        == (USER_ONLY[0]["content"])
    )
    # Only a tool_use template: it said "several chat templates".
    only_tools = Tokenizer.from_pretrained(ours.name_or_path)
    only_tools.chat_templates = {"tool_use": ours.chat_templates["tool_use"]}
    with pytest.raises(ValueError, match=r"no chat template named 'default', only \['tool_use'\]"):
        only_tools.apply_chat_template(USER_ONLY)


def test_python_errors_inside_a_template_are_template_errors(chatml_pair) -> None:
    ours, _ = chatml_pair
    # Content blocks are valid messages, but a template that concatenates strings fails on them.
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    with pytest.raises(ChatTemplateError, match="failed on these messages \\(TypeError") as error:
        ours.apply_chat_template(blocks, chat_template="{{ 'x' + messages[0].content }}")
    # ... and the error names the message whose content is blocks.
    assert "(messages[0] gives content as a list of blocks" in str(error.value)
    with pytest.raises(ChatTemplateError) as error:  # a failure with text content names none
        ours.apply_chat_template(USER_ONLY, chat_template="{{ 1 / 0 }}")
    assert "list of blocks" not in str(error.value)
    # A template that iterates content blocks renders them.
    template = "{% for b in messages[0].content %}{{ b.text }}{% endfor %}"
    assert ours.apply_chat_template(blocks, chat_template=template) == "Hi"


def test_chat_template_jinja_file_takes_priority(tmp_path: Path) -> None:
    directory = build_byte_level_bpe(
        tmp_path / "tok", config_overrides={"chat_template": "from config"}
    )
    (directory / "chat_template.jinja").write_text("{{ messages[0].content }} from file")
    ours = Tokenizer.from_pretrained(directory)
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    assert (
        ours.apply_chat_template(USER_ONLY)
        == reference.apply_chat_template(USER_ONLY, tokenize=False)
        == "  hello   from file"
    )


def test_templates_compile_once() -> None:
    assert compile_chat_template(QWEN25_TEMPLATE) is compile_chat_template(QWEN25_TEMPLATE)
    template = "{{ bos_token }}{{ messages[0].content }}"
    rendered = render_chat_template(template, USER_ONLY, None, True, {"bos_token": "<s>"})
    assert rendered == "<s>  hello  "


def test_template_variables_may_share_a_parameters_name(tmp_path) -> None:
    """`template` and `special_tokens` are template variables like any other (they collided with
    render_chat_template's own parameters: a bare TypeError "got multiple values")."""
    directory = build_byte_level_bpe(
        tmp_path / "tok",
        config_overrides={"chat_template": "x|{{ template }}|{{ special_tokens }}"},
    )
    ours, reference = (
        Tokenizer.from_pretrained(directory),
        transformers.AutoTokenizer.from_pretrained(directory),
    )
    for variables in ({"template": "T1"}, {"special_tokens": "S1"}):
        assert ours.apply_chat_template(USER_ONLY, add_generation_prompt=False, **variables) == (
            reference.apply_chat_template(USER_ONLY, tokenize=False, **variables)
        )


class Unit(Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


def get_current_temperature(
    location: str, unit: Unit = Unit.CELSIUS, days: int | None = None
) -> float:
    """
    Get the current temperature at a location.

    Args:
        location: The location, in the format "City, Country"
        unit: The unit to return the temperature in.
        days: How many days to average over,
            counting today.

    Returns:
        The temperature as a float.
    """
    return 21.0


def pick(
    choice: str,
    weights: dict[str, float],
    tags: list[str],
    pair: tuple[int, str],
    mode: Literal["a", "b"] = "a",
):
    """Pick something.

    Args:
        choice: What to pick (choices: ["tea", "coffee"])
        weights: Weight per item
        tags: Tags to attach
        pair: A pair
        mode: The mode
    """


def undocumented(x: int):
    """No args block."""


@pytest.mark.parametrize("function", [get_current_temperature, pick])
def test_function_schemas_match_transformers(function) -> None:
    from transformers.utils import get_json_schema

    assert function_json_schema(function) == get_json_schema(function)


def test_a_pydantic_tool_without_a_docstring_has_no_description() -> None:
    # It got pydantic's BaseModel docstring (2,284 characters in the prompt: the bundled model's
    # context could not hold the chat), and a subclass its parent's.
    from pydantic import BaseModel

    class GetWeather(BaseModel):
        city: str

    class Documented(BaseModel):
        """Weather for a city."""

        city: str

    class Child(Documented):
        unit: str

    assert pydantic_json_schema(GetWeather)["function"]["description"] == ""
    assert pydantic_json_schema(Documented)["function"]["description"] == "Weather for a city."
    assert pydantic_json_schema(Child)["function"]["description"] == ""


def test_function_and_pydantic_tools(chatml_pair) -> None:
    import pydantic

    ours, reference = chatml_pair
    expected = reference.apply_chat_template(
        USER_ONLY, tools=[get_current_temperature], tokenize=False, chat_template=QWEN25_TEMPLATE
    )
    assert (
        ours.apply_chat_template(
            USER_ONLY,
            tools=[get_current_temperature],
            add_generation_prompt=False,
            chat_template=QWEN25_TEMPLATE,
        )
        == expected
    )
    with pytest.raises(ToolSchemaError, match="no docstring description for 'x'"):
        function_json_schema(undocumented)

    class Multiply(pydantic.BaseModel):
        """Multiply two integers."""

        a: int = pydantic.Field(description="first factor")
        b: int

    schema = pydantic_json_schema(Multiply)
    assert schema["function"]["name"] == "Multiply"
    assert schema["function"]["description"] == "Multiply two integers."
    assert schema["function"]["parameters"]["required"] == ["a", "b"]
    rendered = ours.apply_chat_template(USER_ONLY, tools=[Multiply], chat_template=QWEN25_TEMPLATE)
    assert json.dumps(schema, ensure_ascii=False) in rendered
    with pytest.raises(ValueError, match="tools must be"):
        ours.apply_chat_template(USER_ONLY, tools=[42], chat_template=QWEN25_TEMPLATE)


def test_continue_final_message_matches_transformers(chatml_pair) -> None:
    ours, reference = chatml_pair
    prefill = [*USER_ONLY, {"role": "assistant", "content": '{"answer": "Zürich'}]
    for template in (QWEN25_TEMPLATE, LLAMA3_TEMPLATE):
        expected = reference.apply_chat_template(
            prefill,
            tokenize=False,
            continue_final_message=True,
            chat_template=template,
            date_string="x",
        )
        rendered = ours.apply_chat_template(
            prefill, continue_final_message=True, chat_template=template, date_string="x"
        )
        assert rendered == expected
        assert rendered.endswith('{"answer": "Zürich')
    with pytest.raises(ValueError, match="no 'content'"):
        ours.apply_chat_template([{"role": "assistant"}], continue_final_message=True)


THINKING_TEMPLATE = (  # as Qwen3's: the reasoning in a <think> block before the content
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
)


@pytest.mark.parametrize("field", ["reasoning_content", "thinking", "reasoning"])
def test_continue_final_message_may_name_the_field_to_continue(chatml_pair, field) -> None:
    # continue_final_message="reasoning_content" (transformers 5) continued the content instead:
    # the <think> block was closed and the model skipped its reasoning.
    ours, reference = chatml_pair
    prefill = [*USER_ONLY, {"role": "assistant", field: "The user asks", "content": ""}]
    kwargs = {"continue_final_message": field, "chat_template": THINKING_TEMPLATE}
    expected = reference.apply_chat_template(prefill, tokenize=False, **kwargs)
    assert ours.apply_chat_template(prefill, **kwargs) == expected
    assert expected.endswith("<think>\nThe user asks")
    with pytest.raises(ValueError, match="no 'reasoning_content' to continue"):
        ours.apply_chat_template(
            USER_ONLY, **{**kwargs, "continue_final_message": "reasoning_content"}
        )
    with pytest.raises(ValueError, match="never reads 'summary'"):
        ours.apply_chat_template(
            [{"role": "assistant", "summary": "x"}], continue_final_message="summary"
        )
    with pytest.raises(TypeError, match="must be a bool or the name"):
        ours.apply_chat_template(prefill, continue_final_message=1)


def test_documents_must_be_dicts(chatml_pair) -> None:
    # A list of strings rendered `d.title` as "<built-in method title of str object at 0x...>".
    ours, _ = chatml_pair
    template = "{% for d in documents %}{{ d.title }}: {{ d.text }}\n{% endfor %}"
    with pytest.raises(ValueError, match=r"documents\[0\] must be a dict .*got str 'Zürich is"):
        ours.apply_chat_template(USER_ONLY, documents=["Zürich is a city"], chat_template=template)
    with pytest.raises(ValueError, match="documents must be a list of dicts"):
        ours.apply_chat_template(USER_ONLY, documents="Zürich", chat_template=template)


def test_sanitize_control_tokens_is_refused_not_ignored(chatml_pair) -> None:
    ours, _ = chatml_pair
    with pytest.raises(TypeError, match="sanitize_control_tokens is not supported"):
        ours.apply_chat_template(USER_ONLY, sanitize_control_tokens=True)


def test_documents_reach_the_template(chatml_pair) -> None:
    ours, reference = chatml_pair
    template = "{% for d in documents %}[{{ d.title }}] {{ d.text }}\n{% endfor %}{{ messages[0].content }}"
    documents = [{"title": "Ville", "text": "Zürich ☀"}]
    expected = reference.apply_chat_template(
        USER_ONLY, documents=documents, tokenize=False, chat_template=template
    )
    assert (
        ours.apply_chat_template(USER_ONLY, documents=documents, chat_template=template) == expected
    )
