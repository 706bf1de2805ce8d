"""ChatBrisk and BriskLLM with n: several completions of a call, as ChatOpenAI returns them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from langchain_brisklm import BriskLLM, ChatBrisk
from tests.integrations.langchain.conftest import TINY_ENGINE
from tests.integrations.langchain.test_chat_tools import QUESTION, TOOLS, assert_valid_calls

SAMPLED = {"temperature": 1.0, "max_tokens": 12, "seed": 21, **TINY_ENGINE}
MESSAGES = [HumanMessage("Hello there")]


@pytest.fixture
def chat(tiny_chat_dir: Path) -> ChatBrisk:
    return ChatBrisk(model=str(tiny_chat_dir), n=3, **SAMPLED)


def texts(result: Any) -> list[str]:
    return [g.text for g in result.generations]


def test_chat_n_gives_a_generation_a_completion_seeded_apart(chat: ChatBrisk) -> None:
    result = chat._generate(MESSAGES)
    assert len(result.generations) == 3
    alone = [chat.model_copy(update={"n": 1, "seed": 21 + i}).invoke(MESSAGES) for i in range(3)]
    assert texts(result) == [m.content for m in alone]
    # As ChatOpenAI's: every message carries the call's usage, the prompt counted once.
    usage = result.llm_output["token_usage"]
    assert usage["prompt_tokens"] == alone[0].usage_metadata["input_tokens"]
    assert usage["completion_tokens"] == sum(m.usage_metadata["output_tokens"] for m in alone)
    for generation in result.generations:
        assert generation.message.usage_metadata["input_tokens"] == usage["prompt_tokens"]
        assert generation.message.usage_metadata["output_tokens"] == usage["completion_tokens"]
    # invoke returns the first, a per-call n overrides the field
    assert chat.invoke(MESSAGES).content == alone[0].content
    assert len(chat._generate(MESSAGES, n=2).generations) == 2


def test_chat_n_parses_each_completions_tool_calls(tiny_chat_dir: Path) -> None:
    chat = ChatBrisk(model=str(tiny_chat_dir), n=2, **{**SAMPLED, "max_tokens": 96})
    bound = chat.bind_tools(TOOLS, tool_choice="any", parallel_tool_calls=False)
    result = bound.bound._generate(  # type: ignore[attr-defined]
        [HumanMessage(QUESTION)],
        **bound.kwargs,  # type: ignore[attr-defined]
    )
    assert len(result.generations) == 2
    for generation in result.generations:
        assert isinstance(generation.message, AIMessage)
        assert len(generation.message.tool_calls) == 1
        assert_valid_calls(generation.message)


def test_async_and_batched_chat_calls_take_n(chat: ChatBrisk) -> None:
    expected = texts(chat._generate(MESSAGES))
    assert texts(asyncio.run(chat._agenerate(MESSAGES))) == expected

    async def batched() -> list[Any]:
        # abatch submits its inputs' requests together (langchain_brisklm._batched): each call
        # gets its own three outputs back.
        from langchain_brisklm._batched import BatchSubmission
        from langchain_brisklm.chat_models import _BATCH

        token = _BATCH.set(BatchSubmission())
        try:
            return await asyncio.gather(
                chat._agenerate(MESSAGES), chat._agenerate([HumanMessage("Bye")])
            )
        finally:
            _BATCH.reset(token)

    first, second = asyncio.run(batched())
    assert texts(first) == expected
    assert texts(second) == texts(chat._generate([HumanMessage("Bye")]))
    assert [m.content for m in chat.batch([MESSAGES, MESSAGES])] == [expected[0]] * 2


def test_a_stream_is_one_completion(tiny_chat_dir: Path, chat: ChatBrisk) -> None:
    with pytest.raises(ValueError, match="n must be 1 when streaming"):
        ChatBrisk(model=str(tiny_chat_dir), n=2, streaming=True)
    # stream() (a chain streaming through the model) yields the first completion whole
    (whole,) = list(chat.stream(MESSAGES))
    assert whole.content == chat.invoke(MESSAGES).content
    with pytest.raises(ValueError, match="n must be 1 when streaming"):
        list(chat._stream(MESSAGES))
    with pytest.raises(ValueError, match="n must be 1 when streaming"):
        BriskLLM(model=str(tiny_chat_dir), n=2, streaming=True)
    single = chat.model_copy(update={"n": 1})
    assert "".join(c.content for c in single.stream(MESSAGES)) == single.invoke(MESSAGES).content


def test_llm_n_gives_each_prompt_its_completions(tiny_chat_dir: Path) -> None:
    llm = BriskLLM(model=str(tiny_chat_dir), n=2, **SAMPLED)
    prompts = ["The quick brown fox", "def add(a, b):"]
    result = llm.generate(prompts)
    assert [len(g) for g in result.generations] == [2, 2]
    single = llm.model_copy(update={"n": 1})
    for i, prompt in enumerate(prompts):
        for j in range(2):
            alone = single.model_copy(update={"seed": 21 + j}).invoke(prompt)
            assert result.generations[i][j].text == alone
    usage = result.llm_output["token_usage"]
    infos = [g.generation_info["usage"] for gens in result.generations for g in gens]
    assert usage["prompt_tokens"] == infos[0]["prompt_tokens"] + infos[2]["prompt_tokens"]
    assert usage["completion_tokens"] == sum(i["completion_tokens"] for i in infos)
    again = asyncio.run(llm.agenerate(prompts))
    assert [[g.text for g in gens] for gens in again.generations] == [
        [g.text for g in gens] for gens in result.generations
    ]
    with pytest.raises(ValueError, match="n must be 1 when streaming"):
        next(iter(llm.stream("Hello")))
    with pytest.raises(ValueError, match=r"SamplingParams.n=0"):
        llm.generate(["Hello"], n=0)


def test_n_none_per_call_is_the_default_of_one(tiny_chat_dir: Path, chat: ChatBrisk) -> None:
    llm = BriskLLM(model=str(tiny_chat_dir), n=2, **SAMPLED)
    assert [len(g) for g in llm.generate(["Hello"], n=None).generations] == [1]
    assert len(chat._generate(MESSAGES, n=None).generations) == 1
    assert "".join(c.content for c in chat.stream(MESSAGES, n=None))  # one completion streams


def test_a_call_langchain_would_stream_returns_its_first_completion(chat: ChatBrisk) -> None:
    # astream_events (and any streaming callback handler) sends a chain's call to the streaming
    # path, which takes one completion: a call of several completions is generated whole instead.
    from langchain_core.runnables import RunnableLambda

    chain = RunnableLambda(lambda _: MESSAGES) | chat

    async def events() -> list[dict[str, Any]]:
        return [e async for e in chain.astream_events("x", version="v2")]

    ended = [e for e in asyncio.run(events()) if e["event"] == "on_chat_model_end"]
    assert ended[0]["data"]["output"].content == chat._generate(MESSAGES).generations[0].text


def test_a_cut_structured_reply_names_its_own_token_count(tiny_chat_dir: Path) -> None:
    from langchain_core.exceptions import OutputParserException

    chat = ChatBrisk(model=str(tiny_chat_dir), n=3, **{**SAMPLED, "max_tokens": 5})
    schema = {
        "title": "Person",
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 60}},
        "required": ["name"],
    }
    structured = chat.with_structured_output(schema, method="json_schema")
    with pytest.raises(OutputParserException, match="cut off after 5 tokens"):
        structured.invoke(MESSAGES)
    result = chat._generate(MESSAGES, response_format={"type": "json_object"})
    own = [g.message.response_metadata["completion_tokens"] for g in result.generations]
    assert sum(own) == result.llm_output["token_usage"]["completion_tokens"]
