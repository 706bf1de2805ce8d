"""BriskLLM on the tiny random model: one engine batch, chains, streaming callbacks, async, stop."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate

from langchain_brisklm import BriskLLM
from tests.integrations.langchain.conftest import TINY_ENGINE

PROMPTS = ["The quick brown fox", "Hello world", "def add(a, b):"]


@pytest.fixture
def llm(tiny_chat_dir: Path) -> BriskLLM:
    return BriskLLM(model=str(tiny_chat_dir), temperature=0, max_tokens=24, **TINY_ENGINE)


def test_logprobs_in_generation_info_as_openai_completions_report_them(llm: BriskLLM) -> None:
    generation = llm.generate(["Hello"], logprobs=True, top_logprobs=2).generations[0][0]
    logprobs = generation.generation_info["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 24
    assert "".join(logprobs["tokens"]).startswith(generation.text[:5])
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in logprobs["top_logprobs"])
    full = None
    for chunk in llm.stream("Hello", logprobs=True, top_logprobs=2):
        assert isinstance(chunk, str)
    from langchain_core.outputs import GenerationChunk

    for chunk in llm._stream("Hello", logprobs=True, top_logprobs=2):
        full = chunk if full is None else full + chunk
    assert isinstance(full, GenerationChunk) and full.text == generation.text
    assert full.generation_info["logprobs"] == logprobs
    assert "logprobs" not in llm.generate(["Hello"]).generations[0][0].generation_info


def test_completion_top_logprobs_keep_the_likeliest_of_alternatives_with_one_text() -> None:
    # Pieces of a character all read U+FFFD: the dict kept the last (least likely) of them.
    from brisklm.openai_format import completion_logprobs
    from brisklm.outputs import TokenLogprob, TopLogprob

    tops = (TopLogprob(5, "\ufffd", -1.0), TopLogprob(6, "a", -2.0), TopLogprob(7, "\ufffd", -3.0))
    entry = TokenLogprob(5, "\ufffd", -1.0, 1, tops)
    assert completion_logprobs([entry])["top_logprobs"] == [{"\ufffd": -1.0, "a": -2.0}]


@pytest.mark.parametrize(
    "settings",
    [
        {"logprobs": "yes"},
        {"logprobs": 1},
        {"logprobs": True, "top_logprobs": True},
        {"logprobs": True, "top_logprobs": "3"},
    ],
)
def test_logprobs_settings_are_not_coerced(settings: dict) -> None:
    # As per call: "yes" or 1 is no flag, True or "3" no count (pydantic's lax mode took them).
    with pytest.raises(ValueError, match="logprobs"):
        BriskLLM(**settings)


def test_a_bad_prompt_of_a_batch_is_named(tiny_chat_dir: Path) -> None:
    # LangChain's BaseLLM.batch fails every prompt with the one error, which did not say which
    long = "word " * 200
    llm = BriskLLM(model=str(tiny_chat_dir), max_tokens=4, **{**TINY_ENGINE, "max_seq_len": 64})
    errors = llm.batch(["Hi", long, "Hello"], return_exceptions=True)
    assert all(str(e).startswith("prompt 1 of 3: the prompt has") for e in errors)
    with pytest.raises(ValueError, match="^the prompt has"):
        llm.invoke(long)


class Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: dict[int, list[str]] = {}

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.setdefault(kwargs.get("prompt_index", 0), []).append(token)


class AsyncTokens(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.tokens: dict[int, list[str]] = {}

    async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.setdefault(kwargs.get("prompt_index", 0), []).append(token)


def test_generate_is_one_engine_batch(llm: BriskLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = llm._engine()
    batches: list[int] = []
    run_requests = engine.run_requests

    def spy(requests: list[Any]) -> Any:
        batches.append(len(requests))
        return run_requests(requests)

    monkeypatch.setattr(engine, "run_requests", spy)
    result = llm.generate(PROMPTS)
    assert batches == [3]
    assert [g[0].text for g in result.generations] == [llm.invoke(p) for p in PROMPTS]
    usage = result.llm_output["token_usage"]
    infos = [g[0].generation_info for g in result.generations]
    assert usage["completion_tokens"] == sum(i["usage"]["completion_tokens"] for i in infos)
    assert usage["prompt_tokens"] == sum(i["usage"]["prompt_tokens"] for i in infos)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert all(i["finish_reason"] in ("stop", "length") for i in infos)
    assert result.llm_output["model_name"] == llm.model_name


def test_chain(llm: BriskLLM) -> None:
    chain = PromptTemplate.from_template("Tell me about {topic}.") | llm | StrOutputParser()
    assert chain.invoke({"topic": "foxes"}) == llm.invoke("Tell me about foxes.")
    assert chain.batch([{"topic": "a"}, {"topic": "b"}]) == [
        llm.invoke("Tell me about a."),
        llm.invoke("Tell me about b."),
    ]


def test_stream_with_callbacks(llm: BriskLLM) -> None:
    expected = llm.invoke(PROMPTS[0])
    handler = Tokens()
    pieces = list(llm.stream(PROMPTS[0], config={"callbacks": [handler]}))
    assert "".join(pieces) == expected
    assert "".join(handler.tokens[0]) == expected


def test_streaming_generate_feeds_callbacks_per_prompt(tiny_chat_dir: Path, llm: BriskLLM) -> None:
    streaming = BriskLLM(
        model=str(tiny_chat_dir), temperature=0, max_tokens=24, streaming=True, **TINY_ENGINE
    )
    handler = Tokens()
    result = streaming.generate(PROMPTS, callbacks=[handler])
    expected = [llm.invoke(p) for p in PROMPTS]
    assert [g[0].text for g in result.generations] == expected
    assert ["".join(handler.tokens[i]) for i in range(len(PROMPTS))] == expected


async def test_async(tiny_chat_dir: Path, llm: BriskLLM) -> None:
    expected = [llm.invoke(p) for p in PROMPTS]
    assert await llm.ainvoke(PROMPTS[0]) == expected[0]
    assert await llm.abatch(PROMPTS) == expected
    result = await llm.agenerate(PROMPTS)
    assert [g[0].text for g in result.generations] == expected
    handler = AsyncTokens()
    pieces = [p async for p in llm.astream(PROMPTS[0], config={"callbacks": [handler]})]
    assert "".join(pieces) == "".join(handler.tokens[0]) == expected[0]
    streaming = BriskLLM(
        model=str(tiny_chat_dir), temperature=0, max_tokens=24, streaming=True, **TINY_ENGINE
    )
    handler = AsyncTokens()
    result = await streaming.agenerate(PROMPTS, callbacks=[handler])
    assert [g[0].text for g in result.generations] == expected
    assert ["".join(handler.tokens[i]) for i in range(len(PROMPTS))] == expected


async def test_a_streaming_batch_that_fails_stops_all_its_prompts(tiny_chat_dir: Path) -> None:
    # A callback that raised on one prompt failed the call, but the other prompts decoded on to
    # max_tokens, calling back for no one (asyncio.gather does not cancel them).
    class StopsPromptZero(AsyncCallbackHandler):
        raise_error = True

        def __init__(self) -> None:
            self.failed = False
            self.after_failure = 0
            self.seen = 0

        async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            self.after_failure += self.failed
            if kwargs.get("prompt_index") == 0:
                self.seen += 1
                if self.seen == 3:
                    raise RuntimeError("enough")

    base = BriskLLM(model=str(tiny_chat_dir), **TINY_ENGINE)
    no_end = {eos: -100.0 for eos in base._engine().tokenizer.eos_token_ids}
    streaming = base.model_copy(
        update={"temperature": 0, "max_tokens": 400, "streaming": True, "logit_bias": no_end}
    )
    handler = StopsPromptZero()
    with pytest.raises(RuntimeError, match="enough"):
        await streaming.agenerate(PROMPTS, callbacks=[handler])
    handler.failed = True
    engine = streaming._engine().engine  # the shared engine: idle once the aborts are done
    for _ in range(200):
        if not engine.has_unfinished:
            break
        await asyncio.sleep(0.01)
    assert not engine.has_unfinished and handler.after_failure == 0


def test_stop_from_init_and_call(tiny_chat_dir: Path, llm: BriskLLM) -> None:
    text = llm.invoke(PROMPTS[0])
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    expected = text[: text.index(stop)]
    assert llm.invoke(PROMPTS[0], stop=[stop]) == expected
    configured = BriskLLM(
        model=str(tiny_chat_dir), temperature=0, max_tokens=24, stop=[stop], **TINY_ENGINE
    )
    assert configured.invoke(PROMPTS[0]) == expected
    assert "".join(configured.stream(PROMPTS[0])) == expected
    result = configured.generate([PROMPTS[0]])
    info = result.generations[0][0].generation_info
    assert info["finish_reason"] == "stop" and info["stop_reason"] == stop


def test_constraints_per_call(llm: BriskLLM) -> None:
    assert re.fullmatch(r"[0-9]{3}-[0-9]{2}", llm.invoke("Code:", regex=r"[0-9]{3}-[0-9]{2}"))
    assert llm.invoke("Pick:", choice=["red", "green"]) in ("red", "green")


def test_identity(llm: BriskLLM, tiny_chat_dir: Path) -> None:
    assert llm._llm_type == "brisklm"
    assert llm._identifying_params["model_name"] == str(tiny_chat_dir)
    params = llm._get_ls_params()
    assert params["ls_provider"] == "brisklm" and params["ls_model_type"] == "llm"
    assert params["ls_max_tokens"] == 24
