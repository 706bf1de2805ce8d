"""A Qwen3 checkpoint end to end: transformers' greedy tokens through the engine on both CPU
kernel paths, alone and batched, and a chat turn with tools under its Hermes-style template."""

from __future__ import annotations

import json
import re

import pytest
import torch

from brisklm import LLM, SamplingParams
from tests.hf_models import build_hf_model, save_hf_model
from tests.test_chat_template import REASONING_TEMPLATE
from tests.tokenizer_fixtures import build_byte_level_bpe

transformers = pytest.importorskip("transformers")

PROMPTS = [[1, 17, 93, 5, 44, 120, 8, 61], [1, 300, 9], [1, 33, 150, 9, 70, 2, 140, 17, 88, 3]]
STEPS = 24
# Bounded arguments, so that a random model's call ends well within max_tokens.
FORECAST = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Zürich"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}


def make_qwen3_checkpoint(directory):
    """A tiny random Qwen3 checkpoint with a Qwen-style tokenizer and a reasoning chat template
    (``enable_thinking``): its directory and the transformers model saved there. q/k norms, a
    head_dim other than hidden_size // heads, q/k/v and o biases, tied embeddings."""
    hf = build_hf_model(
        "qwen3", vocab_size=640, head_dim=32, attention_bias=True, tie_word_embeddings=True
    )
    save_hf_model(hf, directory)
    build_byte_level_bpe(
        directory, qwen_style=True, config_overrides={"chat_template": REASONING_TEMPLATE}
    )
    return directory, hf


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"))


def hf_greedy(hf, prompt: list[int], real_tokens: int) -> list[int]:
    """transformers' greedy tokens among the tokenizer's (the embedding is padded past them)."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
            suppress_tokens=list(range(real_tokens, hf.config.vocab_size)),
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_tokens_match_transformers_alone_and_batched(qwen3, kernels):
    directory, hf = qwen3
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=128) as llm:
        assert llm.engine.num_real_tokens < hf.config.vocab_size
        expected = [hf_greedy(hf, p, llm.engine.num_real_tokens) for p in PROMPTS]
        assert (llm.engine.runner.native is not None) == (kernels == "native")
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected
        assert [llm.generate(p, params).token_ids for p in PROMPTS] == expected


def test_a_chat_turn_with_tools_calls_one_under_the_grammar(qwen3):
    directory, _ = qwen3
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as llm:
        assert llm.tool_call_format().name == "hermes"
        messages = [{"role": "user", "content": "Weather in Zürich?"}]
        prompt = llm.chat_prompt_ids(messages, tools=[FORECAST], enable_thinking=False)
        text = llm.tokenizer.decode(prompt, skip_special_tokens=False)
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        grammar = llm.tool_call_format().grammar([FORECAST], "required", parallel=False)
        params = SamplingParams(temperature=0, max_tokens=64, grammar=grammar)
        reply = llm.chat(messages, params, tools=[FORECAST], enable_thinking=False)
        assert [c.name for c in reply.tool_calls] == ["get_forecast"]
        arguments = reply.tool_calls[0].arguments
        assert arguments["city"] in ("Paris", "Zürich") and 1 <= arguments["days"] <= 7
        assert reply.finish_reason == "tool_calls"


# ----------------------------------------------------------- tool calls beside thinking
def test_a_call_tag_in_the_thinking_leaves_stop_strings_on(qwen3):
    """Stop strings apply up to the reply's first tool call; a "<tool_call>" its thinking
    mentions is no call (it is not parsed as one), but it switched them off for the rest."""
    directory, _ = qwen3
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as llm:
        ask = [{"role": "user", "content": "Hi"}]
        reply = "<think>\nuse <tool_call> now\n</think>\n\nIt is STOP ok."
        params = SamplingParams(
            temperature=0, max_tokens=80, stop=["STOP"], regex=reply.replace(".", r"\.")
        )
        for tools in (None, [FORECAST]):
            turn = llm.chat(ask, params, tools=tools)
            assert turn.reasoning == "use <tool_call> now" and turn.content.strip() == "It is"
            assert turn.output.stop_reason == "STOP", tools
        # A call after the thinking: the stop string inside it does not cut it.
        call = '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Paris", "days": 3}}'
        forced = "<think>\nhm\n</think>\n\n" + call + "\n</tool_call>"
        params = SamplingParams(
            temperature=0, max_tokens=120, stop=["Paris"], regex=forced.replace("{", r"\{")
        )
        turn = llm.chat(ask, params, tools=[FORECAST])
        assert turn.reasoning == "hm" and turn.finish_reason == "tool_calls"
        assert turn.tool_calls[0].arguments == {"city": "Paris", "days": 3}


@pytest.fixture(scope="module")
def think_tokens(qwen3, tmp_path_factory):
    """The Qwen3 checkpoint with <think> and </think> as tokens of their own (as Qwen3's are)."""
    return with_think_tokens(qwen3[0], tmp_path_factory.mktemp("qwen3-tags") / "model")


@pytest.fixture(scope="module")
def opens_thinking(qwen3, tmp_path_factory):
    """``think_tokens`` with a template whose generation prompt opens the thinking block (QwQ,
    Qwen3-Thinking)."""
    directory = with_think_tokens(qwen3[0], tmp_path_factory.mktemp("qwen3-open") / "model")
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    head = "{{- '<|im_start|>assistant\n' }}\n{%- if enable_thinking"
    assert head in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(
        head, "{{- '<|im_start|>assistant\n<think>\n' }}\n{%- if enable_thinking"
    )
    config_file.write_text(json.dumps(config))
    return directory


def with_think_tokens(source, directory):
    """A copy of the checkpoint at ``source`` in ``directory``, <think> and </think> added to its
    tokenizer as tokens that are not special (as Qwen3's are)."""
    import shutil

    from tokenizers import AddedToken, Tokenizer

    shutil.copytree(source, directory)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tags = ("<think>", "</think>")
    tokenizer.add_tokens([AddedToken(tag, normalized=False) for tag in tags])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    for tag in tags:
        config["added_tokens_decoder"][str(tokenizer.token_to_id(tag))] = {
            "content": tag,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": False,
        }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_tool_choice_none_splits_the_thinking_the_prompt_opened(opens_thinking):
    """The tools' "none" grammar is free text, as "auto"'s start is: it can close the block the
    prompt opened. It was taken for a constraint that decides the reply's start, so the whole
    reply, "</think>" and all, came back as content (server and ChatBrisk alike; LLM.chat for
    both grammars, and for a regex of any text). A constraint that cannot close it (a JSON
    schema) comes after the block (it left the reply all content before session 75)."""
    starlette = pytest.importorskip("starlette.testclient")
    from brisklm.server.app import build_app

    with LLM.from_pretrained(opens_thinking, show_progress=False, max_seq_len=512) as llm:
        close = llm.tokenizer.token_to_id("</think>")
        body = {
            "messages": [{"role": "user", "content": "Hi"}],
            "temperature": 0,
            "max_tokens": 1,
            "logit_bias": {str(close): 100},  # the reply: "</think>"
            "tools": [FORECAST],
        }
        forced = SamplingParams(temperature=0, max_tokens=1, logit_bias={close: 100})
        ask = [{"role": "user", "content": "Hi"}]
        tool_format = llm.tool_call_format()
        for constraint in (
            {"grammar": tool_format.grammar([FORECAST], "auto")},
            {"grammar": tool_format.grammar([FORECAST], "none")},
            {"regex": "(.|\n)*"},
        ):
            turn = llm.chat(ask, forced.with_changes(**constraint), tools=[FORECAST])
            assert (turn.reasoning, turn.content) == ("", ""), constraint
        schema = forced.with_changes(max_tokens=8, json_schema={"type": "object"})
        turn = llm.chat(ask, schema, tools=[FORECAST])
        assert turn.reasoning == "" and turn.content.startswith("{")
        with starlette.TestClient(build_app(llm, "t")) as http:
            for choice in ("auto", "none"):
                reply = http.post("/v1/chat/completions", json={**body, "tool_choice": choice})
                assert reply.status_code == 200, reply.json()
                message = reply.json()["choices"][0]["message"]
                assert (message["content"], message.get("reasoning_content")) == ("", ""), choice
    pytest.importorskip("langchain_brisklm")
    from langchain_brisklm import ChatBrisk

    chat = ChatBrisk(model=str(opens_thinking), temperature=0, max_tokens=1, max_seq_len=512)
    bound = chat.bind_tools([FORECAST], tool_choice="none", logit_bias={close: 100})
    message = bound.invoke("Hi")
    assert message.content == "" and message.additional_kwargs["reasoning_content"] == ""


SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Rome", "Oslo"]}},
    "required": ["city"],
}


@pytest.mark.parametrize("opened", [True, False], ids=["prompt-opened", "reply-opened"])
def test_a_forced_call_or_answer_may_come_after_the_thinking(request, opened):
    """The server's and ChatBrisk's constraints (tools, tool_choice, response_format) apply
    after a reasoning model's thinking block, as vLLM's: a forced call or a JSON answer began
    at the reply's first token, so a block the prompt opened could not close (the reply was all
    content), and one the reply would open could not open. The logit bias writes an empty
    block where the grammar allows one; the grammar keeps it out of the call and answer."""
    starlette = pytest.importorskip("starlette.testclient")
    from brisklm.server.app import build_app

    ask = [{"role": "user", "content": "Hi"}]
    directory = request.getfixturevalue("opens_thinking" if opened else "think_tokens")
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as llm:
        assert llm.reasoning_start(llm.chat_prompt_ids(ask)) is opened
        bias = {llm.tokenizer.token_to_id("</think>"): 100}
        if not opened:
            bias[llm.tokenizer.token_to_id("<think>")] = 50
        body = {
            "messages": ask,
            "temperature": 0,
            "max_tokens": 80,
            "logit_bias": {str(token): value for token, value in bias.items()},
        }
        answer = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
        with starlette.TestClient(build_app(llm, "t")) as http:
            named = {"type": "function", "function": {"name": "get_forecast"}}
            for choice in ("required", named):
                called = {**body, "tools": [FORECAST], "tool_choice": choice}
                called["parallel_tool_calls"] = False
                response = http.post("/v1/chat/completions", json=called).json()
                assert "choices" in response, response
                reply = response["choices"][0]
                assert reply["finish_reason"] == "tool_calls", reply
                message = reply["message"]
                assert message["reasoning_content"] == "" and not message["content"]
                (call,) = message["tool_calls"]
                arguments = json.loads(call["function"]["arguments"])
                assert arguments["city"] in ("Paris", "Zürich") and 1 <= arguments["days"] <= 7
            for field in ({"response_format": answer}, {"guided_json": SCHEMA}):
                reply = http.post("/v1/chat/completions", json={**body, **field})
                message = reply.json()["choices"][0]["message"]
                assert message["reasoning_content"] == "", field
                assert json.loads(message["content"])["city"] in ("Rome", "Oslo")
            if not opened:  # Qwen3's enable_thinking=False: the prompt's empty block is the
                # reply's (as vLLM reads it), so the answer comes at once, however the model
                # would think (it thought without end, to max_tokens)
                off = {**body, "chat_template_kwargs": {"enable_thinking": False}}
                reply = http.post("/v1/chat/completions", json={**off, "response_format": answer})
                message = reply.json()["choices"][0]["message"]
                assert "reasoning_content" not in message
                assert json.loads(message["content"])["city"] in ("Rome", "Oslo")
            streamed = http.post(
                "/v1/chat/completions", json={**body, "response_format": answer, "stream": True}
            ).text.splitlines()
        # LLM.chat alike
        params = SamplingParams(temperature=0, max_tokens=80, logit_bias=bias)
        turn = llm.chat(ask, params, [FORECAST], tool_choice="required", parallel_tool_calls=False)
        assert turn.reasoning == "" and [c.name for c in turn.tool_calls] == ["get_forecast"]
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in streamed if "{" in line]
        assert [d["reasoning_content"] for d in deltas if "reasoning_content" in d] == [""]
        assert json.loads("".join(d.get("content") or "" for d in deltas))["city"]
    pytest.importorskip("langchain_brisklm")
    from langchain_brisklm import ChatBrisk

    chat = ChatBrisk(
        model=str(directory), temperature=0, max_tokens=80, max_seq_len=512, logit_bias=bias
    )
    structured = chat.with_structured_output(SCHEMA | {"title": "City"}, method="json_schema")
    assert structured.invoke("Hi")["city"] in ("Rome", "Oslo")
    message = chat.bind_tools([FORECAST], tool_choice="get_forecast").invoke("Hi")
    assert message.additional_kwargs["reasoning_content"] == ""
    assert [call["name"] for call in message.tool_calls] == ["get_forecast"]


# A caller's constraint of each kind, as SamplingParams options and as the server's fields, and
# a reply it accepts (the answer after the thinking).
CALLERS = [
    ({"regex": r"It is [a-z]{3,8}\."}, {"guided_regex": r"It is [a-z]{3,8}\."}, r"It is [a-z]+\."),
    ({"choice": ["sunny", "rain"]}, {"guided_choice": ["sunny", "rain"]}, r"sunny|rain"),
    ({"grammar": 'start: "cold" | "warm"'}, {"guided_grammar": 'start: "cold" | "warm"'},
     "cold|warm"),
    ({"grammar": 'root ::= "dry" | "wet"', "grammar_syntax": "gbnf"},
     {"guided_grammar": 'root ::= "dry" | "wet"'}, "dry|wet"),
    ({"json_schema": SCHEMA}, {"guided_json": SCHEMA}, r'\{"city": "(Rome|Oslo)"\}'),
]  # fmt: skip


@pytest.mark.parametrize("opened", [True, False], ids=["prompt-opened", "reply-opened"])
def test_a_callers_own_constraint_comes_after_the_thinking(request, opened):
    """A regex, choice, grammar (Lark or GBNF) or JSON schema of the caller's own (in
    SamplingParams, or the server's guided_* fields) applies after a reasoning model's thinking
    block, as vLLM's guided decoding does: each began at the reply's first token, so a block the
    prompt opened could not close and one the reply would open could not open (before session 75;
    guided_json since session 74). The logit bias writes an empty block where one may come."""
    from brisklm import AfterThinking

    starlette = pytest.importorskip("starlette.testclient")
    from brisklm.server.app import build_app

    ask = [{"role": "user", "content": "Hi"}]
    directory = request.getfixturevalue("opens_thinking" if opened else "think_tokens")
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as llm:
        bias = {llm.tokenizer.token_to_id("</think>"): 100}
        if not opened:
            bias[llm.tokenizer.token_to_id("<think>")] = 50
        params = SamplingParams(temperature=0, max_tokens=40, logit_bias=bias)
        body = {"messages": ask, "temperature": 0, "max_tokens": 40}
        body["logit_bias"] = {str(token): value for token, value in bias.items()}
        ids = llm.chat_prompt_ids(ask)
        with starlette.TestClient(build_app(llm, "t")) as http:
            for options, fields, answer in CALLERS:
                own = params.with_changes(**options)
                decoded, start = llm.chat_decoding(ids, own, None)
                assert start is opened
                assert decoded.constraint == AfterThinking(own.constraint, opened), options
                turn = llm.chat(ask, own)
                assert turn.reasoning == "" and re.fullmatch(answer, turn.content), (options, turn)
                reply = http.post("/v1/chat/completions", json={**body, **fields})
                message = reply.json()["choices"][0]["message"]
                assert message["reasoning_content"] == "", (fields, message)
                assert re.fullmatch(answer, message["content"]), (fields, message)
            # A constraint that writes the block itself applies from the first token, as before:
            # one naming the closing tag, or one that may begin with the block's tag.
            for pattern in (r"[a-z]*</think>\n\nok", r"(.|\n)*"):
                decoded, _ = llm.chat_decoding(ids, params.with_changes(regex=pattern), None)
                assert decoded.constraint.pattern == pattern
            if not opened:  # enable_thinking=False: the reply holds no block, the answer comes
                off = {**body, **CALLERS[0][1], "chat_template_kwargs": {"enable_thinking": False}}
                message = http.post("/v1/chat/completions", json=off).json()["choices"][0]
                assert "reasoning_content" not in message["message"]
                assert re.fullmatch(CALLERS[0][2], message["message"]["content"])
            # a bad grammar is still named as the caller's own
            bad = http.post("/v1/chat/completions", json={**body, "guided_grammar": "start: ("})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "guided_grammar"
        with pytest.raises(ValueError, match="invalid regex"):
            llm.chat(ask, params.with_changes(regex="(("))
        # llguidance's initial skip turned off is no reason to leave the block out
        grammar = '%llguidance {"allow_initial_skip": false}\nstart: "cold" | "warm"'
        decoded, _ = llm.chat_decoding(ids, params.with_changes(grammar=grammar), None)
        assert isinstance(decoded.constraint, AfterThinking)


def with_special_think_tags(source, directory):
    """A copy of the checkpoint at ``source`` (one of ``with_think_tokens``) in ``directory``,
    its <think> and </think> special tokens."""
    import shutil

    shutil.copytree(source, directory)
    for name, tokens in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", None)):
        config = json.loads((directory / name).read_text())
        for token in config[tokens] if tokens else config["added_tokens_decoder"].values():
            if token["content"] in ("<think>", "</think>"):
                token["special"] = True
        (directory / name).write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def special_tags(opens_thinking, tmp_path_factory):
    """``opens_thinking`` with <think> and </think> special tokens."""
    return with_special_think_tags(
        opens_thinking, tmp_path_factory.mktemp("qwen3-special") / "model"
    )


def test_a_constraint_the_blocks_rules_would_change_takes_the_reply_from_its_start(
    opens_thinking, special_tags
):
    """A review of session 75's AfterThinking found constraints that the block's rules before them
    would change: think tags that are special tokens (the rules' text cannot read them: the reply
    thought to max_tokens and its content was empty), a constraint that may begin with a newline
    (the newlines after the block are the block's, so the content lost them) and a Lark grammar
    with llguidance's initial skip (not made behind a reference). Each decides the reply from its
    first token, as before: after a block the prompt opened, the reply is all content."""
    ask = [{"role": "user", "content": "Hi"}]
    skip = '%llguidance {"allow_initial_skip": true}\nstart: "x" "y"\n%ignore /[ \\t]+/'
    for directory, options, answer in (
        (special_tags, {"regex": "[a-z ]+"}, "[a-z ]+"),
        # (it may begin with the tags' text, but cannot write the tokens: the block cannot close)
        (special_tags, {"regex": "(.|\n)*"}, "(?s:.*)"),
        (opens_thinking, {"regex": "\n[a-z]+"}, "\n[a-z]+"),
        (opens_thinking, {"grammar": skip}, " *x *y"),
    ):
        with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as llm:
            close = llm.tokenizer.token_to_id("</think>")
            params = SamplingParams(temperature=0, max_tokens=12, logit_bias={close: 100})
            own = params.with_changes(**options)
            decoded, start = llm.chat_decoding(llm.chat_prompt_ids(ask), own, None)
            assert start is None and decoded.constraint == own.constraint, options
            turn = llm.chat(ask, own)
            assert turn.reasoning is None and re.fullmatch(answer, turn.content), (options, turn)
            # unconstrained, the bias closes the block at once
            assert llm.chat(ask, params.with_changes(max_tokens=1)).reasoning == ""
            if directory == special_tags:  # a response_format goes the same way
                answer = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
                turn = llm.chat(ask, params.with_changes(max_tokens=20), response_format=answer)
                assert turn.reasoning is None and json.loads(turn.content)["city"] in (
                    "Rome",
                    "Oslo",
                )
