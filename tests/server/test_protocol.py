"""The server's reading of OpenAI request bodies, without a model: messages as chat templates
read them, prompts, tool choices and the errors that name the field."""

from __future__ import annotations

import pytest

from brisklm.server import protocol
from brisklm.server.protocol import ApiError


def test_messages_are_read_as_templates_read_them() -> None:
    messages = protocol.chat_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
        ]
    )
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "content": "2", "tool_call_id": "c1"},
    ]


def test_an_assistants_refusal_in_the_history_is_what_it_said() -> None:
    # OpenAI's refusal field, and a content part of type refusal ("has no content" before).
    messages = protocol.chat_messages(
        [
            {"role": "user", "content": "Help me with X"},
            {"role": "assistant", "content": None, "refusal": "I can't help with that."},
            {"role": "user", "content": "Why?"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "It is unsafe."}]},
        ]
    )
    assert [m["content"] for m in messages] == [
        "Help me with X",
        "I can't help with that.",
        "Why?",
        "It is unsafe.",
    ]
    with pytest.raises(ApiError, match="a part other than text"):  # an assistant's only
        protocol.chat_messages([{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}])


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ("hi", "non-empty list"),
        ([{"role": "user"}], "has no content"),
        ([{"role": "tool", "content": "2"}], "tool_call_id"),
        (
            [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}],
            "not an assistant",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}],
            "arguments is not valid JSON",
        ),
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                }
            ],
            "JSON object",
        ),
    ],
)
def test_bad_messages_name_what_is_wrong(messages, words) -> None:
    with pytest.raises(ApiError, match=words) as error:
        protocol.chat_messages(messages)
    assert error.value.param == "messages" and error.value.status == 400


def test_prompts_take_openais_four_shapes() -> None:
    assert protocol._prompts("a") == ["a"]
    assert protocol._prompts(["a", "b"]) == ["a", "b"]
    assert protocol._prompts([1, 2]) == [[1, 2]]
    assert protocol._prompts([[1], [2, 3]]) == [[1], [2, 3]]
    for bad in ([], [True], [[1], "a"], [[]], 3):
        with pytest.raises(ApiError, match="prompt must be"):
            protocol._prompts(bad)


def test_tool_choice() -> None:
    assert protocol._tool_choice(None, []) == "auto"
    assert protocol._tool_choice("none", ["f"]) == "none"
    assert protocol._tool_choice({"type": "function", "function": {"name": "f"}}, ["f"]) == "f"
    with pytest.raises(ApiError, match="needs tools"):
        protocol._tool_choice("required", [])
    with pytest.raises(ApiError, match="must be"):
        protocol._tool_choice("any", ["f"])


def test_sampling_fields_map_to_sampling_params() -> None:
    body = {
        "max_tokens": 5,
        "stop": "x",
        "logit_bias": {"7": -100},
        "guided_regex": "a+",
        "top_k": 3,
    }
    assert protocol.sampling_changes(body) == {
        "max_tokens": 5,
        "stop": ["x"],
        "logit_bias": {7: -100},
        "regex": "a+",
        "top_k": 3,
    }
    with pytest.raises(ApiError, match="token ids") as error:
        protocol.sampling_changes({"logit_bias": {"a": 1}})
    assert error.value.param == "logit_bias"
    assert protocol.choices_wanted({"n": 3}) == 3 and protocol.choices_wanted({}) == 1
    for bad in (0, 129, 2.0, True, "2"):
        with pytest.raises(ApiError, match="n must be") as error:
            protocol.choices_wanted({"n": bad})
        assert error.value.param == "n"


def test_stream_options() -> None:
    assert protocol.stream_options({}) == protocol.StreamOptions(False, False)
    options = protocol.stream_options({"stream": True, "stream_options": {"include_usage": True}})
    assert options == protocol.StreamOptions(True, True)
    with pytest.raises(ApiError, match="unknown key"):
        protocol.stream_options({"stream": True, "stream_options": {"usage": True}})
    with pytest.raises(ApiError, match="true or false"):
        protocol.stream_options({"stream": "yes"})


def test_usage_counts_each_prompt_once() -> None:
    from brisklm.outputs import Usage, choices_usage

    usages = [Usage(10, 3, 0), Usage(10, 5, 8), Usage(4, 1, 0), Usage(4, 2, 3)]
    assert choices_usage(usages, 2) == Usage(14, 11, 0)
    assert choices_usage(usages, 1) == Usage(28, 11, 11)
