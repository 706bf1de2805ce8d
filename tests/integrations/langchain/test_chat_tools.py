"""ChatBrisk tool calling on the tiny random model: every tool_choice, several calls, streaming.

A random model writes nonsense, but the grammar makes whatever it calls a valid call: known names,
arguments valid under the schemas. Bounded schemas (enums, bounded integers) keep calls short.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field

from langchain_brisklm import ChatBrisk

QUESTION = "What is the weather in Paris, and what is magic_function(3)?"


@tool
def get_weather(city: Literal["Paris", "Tokyo", "Lima"], unit: Literal["C", "F"] = "C") -> str:
    """Get the current weather in a city."""
    return f"Sunny in {city}"


class MagicArgs(BaseModel):
    input: int = Field(..., gt=-1000, lt=1000)


@tool(args_schema=MagicArgs)
def magic_function(input: int) -> int:
    """Apply a magic function to an input."""
    return input + 2


TOOLS = [get_weather, magic_function]
SCHEMAS = {t.name: convert_to_openai_tool(t)["function"]["parameters"] for t in TOOLS}


def tool_call_token(chat: ChatBrisk) -> int:
    token = chat._engine().tokenizer.token_to_id("<tool_call>")
    assert token is not None
    return token


def assert_valid_calls(message: BaseMessage, allowed: set[str] | None = None) -> None:
    assert isinstance(message, AIMessage)
    assert not message.invalid_tool_calls
    for call in message.tool_calls:
        assert call["name"] in (allowed or SCHEMAS)
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])
        assert call["id"] and call["type"] == "tool_call"


def streamed(runnable: Any, prompt: Any, **kwargs: Any) -> AIMessageChunk:
    full = None
    for chunk in runnable.stream(prompt, **kwargs):
        full = chunk if full is None else full + chunk
    assert isinstance(full, AIMessageChunk)
    return full


@pytest.mark.parametrize("tool_choice", ["any", "required", True])
def test_any_forces_valid_calls(chat: ChatBrisk, tool_choice: Any) -> None:
    message = chat.bind_tools(TOOLS, tool_choice=tool_choice, parallel_tool_calls=False).invoke(
        QUESTION
    )
    assert len(message.tool_calls) == 1
    assert message.content == ""
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert_valid_calls(message)


@pytest.mark.parametrize(
    "tool_choice",
    ["magic_function", {"type": "function", "function": {"name": "magic_function"}}],
)
def test_named_tool_is_called(chat: ChatBrisk, tool_choice: Any) -> None:
    message = chat.bind_tools(TOOLS, tool_choice=tool_choice).invoke(QUESTION)
    assert [c["name"] for c in message.tool_calls] == ["magic_function"]
    assert_valid_calls(message)


def test_several_calls_in_one_turn(tiny_chat_dir: Any) -> None:
    # Sampling with seeds: every complete call is valid, and some turn holds several calls. About
    # a third of the turns do on this model; seeds are tried until one has (seed 7 at present) and
    # at least six turns have been checked.
    counts: list[int] = []
    for seed in range(20):
        if len(counts) >= 6 and max(counts) >= 2:
            break
        chat = ChatBrisk(
            model=str(tiny_chat_dir), temperature=1.0, seed=seed, max_tokens=160, device="cpu",
            max_batch_size=4, max_seq_len=1536,
        )  # fmt: skip
        message = chat.bind_tools(TOOLS, tool_choice="any").invoke(QUESTION)
        assert message.tool_calls
        assert_valid_calls(message)
        if message.response_metadata["finish_reason"] == "tool_calls":
            assert message.content == ""
        counts.append(len(message.tool_calls))
    assert max(counts) >= 2, counts


def test_auto_lets_the_model_choose(chat: ChatBrisk) -> None:
    message = chat.bind_tools(TOOLS).invoke(QUESTION)
    assert_valid_calls(message)
    # Pushing the model to open a tool call: it must then write a valid one.
    pushed = chat.bind_tools(TOOLS).bind(logit_bias={tool_call_token(chat): 100.0})
    message = pushed.invoke(QUESTION)
    assert message.tool_calls
    assert_valid_calls(message)


def test_none_never_calls(chat: ChatBrisk) -> None:
    # Without tools the push makes the model write <tool_call>; with tool_choice="none" the
    # grammar keeps the reply free of calls all the same.
    assert "<tool_call>" in chat.bind(logit_bias={tool_call_token(chat): 100.0}).invoke("Hi").text
    bound = chat.bind_tools(TOOLS, tool_choice="none")
    message = bound.bind(logit_bias={tool_call_token(chat): 100.0}).invoke(QUESTION)
    assert message.tool_calls == []
    assert "<tool_call>" not in message.content
    assert message.response_metadata["finish_reason"] in ("stop", "length")


def test_streamed_calls_match_invoke(chat: ChatBrisk) -> None:
    bound = chat.bind_tools(TOOLS, tool_choice="any", parallel_tool_calls=False)
    message = bound.invoke(QUESTION)
    full = streamed(bound, QUESTION)
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [
        (c["name"], c["args"]) for c in message.tool_calls
    ]
    assert full.tool_call_chunks and full.tool_call_chunks[0]["index"] == 0
    assert json.loads(full.tool_call_chunks[0]["args"]) == message.tool_calls[0]["args"]
    assert full.response_metadata["finish_reason"] == "tool_calls"
    assert full.usage_metadata == message.usage_metadata


async def test_async_tool_calls(chat: ChatBrisk) -> None:
    bound = chat.bind_tools(TOOLS, tool_choice="magic_function")
    message = await bound.ainvoke(QUESTION)
    full = None
    async for chunk in bound.astream(QUESTION):
        full = chunk if full is None else full + chunk
    assert [c["args"] for c in full.tool_calls] == [c["args"] for c in message.tool_calls]
    assert_valid_calls(message, {"magic_function"})


def test_tool_forms(chat: ChatBrisk) -> None:
    class Person(BaseModel):
        """Record a person."""

        age: int = Field(ge=0, le=120)

    def lookup(code: Literal["a", "b"]) -> str:
        """Look a code up.

        Args:
            code: The code.
        """
        return code

    openai_dict = {
        "type": "function",
        "function": {
            "name": "flag",
            "description": "Set a flag.",
            "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}},
        },
    }
    tools = [Person, lookup, get_weather, openai_dict]
    for name in ("Person", "lookup", "get_weather", "flag"):
        message = chat.bind_tools(tools, tool_choice=name).invoke("Go")
        assert [c["name"] for c in message.tool_calls] == [name]


def test_tool_choice_errors(chat: ChatBrisk) -> None:
    with pytest.raises(ValueError, match="not bound"):
        chat.bind_tools(TOOLS, tool_choice="nope")
    with pytest.raises(ValueError, match="unrecognised"):
        chat.bind_tools(TOOLS, tool_choice={"type": "weird"})


def test_agent_loop_history_renders(chat: ChatBrisk) -> None:
    """A turn after a tool result: AI tool calls and tool messages go through the template."""
    history = [
        HumanMessage(QUESTION),
        AIMessage("", tool_calls=[{"name": "magic_function", "args": {"input": 3}, "id": "c1"}]),
        ToolMessage("5", tool_call_id="c1"),
    ]
    message = chat.bind_tools(TOOLS).invoke(history)
    assert isinstance(message, AIMessage)
    assert_valid_calls(message)


def test_cut_call_is_an_invalid_tool_call(chat: ChatBrisk) -> None:
    message = chat.bind_tools(TOOLS, tool_choice="get_weather").invoke(QUESTION, max_tokens=20)
    assert message.response_metadata["finish_reason"] == "length"
    assert message.tool_calls == [] and message.content == ""
    (cut,) = message.invalid_tool_calls
    assert "max_tokens" in cut["error"]
    # The context, not max_tokens, ended it: the error said "max_tokens reached", which raising
    # max_tokens does nothing about.
    prompt = message.usage_metadata["input_tokens"]
    tight = chat.model_copy(update={"max_seq_len": prompt + 10})
    message = tight.bind_tools(TOOLS, tool_choice="get_weather").invoke(QUESTION, max_tokens=90)
    assert message.response_metadata["finish_reason"] == "length"
    assert message.usage_metadata["output_tokens"] == 10
    (cut,) = message.invalid_tool_calls
    assert cut["error"] == (
        f"the reply ended inside this tool call: the context of {prompt + 10} tokens was full "
        "(raise max_seq_len or shorten the conversation)"
    )
    assert message.response_metadata["cut_tool_call"] is True
    # Without max_tokens, whose default is the room left in the context: "max_tokens reached".
    unset = tight.model_copy(update={"max_tokens": None})
    message = unset.bind_tools(TOOLS, tool_choice="get_weather").invoke(QUESTION)
    assert message.usage_metadata["output_tokens"] == 10
    (cut,) = message.invalid_tool_calls
    assert f"the context of {prompt + 10} tokens was full" in cut["error"]


def test_a_call_cut_in_a_stream_merges_into_an_invalid_tool_call(chat: ChatBrisk) -> None:
    """LangChain parses a merged call's arguments as partial JSON: a stream cut inside a call's
    arguments merged into a valid call with the arguments so far ({"city": "S"} of "San
    Francisco", {} before the first value), which an agent would run. Cut at every token before
    its end, the stream's call is invalid where invoke's is, with the same name."""
    bound = chat.bind_tools(TOOLS, tool_choice="get_weather")
    whole = bound.invoke(QUESTION)
    (call,) = whole.tool_calls
    length = whole.usage_metadata["output_tokens"]
    cuts = 0
    for max_tokens in range(1, length):
        message = bound.invoke(QUESTION, max_tokens=max_tokens)
        full = streamed(bound, QUESTION, max_tokens=max_tokens)
        calls = [(c["name"], c["args"]) for c in message.tool_calls]
        assert [(c["name"], c["args"]) for c in full.tool_calls] == calls, max_tokens
        if calls:  # whole but for its end tag: a call in both
            assert calls == [(call["name"], call["args"])] and not full.invalid_tool_calls
            continue
        if not full.invalid_tool_calls:  # cut before the arguments began: nothing was sent
            continue
        cuts += 1
        (cut,) = full.invalid_tool_calls
        (expected,) = message.invalid_tool_calls
        assert cut["name"] == expected["name"] == call["name"]
        assert cut["args"].startswith(expected["args"]), (cut["args"], expected["args"])
        assert full.response_metadata["cut_tool_call"] is True
    assert cuts >= 5  # the arguments' tokens
    (streamed_call,) = streamed(bound, QUESTION).tool_calls  # a whole call is unchanged
    assert (streamed_call["name"], streamed_call["args"]) == (call["name"], call["args"])


def test_a_stop_sequence_does_not_cut_a_call(chat: ChatBrisk) -> None:
    """As OpenAI's, stop sequences apply to the text before the calls: '"arguments"' cut this
    call, which came back invalid (reported as "max_tokens reached" before that was mended, the
    stream leaving the call's markup in content)."""
    whole = chat.bind_tools(TOOLS, tool_choice="get_weather").invoke(QUESTION)
    assert whole.response_metadata["finish_reason"] == "tool_calls"
    bound = chat.bind_tools(TOOLS, tool_choice="get_weather", stop=['"arguments"', "Paris"])
    message = bound.invoke(QUESTION)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert not message.invalid_tool_calls
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        (c["name"], c["args"]) for c in whole.tool_calls
    ]
    full = streamed(bound, QUESTION)
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [
        (c["name"], c["args"]) for c in whole.tool_calls
    ]


# ------------------------------------------------------------------ input validation
class PickCity(BaseModel):
    """Pick a city."""

    city: Literal["Paris", "Tokyo", "Lima"]


def test_per_call_tools_are_formatted_like_bind_tools(chat: ChatBrisk) -> None:
    # A pydantic class (and a function dict) passed per call, as bind_tools would take them.
    bound = chat.bind_tools([PickCity], tool_choice="PickCity").invoke(QUESTION)
    per_call = chat.invoke(QUESTION, tools=[PickCity], tool_choice="PickCity")
    assert [c["name"] for c in per_call.tool_calls] == ["PickCity"]
    assert [c["args"] for c in per_call.tool_calls] == [c["args"] for c in bound.tool_calls]
    assert PickCity.model_validate(per_call.tool_calls[0]["args"])
    message = chat.invoke(QUESTION, tools=[{"name": "f"}], tool_choice="any", max_tokens=24)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("f", {})]


@pytest.mark.parametrize(
    ("tools", "error", "match"),
    [
        ([{"type": "function", "function": {"parameters": {}}}], ValueError, r"tools\[0\] has no name"),
        ([{"type": "function", "function": {"name": "", "parameters": {}}}], ValueError, r"tools\[0\] needs a non-empty string name"),
        ([PickCity, {"name": 3}], ValueError, r"tools\[1\] needs a non-empty string name"),
        ([42], ValueError, r"tools\[0\] cannot be used as a tool"),
        ([{"title": "T", "type": "string"}], ValueError, "must be an object schema"),
        ([{"name": "T", "parameters": {"type": "string"}}], ValueError, "must be an object schema"),
        ([{"name": "T", "parameters": "x"}], ValueError, "must be a JSON Schema object"),
        ([PickCity, {"name": "PickCity", "parameters": {}}], ValueError, r"tools\[1\] and tools\[0\] are both named 'PickCity' with different"),
        (PickCity, TypeError, r"tools must be a list .*got the class PickCity \(put a single tool in a list"),
        # A LangChain tool is a pydantic object, iterable over its fields: it was read as a list
        # of ("name", "get_weather") pairs, "tools[0] cannot be used as a tool".
        (get_weather, TypeError, r"tools must be a list .*got StructuredTool \(put a single tool in a list"),
        (PickCity(city="Paris"), TypeError, "tools must be a list of tools .*got PickCity$"),
    ],
)  # fmt: skip
def test_bad_tools_are_refused(chat: ChatBrisk, tools: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        chat.bind_tools(tools)
    with pytest.raises(error, match=match):  # per call, the same checks
        chat.invoke(QUESTION, tools=tools)


def test_a_tool_given_twice_is_kept_once(chat: ChatBrisk) -> None:
    # The same form twice, or a class and its JSON Schema (which adds property titles).
    same = [PickCity, get_weather, PickCity, PickCity.model_json_schema()]
    bound = chat.bind_tools(same)
    assert bound.kwargs["tools"] == chat.bind_tools([PickCity, get_weather]).kwargs["tools"]
    # A property named "title" is a property, not an annotation.
    titled = {"name": "t", "parameters": {"properties": {"title": {"type": "string"}}}}
    untitled = {"name": "t", "parameters": {"properties": {}}}
    with pytest.raises(ValueError, match="both named 't' with different schemas"):
        chat.bind_tools([titled, untitled])


@pytest.mark.parametrize(
    "tool_choice",
    ["any", "required", True, "get_weather", {"type": "function", "function": {"name": "f"}}],
)
def test_a_required_call_needs_tools(chat: ChatBrisk, tool_choice: Any) -> None:
    with pytest.raises(ValueError, match="needs at least one tool"):
        chat.bind_tools([], tool_choice=tool_choice)
    with pytest.raises(ValueError, match="needs at least one tool"):
        chat.invoke(QUESTION, tool_choice=tool_choice)


@pytest.mark.parametrize("tool_choice", ["auto", "none", None, False])
def test_optional_calls_need_no_tools(chat: ChatBrisk, tool_choice: Any) -> None:
    message = chat.bind_tools([], tool_choice=tool_choice).invoke(QUESTION, max_tokens=4)
    assert message.tool_calls == [] and message.content
    assert chat.invoke(QUESTION, tool_choice=tool_choice, max_tokens=4).content == message.content


@pytest.mark.parametrize("parallel", ["no", 0, 1, "false"])
def test_parallel_tool_calls_must_be_a_bool(chat: ChatBrisk, parallel: Any) -> None:
    with pytest.raises(TypeError, match="parallel_tool_calls must be True, False or None"):
        chat.bind_tools(TOOLS, parallel_tool_calls=parallel)
    with pytest.raises(TypeError, match="parallel_tool_calls must be True, False or None"):
        chat.bind_tools(TOOLS).invoke(QUESTION, parallel_tool_calls=parallel)


def test_call_options_are_checked_before_the_model_loads(tmp_path: Any) -> None:
    chat = ChatBrisk(model=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="needs at least one tool"):
        chat.invoke(QUESTION, tool_choice="any")
    with pytest.raises(ValueError, match="response_format"):
        chat.invoke(QUESTION, response_format="json")
    with pytest.raises(FileNotFoundError):
        chat.invoke(QUESTION)


class Node(BaseModel):
    """A tree node."""

    value: int
    children: list[Node] = []


def test_a_recursive_pydantic_tool_keeps_its_recursion(tiny_chat_dir: Any) -> None:
    # langchain's conversion cut the cycle with {} (any value): the grammar let children that
    # are not Nodes through, which the Node model then rejected.
    from brisklm.constrained import Grammar, GrammarCompiler
    from brisklm.tokenizer import Tokenizer
    from brisklm.tool_calls import tool_call_grammar
    from langchain_brisklm._tools import format_tools

    @tool
    def plant(tree: Node) -> str:
        """Plant a tree."""
        return "planted"

    tokenizer = Tokenizer.from_pretrained(tiny_chat_dir)
    compiler = GrammarCompiler(tokenizer)
    for given, name, arguments in (
        (Node, "Node", {"value": 1, "children": [{"value": 2}]}),
        (plant, "plant", {"tree": {"value": 1, "children": [{"value": 2}]}}),
    ):
        (formatted,) = format_tools([given])
        parameters = formatted["function"]["parameters"]
        assert "$defs" in parameters and "title" not in parameters
        grammar = tool_call_grammar([formatted], "required")

        def accepts(args: Any, name: str = name, grammar: str = grammar) -> bool:
            body = json.dumps({"name": name, "arguments": args})
            tokens = tokenizer.encode(f"<tool_call>\n{body}\n</tool_call>", False)
            matcher = compiler.compile(Grammar(grammar)).matcher()
            return matcher.accept_tokens(tokens) == len(tokens) and matcher.is_accepting()

        assert accepts(arguments)
        bad = json.loads(json.dumps(arguments).replace('{"value": 2}', '"not a node"'))
        assert not accepts(bad)
    # Not recursive: langchain's conversion as before (definitions inlined)
    assert "$defs" not in format_tools([get_weather])[0]["function"]["parameters"]
