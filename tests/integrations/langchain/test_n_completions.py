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
    with pytest.raises(ValueError, match="n must be 1 when streaming"):
        next(iter(chat.stream(MESSAGES)))
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
