"""A reasoning model's thinking block told apart from its reply by LLM.chat, the server and
ChatBrisk, on a tiny Qwen3 whose output a regex forces to think first."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from brisklm import LLM, SamplingParams
from tests.engine.test_qwen3 import FORECAST, make_qwen3_checkpoint

ASK = [{"role": "user", "content": "Forecast for Paris?"}]
CALL = (
    '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)
THINK_THEN_SAY = r"<think>\n[a-z]{3,8}( [a-z]{3,8}){0,3}\n</think>\n\nIt is [a-z]{3,8}\."
# A template that opens the block itself, as DeepSeek-R1's do (the reply only closes it), and
# keeps earlier replies' text after their block.
OPENING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    directory, _ = make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"))
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as model:
        yield model


@pytest.fixture(scope="module")
def opening(tmp_path_factory):
    """The same model with OPENING_TEMPLATE as its chat template."""
    directory, _ = make_qwen3_checkpoint(tmp_path_factory.mktemp("opening"))
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = OPENING_TEMPLATE
    config_file.write_text(json.dumps(config))
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as model:
        yield model


def forced(pattern: str, **changes) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=120, regex=pattern, **changes)


def test_chat_tells_the_thinking_from_the_reply(llm):
    reply = llm.chat(ASK, forced(THINK_THEN_SAY))
    text = reply.output.text
    assert re.fullmatch(THINK_THEN_SAY, text)
    assert reply.reasoning == text[len("<think>\n") : text.index("\n</think>")]
    assert reply.content == text[text.index("It is") :]
    assert reply.message()["reasoning_content"] == reply.reasoning
    again = asyncio.run(llm.achat(ASK, forced(THINK_THEN_SAY)))
    assert (again.reasoning, again.content) == (reply.reasoning, reply.content)
    # thinking closed by the prompt (enable_thinking=False): the reply holds no block
    assert llm.reasoning_start(llm.chat_prompt_ids(ASK, enable_thinking=False)) is None
    plain = llm.chat(ASK, forced(r"It is [a-z]{3,8}\."), enable_thinking=False)
    assert plain.reasoning is None and plain.content == plain.output.text
    assert re.fullmatch(r"It is [a-z]{3,8}\.", plain.content)


def test_a_call_after_the_thinking_is_parsed(llm):
    params = forced(r"<think>\n[a-z]{3,8}\n</think>\n\n" + re.escape(CALL))
    reply = llm.chat(ASK, params, tools=[FORECAST])
    assert reply.reasoning and "<think>" not in reply.content
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("get_forecast", {"city": "Paris", "days": 2})
    ]
    assert reply.finish_reason == "tool_calls"


def test_a_prompt_that_opens_the_block_makes_the_reply_begin_inside_it(llm):
    kwargs = {"chat_template": OPENING_TEMPLATE}
    ids = llm.chat_prompt_ids(ASK, **kwargs)
    assert llm.reasoning_start(ids, OPENING_TEMPLATE) is True
    reply = llm.chat(ASK, forced(r"[a-z]{3,8}\n</think>\n\nIt is [a-z]{3,8}\."), **kwargs)
    assert reply.reasoning == reply.output.text.split("\n")[0]
    assert reply.content.startswith("It is ")
    # a template that shows no thinking: the reply is all content, tags and all
    assert llm.reasoning_start(ids, "{{ messages[0].content }}") is None


def test_a_reasoning_prefill_is_continued_as_reasoning(llm):
    prefill = [*ASK, {"role": "assistant", "reasoning_content": "Let me see", "content": ""}]
    kwargs = {"continue_final_message": "reasoning_content"}
    ids = llm.chat_prompt_ids(prefill, **kwargs)
    assert llm.reasoning_start(ids) is True
    reply = llm.chat(prefill, forced(r" [a-z]{3,8}\n</think>\n\nIt is [a-z]{3,8}\."), **kwargs)
    assert reply.reasoning == reply.output.text.split("\n")[0]
    assert reply.content.startswith("It is ")
    # A prefill of more than 512 tokens, "<think>" no token of its own here: the tag was looked
    # for in the last 512 tokens only, and the reply taken for one that may open a block.
    long = [*ASK, {"role": "assistant", "reasoning_content": "x y " * 600, "content": ""}]
    ids = llm.chat_prompt_ids(long, **kwargs)
    assert len(ids) > 1000 and llm.tokenizer.token_to_id("<think>") is None
    assert llm.reasoning_start(ids) is True


def test_the_server_reports_reasoning_content_whole_and_streamed(llm):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from brisklm.server.app import build_app

    body = {
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 120,
        "guided_regex": THINK_THEN_SAY,
    }
    expected = llm.chat(ASK, forced(THINK_THEN_SAY))
    with TestClient(build_app(llm, "tiny")) as http:
        message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message["reasoning_content"] == expected.reasoning
        assert message["content"] == expected.content
        lines = http.post("/v1/chat/completions", json={**body, "stream": True}).text.splitlines()
    deltas = [
        json.loads(line[len("data: ") :])["choices"][0]["delta"]
        for line in lines
        if line.startswith("data: {")
    ]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == expected.reasoning
    assert "".join(d.get("content") or "" for d in deltas) == expected.content


def test_a_replys_thinking_sent_back_reaches_the_template(llm):
    # Within a tool loop (after the last user query) Qwen3's template shows an earlier reply's
    # thinking: a client sends it back as the message's reasoning_content.
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from brisklm.server.app import build_app

    call = {"id": "c1", "type": "function", "function": {"name": "get_forecast", "arguments": "{}"}}
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Plan: ask the tool",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    with TestClient(build_app(llm, "tiny")) as http:
        ids = http.post("/tokenize", json={"messages": history}).json()["tokens"]
        bad = [*ASK, {"role": "user", "content": "x", "reasoning_content": "no"}]
        refused = http.post("/v1/chat/completions", json={"messages": bad}).json()["error"]
    assert "<think>\nPlan: ask the tool\n</think>" in llm.tokenizer.decode(ids)
    assert refused["param"] == "messages" and "reasoning_content" in refused["message"]


def test_an_empty_thinking_block_streams_an_empty_reasoning_content(llm):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from brisklm.server.app import build_app

    pattern = r"<think>\n\n</think>\n\nIt is [a-z]{3,8}\."
    body = {"messages": ASK, "temperature": 0, "max_tokens": 60, "guided_regex": pattern}
    with TestClient(build_app(llm, "tiny")) as http:
        whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        lines = http.post("/v1/chat/completions", json={**body, "stream": True}).text.splitlines()
        counted = http.post(
            "/tokenize",
            json={"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}},
        ).json()["count"]
    assert whole["reasoning_content"] == ""
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines if "{" in line]
    assert [d["reasoning_content"] for d in deltas if "reasoning_content" in d] == [""]
    # /tokenize renders with the template's variables too
    assert counted == len(llm.chat_prompt_ids(ASK, enable_thinking=False))
