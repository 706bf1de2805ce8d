"""ChatBrisk on the tiny random model: messages, streaming, async, usage, metadata, stop, batching."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)

from langchain_brisklm import BriskLLM, ChatBrisk
from langchain_brisklm._engines import loaded_engines
from langchain_brisklm._messages import to_template_messages
from tests.integrations.langchain.conftest import TINY_ENGINE


def test_construction_loads_nothing_and_engines_are_shared(tiny_chat_dir: Path) -> None:
    before = len(loaded_engines())
    models = [ChatBrisk(model=str(tiny_chat_dir), **TINY_ENGINE) for _ in range(3)]
    assert len(loaded_engines()) == before
    engines = {id(m._engine()) for m in models}
    assert len(engines) == 1
    # The same checkpoint by another spelling of its path is the same engine.
    other = ChatBrisk(model=str(tiny_chat_dir / ".." / tiny_chat_dir.name), **TINY_ENGINE)
    assert other._engine() is models[0]._engine()


def test_equivalent_settings_share_an_engine(tiny_chat_dir: Path) -> None:
    # Each of these pairs loaded a second model and KV cache (and their requests did not batch).
    import json

    other_spelling = str(tiny_chat_dir / ".." / tiny_chat_dir.name)
    settings = {**TINY_ENGINE, "max_batch_size": 2}
    pairs = [
        ({"draft": "ngram"}, {"draft": "ngram", "draft_length": "fixed"}),
        ({"draft": str(tiny_chat_dir)}, {"draft": other_spelling, "draft_length": "adaptive"}),
    ]
    context = json.loads((tiny_chat_dir / "config.json").read_text())["max_position_embeddings"]
    unset = {k: v for k, v in settings.items() if k != "max_seq_len"}
    pairs.append(({**unset, "max_seq_len": None}, {**unset, "max_seq_len": min(context, 4096)}))
    for first, second in pairs:
        a = ChatBrisk(model=str(tiny_chat_dir), **{**settings, **first})
        b = ChatBrisk(model=str(tiny_chat_dir), **{**settings, **second})
        assert a._engine() is b._engine(), (first, second)
    # A per-call model given as a Path is the one reported (it was the instance's).
    called = ChatBrisk(model=str(tiny_chat_dir), **TINY_ENGINE).invoke(
        "Hi", model=Path(other_spelling), max_tokens=1
    )
    assert called.response_metadata["model_name"] == other_spelling
    # So may the instance's model and draft (pydantic refused a Path: "a valid string").
    by_path = ChatBrisk(model=Path(other_spelling), draft=Path(tiny_chat_dir), **settings)
    assert by_path.model == other_spelling and by_path.draft == str(tiny_chat_dir)
    assert (
        by_path._engine()
        is ChatBrisk(model=str(tiny_chat_dir), draft=str(tiny_chat_dir), **settings)._engine()
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"device": "tpu"}, "unsupported device 'tpu'"),
        ({"draft": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": -3}, "num_speculative_tokens"),
        ({"draft": "ngram", "draft_length": "bogus"}, "bogus"),
        ({"draft_length": "fixed"}, "draft_length='fixed' needs speculative decoding"),
        ({"num_speculative_tokens": 3}, "num_speculative_tokens=3 needs speculative decoding"),
        ({"draft": "/nonexistent/draft"}, "draft model"),
        ({"top_logprobs": 2}, "top_logprobs=2 needs logprobs=True"),
        ({"logprobs": True, "top_logprobs": 21}, r"top_logprobs must be an int in \[0, 20\]"),
    ],
)
def test_engine_settings_are_checked_at_construction(settings: dict, message: str) -> None:
    # These failed only at the first call, or not at all once an engine of the same key was
    # loaded (the key ignores speculative settings without a draft).
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        ChatBrisk(**settings)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        BriskLLM(**settings)


def test_llm_cache_keys_hold_every_setting_that_changes_outputs(tiny_chat_dir: Path) -> None:
    # BriskLLM's cache key left out logit_bias (and max_seq_len, kv_cache_dtype): with
    # LangChain's LLM cache on, a biased instance got the unbiased one's cached text.
    from langchain_core.caches import InMemoryCache
    from langchain_core.globals import set_llm_cache

    plain = BriskLLM(model=str(tiny_chat_dir), temperature=0, max_tokens=4, **TINY_ENGINE)
    token = plain._engine().tokenizer.encode("#", add_special_tokens=False)[0]
    biased = plain.model_copy(update={"logit_bias": {token: 100.0}})
    set_llm_cache(InMemoryCache())
    try:
        first = plain.invoke("Hello")
        assert biased.invoke("Hello") == "####" != first
    finally:
        set_llm_cache(None)
    for name, value in [("max_seq_len", 512), ("kv_cache_dtype", "bfloat16")]:
        other = plain.model_copy(update={name: value})
        assert other._identifying_params != plain._identifying_params, name


def test_tokens_are_counted_with_the_models_tokenizer(
    chat: ChatBrisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangChain's default counts with GPT-2's tokenizer, fetched from the network (0 offline)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = chat._engine().tokenizer
    text = "Hello there, how are you? Größe 36 – 東京"
    assert chat.get_token_ids(text) == tokenizer.encode(text, add_special_tokens=False)
    assert chat.get_num_tokens(text) == len(chat.get_token_ids(text)) > 0
    history = [
        SystemMessage("Be brief."),
        HumanMessage("Hello"),
        AIMessage("Hi"),
        HumanMessage("Bye"),
    ]
    # The prompt a call renders: what usage reports as its input tokens.
    reply = chat.invoke(history, max_tokens=1)
    assert chat.get_num_tokens_from_messages(history) == reply.usage_metadata["input_tokens"]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with_tools = chat.invoke(history, max_tokens=1, tools=tools)
    assert (
        chat.get_num_tokens_from_messages(history, tools=tools)
        == with_tools.usage_metadata["input_tokens"]
        > reply.usage_metadata["input_tokens"]
    )
    trimmed = trim_messages(
        [HumanMessage("a " * 50), AIMessage("b"), HumanMessage("c")],
        max_tokens=chat.get_num_tokens_from_messages([AIMessage("b"), HumanMessage("c")]),
        token_counter=chat,
        strategy="last",
    )
    assert [m.content for m in trimmed] == ["b", "c"]
    # A completion model's prompt also holds the tokens its tokenizer adds (BOS): counted as
    # usage counts them (get_num_tokens was one short, the count of get_token_ids).
    llm = BriskLLM(model=chat.model, **TINY_ENGINE)
    assert llm.get_token_ids(text) == chat.get_token_ids(text)
    usage = llm.generate([text], max_tokens=1).llm_output["token_usage"]
    assert llm.get_num_tokens(text) == usage["prompt_tokens"] == len(llm.get_token_ids(text)) + 1


def test_token_counting_reads_the_tokenizer_only(tiny_chat_dir: Path) -> None:
    from langchain_brisklm import _engines

    before = len(loaded_engines())
    _engines._tokenizers.clear()
    counter = ChatBrisk(model=str(tiny_chat_dir), **{**TINY_ENGINE, "max_batch_size": 3})
    assert counter.get_num_tokens("Hello there") > 0
    assert len(loaded_engines()) == before  # no model loaded to count tokens


def test_a_bad_model_env_var_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BRISKLM_MODEL", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"\$BRISKLM_MODEL names.*or unset it"):
        ChatBrisk().invoke("Hi")


def test_model_none_is_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # As the README says: model=None is $BRISKLM_MODEL, else the bundled model (it was the
    # bundled model whatever the variable said)
    from langchain_brisklm import BriskLLM

    monkeypatch.setenv("BRISKLM_MODEL", "models/from-env")
    assert ChatBrisk(model=None).model == BriskLLM(model=None).model == "models/from-env"
    monkeypatch.delenv("BRISKLM_MODEL")
    assert ChatBrisk(model=None).model is None


def test_missing_model_fails_on_first_call_with_a_clear_error(tmp_path: Path) -> None:
    chat = ChatBrisk(model=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="no model checkpoint"):
        chat.invoke("hi")
    with pytest.raises(FileNotFoundError, match=r"download it first, e\.g\. `huggingface-cli"):
        ChatBrisk(model="Qwen/Qwen2.5-0.5B-Instruct").invoke("hi")


def test_invoke_usage_and_metadata(chat: ChatBrisk, tiny_chat_dir: Path) -> None:
    message = chat.invoke("Hello")
    assert isinstance(message, AIMessage)
    assert isinstance(message.content, str) and message.content
    usage = message.usage_metadata
    assert usage is not None and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert message.response_metadata["model_name"] == str(tiny_chat_dir)
    assert message.response_metadata["finish_reason"] in ("stop", "length")
    # A prompt that starts as an earlier one did reads that prefix from the cache (prefix
    # caching), as LangChain's input_token_details say.
    system = SystemMessage("You are a helpful assistant. " * 4)
    chat.invoke([system, HumanMessage("Hello")])
    again = chat.invoke([system, HumanMessage("Hello there")]).usage_metadata
    assert again is not None
    assert 20 < again["input_token_details"]["cache_read"] < again["input_tokens"]


def test_generate_over_several_inputs_sums_their_usage(
    chat: ChatBrisk, tiny_chat_dir: Path
) -> None:
    """LangChain's default combination of the runs' llm_output was {}; ChatOpenAI's sums."""
    inputs = [[HumanMessage("Hello")], [HumanMessage("What is 2 + 2?")], [HumanMessage("Bye")]]
    result = chat.generate(inputs, max_tokens=6)
    messages = [generations[0].message for generations in result.generations]
    usage = result.llm_output["token_usage"]
    for key, name in (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens")):
        assert usage[key] == sum(m.usage_metadata[name] for m in messages) > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert result.llm_output["model_name"] == str(tiny_chat_dir)
    assert (
        chat.generate(inputs[:1]).llm_output["token_usage"]["prompt_tokens"]
        == (messages[0].usage_metadata["input_tokens"])
    )


def test_stream_matches_invoke(chat: ChatBrisk) -> None:
    message = chat.invoke("Hello")
    chunks = list(chat.stream("Hello"))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert full.content == message.content
    # The stream's prompt may have been read from the cache the invoke left (input_token_details).
    assert full.usage_metadata is not None and message.usage_metadata is not None
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert full.usage_metadata[key] == message.usage_metadata[key]
    # Input tokens are counted in exactly one chunk, the last, which carries the metadata.
    with_input = [c for c in chunks if c.usage_metadata and c.usage_metadata["input_tokens"]]
    assert len(with_input) == 1 and with_input[0] is chunks[-1]
    assert chunks[-1].chunk_position == "last"
    assert full.response_metadata["model_name"] == message.response_metadata["model_name"]
    assert full.response_metadata["finish_reason"] == message.response_metadata["finish_reason"]


def test_logprobs_in_response_metadata_as_chat_openai_reports_them(chat: ChatBrisk) -> None:
    """logprobs=True (ChatOpenAI's field; top_logprobs the alternatives): one entry a generated
    token in response_metadata["logprobs"]["content"], the same from a stream's chunks added up;
    none without it."""
    assert "logprobs" not in chat.invoke("Hello", max_tokens=4).response_metadata
    reporting = chat.bind(logprobs=True, top_logprobs=3, max_tokens=12)
    message = reporting.invoke("Hello")
    entries = message.response_metadata["logprobs"]["content"]
    assert len(entries) == message.usage_metadata["output_tokens"]
    assert (
        b"".join(bytes(e["bytes"]) for e in entries)
        .decode("utf-8", "replace")
        .startswith(message.content)
    )
    for entry in entries:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]  # greedy: the top one
    full = None
    for chunk in reporting.stream("Hello"):
        full = chunk if full is None else full + chunk
    assert full.content == message.content
    assert full.response_metadata["logprobs"] == message.response_metadata["logprobs"]
    # The logprobs ride on the text chunks: each chunk with text carries its tokens' logprobs
    # (a chunk may hold several tokens: greedy steps run a few to a call).
    chunks = [c for c in reporting.stream("Hello") if c.content]
    assert chunks and all(c.response_metadata["logprobs"]["content"] for c in chunks)
    assert "".join(c.content for c in chat.stream("Hello", max_tokens=12)) == message.content
    plain = ChatBrisk(model=chat.model, temperature=0, max_tokens=12, logprobs=True, **TINY_ENGINE)
    assert [
        e["top_logprobs"] for e in plain.invoke("Hello").response_metadata["logprobs"]["content"]
    ] == [[]] * 12
    # A call may turn off the logprobs a model reports, with their count.
    off = ChatBrisk(
        model=chat.model, temperature=0, logprobs=True, top_logprobs=2, **TINY_ENGINE
    ).invoke("Hello", logprobs=False, max_tokens=12)
    assert "logprobs" not in off.response_metadata and off.content == message.content


def test_logprobs_cover_the_replys_text_not_the_token_that_ends_the_turn() -> None:
    """As ChatOpenAI's: the eos that ends a reply is no text of it, and was listed last."""
    chat = ChatBrisk(temperature=0, max_tokens=40, logprobs=True)  # the bundled model
    message = chat.invoke("Say hi in three words")
    assert message.response_metadata["finish_reason"] == "stop"
    entries = message.response_metadata["logprobs"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in entries).decode() == message.content
    assert len(entries) == message.usage_metadata["output_tokens"] - 1
    full = None
    for chunk in chat.stream("Say hi in three words"):
        full = chunk if full is None else full + chunk
    assert full.response_metadata["logprobs"] == message.response_metadata["logprobs"]


async def test_async_matches_sync(chat: ChatBrisk) -> None:
    message = chat.invoke("Hello")
    assert (await chat.ainvoke("Hello")).content == message.content
    text = "".join([chunk.text async for chunk in chat.astream("Hello")])
    assert text == message.content


async def test_concurrent_calls_share_the_engine(chat: ChatBrisk) -> None:
    prompts = ["Hello", "How are you?", "Tell me a story", "Bye"]
    expected = [chat.invoke(p).content for p in prompts]
    assert [m.content for m in await chat.abatch(prompts)] == expected
    assert [m.content for m in chat.batch(prompts)] == expected
    gathered = await asyncio.gather(*(chat.ainvoke(p) for p in prompts))
    assert [m.content for m in gathered] == expected


def test_stop_sequences_from_init_and_call(chat: ChatBrisk, tiny_chat_dir: Path) -> None:
    text = chat.invoke("Hello").text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip() and text.index(stop) > 0
    expected = text[: text.index(stop)]
    called = chat.invoke("Hello", stop=[stop])
    assert called.text == expected
    assert called.response_metadata["finish_reason"] == "stop"
    assert called.response_metadata["stop_reason"] == stop
    configured = ChatBrisk(
        model=str(tiny_chat_dir), temperature=0, max_tokens=96, stop=[stop], **TINY_ENGINE
    )
    assert configured.invoke("Hello").text == expected
    assert "".join(c.text for c in configured.stream("Hello")) == expected
    # A call's stop sequences replace the configured ones.
    assert configured.invoke("Hello", stop=["\x00never"]).text == text


def test_per_call_sampling_overrides(chat: ChatBrisk) -> None:
    short = chat.invoke("Hello", max_tokens=3)
    assert short.usage_metadata["output_tokens"] == 3
    assert short.response_metadata["finish_reason"] == "length"
    sampled = [chat.invoke("Hello", temperature=1.0, seed=s, max_tokens=8).text for s in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]
    with pytest.raises(TypeError, match="temprature"):
        chat.invoke("Hello", temprature=0)


@pytest.mark.parametrize("cls", [ChatBrisk, BriskLLM])
@pytest.mark.parametrize("setting", ["temprature", "max_new_tokens", "model_name"])
def test_an_unknown_setting_is_an_error_naming_it(cls, setting: str) -> None:
    # LangChain's models ignore unknown fields: ChatBrisk(temprature=0) sampled at the default.
    with pytest.raises(ValueError, match=f"{setting}\n  Extra inputs are not permitted"):
        cls(**{setting: 0})


@pytest.mark.parametrize("cls", [ChatBrisk, BriskLLM])
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"temperature": -1}, r"temperature=-1.0 is invalid: must be a finite float >= 0"),
        ({"top_p": 0}, r"top_p=0.0 is invalid"),
        ({"max_tokens": 0}, r"max_tokens=0 is invalid: must be an int >= 1"),
        ({"stop": [""]}, r"stop=\[''\] is invalid"),
        ({"max_batch_size": 0}, r"max_batch_size must be an int >= 1, got 0"),
        ({"dtype": "float64"}, r"unsupported dtype 'float64'; supported: float32, bfloat16"),
        ({"kv_cache_dtype": "int8"}, r"kv_cache_dtype: unsupported dtype 'int8'"),
    ],
)
def test_a_bad_setting_is_refused_at_construction(cls, setting, message) -> None:
    # It was taken, and the first call failed, wherever in the program that came.
    before = set(loaded_engines())
    with pytest.raises(ValueError, match=message):
        cls(**setting)
    assert set(loaded_engines()) == before  # checked without loading a model
    good = {"temperature": 0.5, "top_p": 0.9, "max_tokens": 4, "stop": ["\n"]}
    good |= {"max_batch_size": 2, "dtype": "bfloat16", "kv_cache_dtype": "auto"}
    cls(**{name: good[name] for name in setting})


def test_the_per_call_stream_switch_of_langchain_core(chat: ChatBrisk) -> None:
    # BaseChatModel reads stream=<bool> in a call's kwargs (streaming on or off for that call)
    # and passes it on: it raised "unexpected keyword argument(s) stream".
    text = chat.invoke("Hello", max_tokens=6).text
    assert chat.invoke("Hello", max_tokens=6, stream=False).text == text
    assert chat.invoke("Hello", max_tokens=6, stream=True).text == text


def test_per_call_model_override(chat: ChatBrisk, tiny_chat_dir: Path) -> None:
    spelled = str(tiny_chat_dir) + "/"
    message = chat.invoke("Hello", model=spelled)
    assert message.response_metadata["model_name"] == spelled
    assert chat._get_ls_params(model=spelled)["ls_model_name"] == spelled


def test_ls_params(chat: ChatBrisk, tiny_chat_dir: Path) -> None:
    params = chat._get_ls_params(stop=["x"])
    assert params["ls_provider"] == "brisklm"
    assert params["ls_model_name"] == str(tiny_chat_dir)
    assert params["ls_model_type"] == "chat"
    assert params["ls_temperature"] == 0
    assert params["ls_max_tokens"] == 96
    assert params["ls_stop"] == ["x"]


def test_conversations_render(chat: ChatBrisk) -> None:
    messages = [
        SystemMessage("You are terse."),
        SystemMessage("Answer in English."),
        HumanMessage("hello", name="ada"),
        HumanMessage([{"type": "text", "text": "how are you"}]),
        AIMessage([{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "fine"}]),
        HumanMessage("and you?"),
    ]
    assert isinstance(chat.invoke(messages), AIMessage)


def test_media_content_is_refused(chat: ChatBrisk) -> None:
    image = {"type": "image", "url": "https://example.com/cat.png"}
    with pytest.raises(ValueError, match="text only"):
        chat.invoke([HumanMessage([{"type": "text", "text": "what is this"}, image])])


# ------------------------------------------------------------------ message conversion
def test_template_messages() -> None:
    messages = [
        SystemMessage("a"),
        SystemMessage("b"),
        HumanMessage("hi", name="ada"),
        HumanMessage("there", name="ada"),
        HumanMessage("I am bob", name="bob"),
        AIMessage(
            [
                {"type": "text", "text": "let me see"},
                {"type": "tool_use", "id": "1", "name": "f", "input": {}},
            ],
            tool_calls=[{"name": "f", "args": {"x": 1}, "id": "1"}],
        ),
        ToolMessage("42", tool_call_id="1"),
        ToolMessage([{"type": "text", "text": "ok"}], tool_call_id="1", name="g"),
        AIMessage("done"),
        AIMessage("really"),
    ]
    assert to_template_messages(messages) == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "hi\n\nthere", "name": "ada"},
        {"role": "user", "content": "I am bob", "name": "bob"},
        {
            "role": "assistant",
            "content": "let me see",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "1", "name": "f"},
        {"role": "tool", "content": "ok", "tool_call_id": "1", "name": "g"},
        {"role": "assistant", "content": "done\n\nreally"},
    ]


@pytest.mark.parametrize(
    "block, message",
    [
        ({"type": "image_url", "image_url": {"url": "x"}}, "text only; a human message has a"),
        ({"type": "audio", "base64": "x"}, "text only"),
        ({"type": "text-plain", "url": "https://example.com/a.txt"}, "refers to a file"),
        ({"type": "weird"}, "type 'weird' in a human message; brisklm reads text, text-plain"),
        ({"type": "non_standard", "value": {}}, "type 'non_standard'"),
    ],
)
def test_unsupported_blocks(block: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_template_messages([HumanMessage([block])])


def test_invalid_tool_calls_go_back_into_the_history() -> None:
    """A call ChatBrisk returned invalid (cut, or arguments that did not parse) vanished from the
    prompt while the tool result answering it stayed; as ChatOpenAI, it goes back as a call."""
    from langchain_core.messages.tool import invalid_tool_call

    ai = AIMessage(
        "",
        tool_calls=[{"name": "f", "args": {"x": 1}, "id": "1"}],
        invalid_tool_calls=[
            invalid_tool_call(name="get_weather", args='{"city": "Par', id="2", error="cut"),
            invalid_tool_call(name="g", args='{"y": 2}', id="3", error="unknown tool"),
            invalid_tool_call(name=None, args="{", id="4", error="cut before its name"),
        ],
    )
    rendered = to_template_messages([ai, ToolMessage("error: cut", tool_call_id="2")])
    assert rendered[0]["tool_calls"] == [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
        {
            "id": "2",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Par'},
        },
        {"id": "3", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}},
    ]
    assert rendered[1] == {
        "role": "tool",
        "content": "error: cut",
        "tool_call_id": "2",
        "name": "get_weather",
    }


def test_langchain_v1_content_blocks() -> None:
    # Each of these raised "unsupported content block type".
    from langchain_core.messages import content as blocks

    ai = AIMessage(
        [
            blocks.create_reasoning_block("thinking it over"),
            {"type": "refusal", "refusal": "I cannot say."},
            {"type": "invalid_tool_call", "id": "2", "name": "f", "args": "{", "error": "cut"},
            {"type": "server_tool_call_chunk", "id": "3", "name": "search", "args": "{"},
            {"type": "server_tool_result", "tool_call_id": "3", "status": "success", "output": 1},
        ]
    )
    human = HumanMessage(
        [blocks.create_plaintext_block("notes: ok"), {"type": "text", "text": "!"}]
    )
    assert to_template_messages([human, ai]) == [
        {"role": "user", "content": "notes: ok!"},
        {"role": "assistant", "content": "I cannot say."},
    ]


@pytest.mark.parametrize("role", [HumanMessage, AIMessage])
def test_every_v1_block_type_is_read_skipped_or_refused_naming_what_is_read(role: type) -> None:
    from langchain_core.messages.content import KNOWN_BLOCK_TYPES

    read = {"text": "a", "text-plain": "b", "refusal": "c"}
    fields = {"text": {"text": "a"}, "text-plain": {"text": "b"}, "refusal": {"refusal": "c"}}
    for kind in sorted(KNOWN_BLOCK_TYPES):
        message = role([{"type": kind, **fields.get(kind, {})}])
        try:
            (rendered,) = to_template_messages([message])
        except ValueError as e:
            # Media refusals did not say what is read.
            assert repr(kind) in str(e) and "brisklm reads text, text-plain" in str(e), kind
        else:
            assert rendered["content"] == read.get(kind, ""), kind


def test_speculative_decoding_keeps_the_output(tiny_chat_dir: Path) -> None:
    plain = ChatBrisk(model=str(tiny_chat_dir), temperature=0, max_tokens=24, **TINY_ENGINE)
    drafted = ChatBrisk(
        model=str(tiny_chat_dir),
        temperature=0,
        max_tokens=24,
        draft="ngram",
        num_speculative_tokens=3,
        **TINY_ENGINE,
    )
    assert plain._engine() is not drafted._engine()  # a speculative engine is its own engine
    assert drafted._engine().engine.speculator is not None
    assert drafted.invoke("Hello there").content == plain.invoke("Hello there").content
    assert drafted._engine().engine.speculator.schedule.schedule == "fixed"  # n-gram's default
    adaptive = drafted.model_copy(update={"draft_length": "adaptive"})
    assert adaptive._engine() is not drafted._engine()
    assert adaptive._engine().engine.speculator.schedule.schedule == "adaptive"
    assert adaptive.invoke("Hello there").content == plain.invoke("Hello there").content
    llm = BriskLLM(
        model=str(tiny_chat_dir), temperature=0, max_tokens=24, draft="ngram", **TINY_ENGINE
    )
    assert llm.invoke("The quick brown fox") == BriskLLM(
        model=str(tiny_chat_dir), temperature=0, max_tokens=24, **TINY_ENGINE
    ).invoke("The quick brown fox")


def test_engine_settings_reach_the_engine(tiny_chat_dir: Path) -> None:
    plain = ChatBrisk(model=str(tiny_chat_dir), temperature=0, max_tokens=12, **TINY_ENGINE)
    tuned = plain.model_copy(update={"prefill_chunk_size": 8, "kv_cache_dtype": "bfloat16"})
    engine = tuned._engine().engine
    assert tuned._engine() is not plain._engine()  # other engine settings, another engine
    assert engine.prefill_chunk_size == 8
    assert engine.runner.kv_cache.keys.dtype == torch.bfloat16
    prompt = "The quick brown fox jumps over the lazy dog, twice: the quick brown fox jumps."
    assert tuned.model_copy(update={"kv_cache_dtype": None}).invoke(prompt).content == (
        plain.invoke(prompt).content
    )
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        plain.model_copy(update={"prefill_chunk_size": 0}).invoke(prompt)
    uncached = plain.model_copy(update={"prefix_caching": False})
    assert uncached._engine() is not plain._engine()
    assert uncached._engine().engine.prefix_cache is None
    assert plain._engine().engine.prefix_cache is not None
    for _ in range(2):  # the second call finds nothing cached
        assert "input_token_details" not in uncached.invoke(prompt).usage_metadata
    small_cache = plain.model_copy(update={"grammar_cache_size": 3})
    assert small_cache._engine() is not plain._engine()
    assert small_cache._engine().engine.structured.compiler.max_cache_size == 3
    with pytest.raises(ValueError, match="grammar_cache_size must be an int >= 1"):
        ChatBrisk(model=str(tiny_chat_dir), grammar_cache_size=0)
    # A token a step: a stream's text a token at a time (several steps a call, the default,
    # give chunks of several); the same text.
    stepwise = plain.model_copy(update={"max_decode_steps": 1, "max_tokens": 12})
    assert stepwise._engine() is not plain._engine()
    assert stepwise._engine().engine.config.max_decode_steps == 1
    several = [c.content for c in plain.model_copy(update={"max_tokens": 12}).stream(prompt)]
    one = [c.content for c in stepwise.stream(prompt)]
    assert "".join(one) == "".join(several) == stepwise.invoke(prompt).content
    assert len([c for c in one if c]) > len([c for c in several if c])
    with pytest.raises(ValueError, match="max_decode_steps must be an int >= 1"):
        ChatBrisk(model=str(tiny_chat_dir), max_decode_steps=0)
    # Slots that keep more conversations' prefixes than run at once: another engine.
    kept = plain.model_copy(update={"prefix_cache_slots": 2})
    assert kept._engine() is not plain._engine()
    assert kept._engine().engine.runner.kv_cache.num_slots == plain.max_batch_size + 2
    with pytest.raises(ValueError, match="prefix_cache_slots=2 needs prefix_caching=True"):
        ChatBrisk(model=str(tiny_chat_dir), prefix_caching=False, prefix_cache_slots=2)


def test_equivalent_engine_settings_share_one_engine(tiny_chat_dir: Path) -> None:
    plain = ChatBrisk(model=str(tiny_chat_dir), **TINY_ENGINE)
    engine = plain._engine()
    before = len(loaded_engines())
    # The model's own cache dtype, named or not, and the CPU's default chunk size, named or not.
    for update in (
        {"kv_cache_dtype": "auto"},
        {"kv_cache_dtype": "float32"},
        {"dtype": "float32", "device": "cpu"},
        {"prefill_chunk_size": 512},
        {"kv_cache_dtype": "float32", "prefill_chunk_size": 512},
    ):
        assert plain.model_copy(update=update)._engine() is engine, update
    assert len(loaded_engines()) == before
    assert plain.model_copy(update={"prefill_chunk_size": 256})._engine() is not engine
    with pytest.raises(ValueError, match="kv_cache_dtype.*supported: float32"):
        plain.model_copy(update={"kv_cache_dtype": "int8"})._engine()


def record_submitted(llm: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The requests the engine's batch submission receives from now on, as they come."""
    submitted: list[Any] = []
    original = type(llm).arun_requests_each

    def recording(self: Any, requests: list[Any]) -> Any:
        submitted.extend(requests)
        return original(self, requests)

    monkeypatch.setattr(type(llm), "arun_requests_each", recording)
    return submitted


def test_an_interrupt_during_batch_aborts_its_requests(
    chat: ChatBrisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C in batch() waited for the whole batch to finish before it propagated.
    llm = chat._engine()
    submitted = record_submitted(llm, monkeypatch)
    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def interrupt_once_decoding() -> None:
        while not any(r.output_token_ids for r in submitted):
            time.sleep(0.001)
        signal.pthread_kill(main, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_decoding, daemon=True)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        chat.batch(["Count to one thousand."] * 3, max_tokens=1000, stop=None)
    interrupter.join(timeout=10)
    assert len(submitted) == 3
    for _ in range(3000):  # the aborts reach the engine thread in its next step, which then
        # releases their slots (after marking them finished)
        if all(r.is_finished for r in submitted) and not llm.engine.has_unfinished:
            break
        time.sleep(0.01)
    assert [r.finish_reason for r in submitted] == ["abort"] * 3
    assert all(len(r.output_token_ids) < 1000 for r in submitted)
    assert not llm.engine.has_unfinished
    assert isinstance(chat.invoke("Hi", max_tokens=3), AIMessage)  # the engine goes on


def test_batch_submits_its_inputs_together(
    chat: ChatBrisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """batch/abatch render every input and submit their requests in one go (one prefill pass),
    instead of one call per input as each finished rendering; the outputs are invoke's."""
    llm = chat._engine()
    sizes: list[int] = []
    original = type(llm).arun_requests_each

    def recording(self: Any, requests: list[Any]) -> Any:
        sizes.append(len(requests))
        return original(self, requests)

    monkeypatch.setattr(type(llm), "arun_requests_each", recording)
    prompts = ["Hello", "Count to three.", "Hi there", "What is 2+2?", "Name a colour."]
    batched = chat.batch(prompts, max_tokens=8)
    assert sizes == [5]
    sizes.clear()
    again = asyncio.run(chat.abatch(prompts, max_tokens=8))
    assert sizes == [5]
    alone = [chat.invoke(p, max_tokens=8) for p in prompts]
    assert [m.content for m in batched] == [m.content for m in alone]
    assert [m.content for m in again] == [m.content for m in alone]
    assert all(m.usage_metadata is not None for m in batched)


def test_a_bad_input_in_a_batch_fails_alone(chat: ChatBrisk) -> None:
    too_long = "word " * 4000  # past max_seq_len=1536: refused when its request is made
    results = chat.batch(["Hello", too_long, "Hi"], return_exceptions=True, max_tokens=4)
    assert isinstance(results[1], ValueError)
    assert isinstance(results[0], AIMessage) and isinstance(results[2], AIMessage)
    assert results[0].content == chat.invoke("Hello", max_tokens=4).content
    with pytest.raises(ValueError):
        chat.batch(["Hello", too_long], max_tokens=4)
    for _ in range(
        300
    ):  # the other input's request is aborted: that reaches the engine's next step
        if not chat._engine().engine.has_unfinished:
            break
        time.sleep(0.01)
    assert not chat._engine().engine.has_unfinished


def test_a_bad_input_in_abatch_stops_the_others(
    chat: ChatBrisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in batch: asyncio.gather raises the first error and leaves the other inputs running,
    so abatch aborts them (before, the good request decoded all its tokens for no one)."""
    llm = chat._engine()
    submitted = record_submitted(llm, monkeypatch)
    too_long = "word " * 4000

    async def run() -> None:
        with pytest.raises(ValueError):
            await chat.abatch(["Count to one thousand.", too_long], max_tokens=1400, stop=None)
        for _ in range(3000):  # still inside the event loop, which asyncio.run would cancel
            if all(r.is_finished for r in submitted):
                break
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert [r.finish_reason for r in submitted] == ["abort"]
    assert not llm.engine.has_unfinished


@pytest.mark.parametrize("streamed", [False, True], ids=["invoked", "streamed"])
@pytest.mark.parametrize("api", ["batch", "abatch"])
def test_every_run_of_a_batch_that_fails_ends_in_the_callbacks(
    chat: ChatBrisk, api: str, streamed: bool
) -> None:
    """The inputs a failing batch stops fail too, each run reporting its error (the runs of the
    others, cancelled on batch's own event loop, never ended: a tracer showed them running).
    Streamed inputs (stream=True, a streaming callback, astream_events) stop at their next
    chunk: a review found them decoding to their end while the batch waited."""
    from langchain_core.callbacks import BaseCallbackHandler

    from langchain_brisklm._batched import BatchStopped

    class Runs(BaseCallbackHandler):
        def __init__(self) -> None:
            self.started: list[Any] = []
            self.ended: dict[Any, BaseException | None] = {}

        def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **_: Any):
            self.started.append(run_id)

        def on_llm_end(self, response: Any, *, run_id: Any, **_: Any) -> None:
            self.ended[run_id] = None

        def on_llm_error(self, error: BaseException, *, run_id: Any, **_: Any) -> None:
            self.ended[run_id] = error

    runs = Runs()
    inputs = ["Count to one thousand.", "word " * 4000, "Hello"]
    options: dict[str, Any] = {"max_tokens": 1400, **({"stream": True} if streamed else {})}
    with pytest.raises(ValueError, match="context") as raised:
        if api == "batch":
            chat.batch(inputs, {"callbacks": [runs]}, **options)
        else:
            asyncio.run(chat.abatch(inputs, {"callbacks": [runs]}, **options))
    assert not isinstance(raised.value, BatchStopped)  # the input's own error
    assert len(runs.started) == 3 and set(runs.ended) == set(runs.started)
    errors = [runs.ended[run] for run in runs.started]
    assert sum(isinstance(e, BatchStopped) for e in errors) == 2
    assert all(
        e is not None and "another input of the batch failed" in str(e) or e is raised.value
        for e in errors
    )
    for _ in range(300):  # the aborts reach the engine at its next step
        if not chat._engine().engine.has_unfinished:
            break
        time.sleep(0.01)
    assert not chat._engine().engine.has_unfinished


@pytest.mark.parametrize("streamed", [False, True], ids=["invoked", "streamed"])
def test_a_call_a_callback_makes_inside_a_failing_batch_is_none_of_it(
    chat: ChatBrisk, streamed: bool
) -> None:
    """A review found a ChatBrisk call made in a batch input's callback sharing the batch's
    context: the stopped inputs' handlers got BatchStopped for their own, unrelated calls."""
    from langchain_core.callbacks import AsyncCallbackHandler

    nested: list[Any] = []

    class Handler(AsyncCallbackHandler):
        async def on_llm_error(self, error: BaseException, **_: Any) -> None:
            try:
                nested.append(await chat.ainvoke("Hi", max_tokens=3))
            except Exception as failure:
                nested.append(failure)

    inputs = ["Count to one thousand.", "word " * 4000, "Hello"]
    options: dict[str, Any] = {"max_tokens": 1400, **({"stream": True} if streamed else {})}
    with pytest.raises(ValueError, match="context"):
        asyncio.run(chat.abatch(inputs, {"callbacks": [Handler()]}, **options))
    assert len(nested) == 3 and all(isinstance(reply, AIMessage) for reply in nested), nested
    assert {reply.content for reply in nested} == {chat.invoke("Hi", max_tokens=3).content}


def test_a_request_failing_in_the_engine_fails_alone_in_a_batch(
    chat: ChatBrisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests of a batch are submitted together, but one that fails in the engine (as a
    grammar llguidance gives up on does: its token update returns the error) fails its own input
    only; the others finish as they would."""
    from brisklm.engine.llm_engine import LLMEngine

    update = LLMEngine.update_request

    def failing(self: Any, request: Any, token_id: int, *args: Any, **kwargs: Any) -> Any:
        if request.num_prompt_tokens > 60 and len(request.output_token_ids) == 2:
            request.abort("error")
            return RuntimeError("this request's constraint failed")
        return update(self, request, token_id, *args, **kwargs)

    expected = [chat.invoke(p, max_tokens=6).content for p in ("Hi", "Hello")]
    monkeypatch.setattr(LLMEngine, "update_request", failing)
    results = chat.batch(["Hi", "word " * 50, "Hello"], return_exceptions=True, max_tokens=6)
    assert isinstance(results[1], RuntimeError)
    assert [results[0].content, results[2].content] == expected
    assert not chat._engine().engine.has_unfinished


def test_a_batch_whose_grouping_breaks_raises_instead_of_hanging() -> None:
    """An error outside any one call's input (here a BaseException from a prepare step, which
    the per-call handling does not catch) reaches every caller of the group: none waits forever."""
    from langchain_brisklm._batched import BatchSubmission

    class Unexpected(BaseException):
        pass

    def broken() -> Any:
        raise Unexpected("not an Exception")

    async def run() -> list[Any]:
        batch = BatchSubmission()
        calls = [batch.run(broken), batch.run(broken)]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=60)

    results = asyncio.run(run())
    assert [type(r) for r in results] == [Unexpected, Unexpected]


def test_the_profile_states_the_engines_context_and_what_chatbrisk_does(
    chat: ChatBrisk, tiny_chat_dir: Path
) -> None:
    # LangChain's agents read it (a summariser max_input_tokens, create_agent structured_output);
    # it was None.
    profile = chat.profile
    assert profile is not None
    assert profile["max_input_tokens"] == chat._engine().max_seq_len == TINY_ENGINE["max_seq_len"]
    assert profile["tool_calling"] and profile["structured_output"] and profile["tool_choice"]
    assert not profile["image_inputs"] and profile["text_inputs"]
    assert profile["name"] == str(tiny_chat_dir)
    # Without max_seq_len: the model's positions, at most 4096 (the engine's default).
    model_positions = json.loads((tiny_chat_dir / "config.json").read_text())[
        "max_position_embeddings"
    ]
    unlimited = ChatBrisk(model=str(tiny_chat_dir)).profile
    assert unlimited is not None and unlimited["max_input_tokens"] == min(model_positions, 4096)
    assert ChatBrisk(model=str(tiny_chat_dir / "missing")).profile is None  # an error is the call's
