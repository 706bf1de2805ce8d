"""SamplingParams.thinking_token_budget: a reasoning model's thinking block bounded in tokens,
its closing tag forced at the budget, on every decoding path (one step a call, several native
steps a call, speculation), with constraints after the thinking, and through the server."""

from __future__ import annotations

import asyncio
import codecs
import json
import re

import pytest

from brisklm import LLM, AfterThinking, SamplingParams
from brisklm.constrained.spec import Regex
from brisklm.engine.thinking_budget import ThinkingBudget
from tests.engine.test_qwen3 import (
    FORECAST,
    make_qwen3_checkpoint,
    with_special_think_tags,
    with_think_tokens,
)

ASK = [{"role": "user", "content": "Hi"}]


def ends_inside_character(data: bytes) -> bool:
    """Whether ``data`` ends with the first bytes of a UTF-8 character, valid so far (what an
    incremental decoder holds back): where the forced tag may not come."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data)
    return bool(decoder.getstate()[0])


# ---- the count on its own, over a made-up vocabulary ------------------------------------------

TABLE = [b"<think>", b"\n", b"ab", b" cd", b"</thi", b"nk>", b"</think>", b"x\n", b" ", b"hi"]
CLOSING = ([6, 1, 1], [1, 6, 1, 1])  # "</think>\n\n" after a newline, else "\n</think>\n\n"


def budget(n: int, opened: str | None = None) -> ThinkingBudget:
    return ThinkingBudget(n, opened, TABLE, CLOSING)


def feed(count: ThinkingBudget, tokens: list[int]) -> list[int | None]:
    """``free_tokens`` after each token."""
    out = []
    for token in tokens:
        count.take(token)
        out.append(count.free_tokens)
    return out


def test_the_count_opens_counts_and_forces_the_closing_tag():
    count = budget(3)
    # waiting, a call may take the budget and one more: the tag first, then the budget's count
    assert count.state == "waiting" and count.free_tokens == 4
    assert feed(count, [8, 0, 2, 3]) == [4, 3, 2, 1]  # blank, tag, two tokens of text
    count.take(2)
    assert count.state == "forcing" and count.free_tokens == 0 and count.forced_token == 1
    assert feed(count, [1, 6, 1]) == [0, 0, 0]
    count.take(1)
    assert count.state == "done" and count.free_tokens is None and count.forced_token is None
    count.take(0)  # a tag in the answer counts no more
    assert count.state == "done"
    # thinking text that ends with a newline is closed without another
    count = budget(2)
    feed(count, [0, 2, 7])
    assert count.state == "forcing" and count._forced == CLOSING[0]


def test_the_count_leaves_a_block_the_model_closes_and_a_reply_that_opens_none():
    count = budget(4)
    feed(count, [0, 2, 4, 5])  # the tag in two tokens
    assert count.state == "done" and count.count == 3
    count = budget(4)
    feed(count, [0, 6])
    assert count.state == "done"
    count = budget(0)
    assert feed(count, [8, 9]) == [1, None]  # blank, then text: no block
    # the opening tag's token may carry the block's start, even its end
    table = [b"<think>ab", b"<think>a</think>", b"c"]
    count = ThinkingBudget(1, None, table, CLOSING)
    count.take(0)
    assert count.state == "counting" and count.count == 0
    count = ThinkingBudget(1, None, table, CLOSING)
    count.take(1)
    assert count.state == "done"


def test_a_block_the_prompt_opened_is_counted_from_the_replys_first_token():
    count = budget(2, opened="\n")
    assert count.state == "counting" and count.free_tokens == 2
    count = budget(0, opened="\n")  # the prompt's newline: no other before the tag
    assert count.state == "forcing" and count._forced == CLOSING[0]
    count = budget(0, opened="")
    assert count._forced == CLOSING[1]


def test_the_budget_is_checked_with_the_other_params():
    assert SamplingParams(thinking_token_budget=0).thinking_token_budget == 0
    for bad in (-1, True, 2.5, "8"):
        with pytest.raises(ValueError, match="thinking_token_budget=.* an int >= 0"):
            SamplingParams(thinking_token_budget=bad)


# ---- end to end on a tiny Qwen3 whose tags are tokens of their own ------------------------------


@pytest.fixture(scope="module")
def think_tokens(tmp_path_factory):
    source, _ = make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"))
    return with_think_tokens(source, tmp_path_factory.mktemp("tags") / "model")


@pytest.fixture(scope="module")
def llm(think_tokens):
    with LLM.from_pretrained(think_tokens, show_progress=False, max_seq_len=512) as model:
        yield model


def opening_bias(llm: LLM) -> dict[int, float]:
    """A bias that makes the random model open a block (and go on writing the tag)."""
    return {llm.tokenizer.token_to_id("<think>"): 50}


def check_bounded(llm: LLM, free: list[int], bounded: list[int], n: int) -> None:
    """``bounded`` is ``free`` (the same request without a budget) with its thinking cut after
    ``n`` tokens by the closing tag, and the reply going on from there."""
    open_id = llm.tokenizer.token_to_id("<think>")
    assert free[0] == bounded[0] == open_id
    closing = llm._thinking_closing[1]
    assert bounded[: 1 + n] == free[: 1 + n]
    assert bounded[1 + n : 1 + n + len(closing)] == closing
    assert llm.tokenizer.token_to_id("</think>") not in free


@pytest.mark.parametrize("n", [0, 3, 11])
def test_the_thinking_ends_at_the_budget_on_every_decoding_path(think_tokens, n, kernels):
    llm = LLM.from_pretrained(think_tokens, show_progress=False, max_seq_len=512)
    params = SamplingParams(temperature=0, max_tokens=24, logit_bias=opening_bias(llm))
    free = llm.chat(ASK, params).output.token_ids
    steps = []
    decode_steps = llm.engine.decode_steps
    llm.engine.decode_steps = lambda *a, **k: steps.append(decode_steps(*a, **k)) or steps[-1]
    bounded = llm.chat(ASK, params.with_changes(thinking_token_budget=n))
    del llm.engine.decode_steps
    check_bounded(llm, free, bounded.output.token_ids, n)
    assert bounded.reasoning == "<think>" * n and bounded.content.startswith("<think>")
    if kernels == "native" and n == 11:
        assert max(steps) > 1  # several steps a call ran, and stopped at the budget
    # beside an unbounded request in one batch: each as alone
    both = llm.generate(
        [llm.chat_prompt_ids(ASK)] * 2,
        [params, params.with_changes(thinking_token_budget=n)],
    )
    assert [o.token_ids for o in both] == [free, bounded.output.token_ids]
    llm.close()


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_speculation_stops_its_proposals_at_the_budget(think_tokens, llm, draft):
    params = SamplingParams(temperature=0, max_tokens=24, logit_bias=opening_bias(llm))
    free = llm.chat(ASK, params).output.token_ids
    source = "ngram" if draft == "ngram" else think_tokens  # (a draft that proposes the target's)
    with LLM.from_pretrained(
        think_tokens, show_progress=False, max_seq_len=512, draft=source, num_speculative_tokens=4
    ) as spec:
        for n in (2, 9):
            out = spec.chat(ASK, params.with_changes(thinking_token_budget=n)).output
            check_bounded(llm, free, out.token_ids, n)
            assert out.speculative.num_accepted > 0
        # sampled and seeded: the tokens before the tag are those without a budget (proposals
        # were cut to the budget's count, and took other draws)
        from tests.engine.test_reasoning_chat import OPENING_TEMPLATE

        kwargs = {"chat_template": OPENING_TEMPLATE}
        table = llm.tokenizer.token_bytes()
        checked = 0
        for seed in range(4):
            sampled = SamplingParams(temperature=0.9, max_tokens=16, seed=seed)
            free = spec.chat(ASK, sampled, **kwargs).output.token_ids
            for n in (3, 6):
                out = spec.chat(ASK, sampled.with_changes(thinking_token_budget=n), **kwargs)
                cut = n
                while ends_inside_character(b"\n" + b"".join(table[t] for t in free[:cut])):
                    cut += 1
                ids = out.output.token_ids
                assert ids[:cut] == free[:cut], (draft, seed, n)
                if cut < len(free):  # (else the reply ended first)
                    assert llm.tokenizer.token_to_id("</think>") in ids[cut : cut + 2]
                    checked += 1
        assert checked >= 4


def test_a_budget_streams_and_reports_logprobs_of_the_forced_tag(llm):
    params = SamplingParams(
        temperature=0, max_tokens=20, logit_bias=opening_bias(llm), thinking_token_budget=4
    )
    whole = llm.chat(ASK, params).output
    assert "".join(llm.stream_chat(ASK, params)) == whole.text
    with_logprobs = llm.chat(ASK, params.with_changes(logprobs=2)).output
    assert with_logprobs.token_ids == whole.token_ids
    assert len(with_logprobs.logprobs) == len(whole.token_ids)
    assert all(e.logprob <= 0 for e in with_logprobs.logprobs)

    async def streamed() -> str:
        return "".join([t async for t in llm.astream(llm.chat_prompt_ids(ASK), params)])

    assert asyncio.run(streamed()) == whole.text


def test_a_block_closed_under_the_budget_is_left_alone(llm):
    close = llm.tokenizer.token_to_id("</think>")
    bias = {**opening_bias(llm), close: 49}  # "<think></think><think></think>..."
    params = SamplingParams(temperature=0, max_tokens=12, logit_bias=bias)
    free = llm.chat(ASK, params).output.token_ids
    assert free[1] == close
    assert llm.chat(ASK, params.with_changes(thinking_token_budget=5)).output.token_ids == free
    # a reply that opens no block: nothing changes
    plain = SamplingParams(temperature=0, max_tokens=12)
    free = llm.chat(ASK, plain).output.token_ids
    assert llm.tokenizer.token_to_id("<think>") not in free
    budgeted = plain.with_changes(thinking_token_budget=0)
    assert llm.chat(ASK, budgeted).output.token_ids == free
    # nor does a budget where the prompt closed the block (Qwen3's enable_thinking=False)
    forced_open = params.with_changes(logit_bias=opening_bias(llm))
    free = llm.chat(ASK, forced_open, enable_thinking=False).output.token_ids
    bounded = forced_open.with_changes(thinking_token_budget=0)
    assert llm.chat(ASK, bounded, enable_thinking=False).output.token_ids == free


def test_a_constraint_after_the_thinking_takes_the_reply_after_the_forced_tag(llm):
    answer = r"It is [a-z]{3,8}\."
    params = SamplingParams(
        temperature=0,
        max_tokens=60,
        logit_bias=opening_bias(llm),
        regex=answer,
        thinking_token_budget=5,
    )
    reply = llm.chat(ASK, params)  # (chat puts the regex after the thinking)
    assert reply.reasoning == "<think>" * 5 and re.fullmatch(answer, reply.content)
    assert reply.finish_reason == "stop"
    # generate takes an AfterThinking as it is
    own = params.with_changes(constraint=AfterThinking(Regex(answer), opened=False))
    assert llm.generate(llm.chat_prompt_ids(ASK), own).text == reply.output.text
    # one whose opened contradicts the prompt is refused (a cross-feature audit found the
    # request failing inside the grammar, or the budget left unapplied without a word)
    opened_prompt = llm.chat_prompt_ids(ASK, chat_template=OPENING)
    wrong = [
        (opened_prompt, own, "opened=False.*has opened a thinking block.*opened=True"),
        (
            llm.chat_prompt_ids(ASK),
            params.with_changes(constraint=AfterThinking(Regex(answer), opened=True)),
            "opened=True.*opens no thinking block.*opened=False",
        ),
    ]
    for prompt, contradicting, says in wrong:
        with pytest.raises(ValueError, match=says):
            llm.generate(prompt, contradicting)
    right = own.with_changes(constraint=AfterThinking(Regex(answer), opened=True))
    assert llm.generate(opened_prompt, right).finish_reason == "stop"
    # the tools' grammar, a call forced after the thinking
    tools = llm.chat(ASK, params.with_changes(regex=None), tools=[FORECAST], tool_choice="required")
    assert tools.reasoning == "<think>" * 5 and tools.finish_reason == "tool_calls"
    assert tools.tool_calls[0].name == "get_forecast"


def test_a_constraint_that_takes_the_reply_from_its_start_bounds_no_block(llm, caplog):
    """A constraint that decides the reply from its first token (generate's, or chat's where it
    writes the block itself) is refused beside a budget after a block the prompt opened, which
    the budget could not close under it. Where the reply may open one, a block would be the
    constraint's own text: the budget is not applied, logged where the constraint may write one
    (after blanks too: a review found those let through). It was refused on any model, even
    where no block could come."""
    params = SamplingParams(temperature=0, max_tokens=8, regex="[a-z]+", thinking_token_budget=2)
    opened = llm.chat_prompt_ids(ASK, chat_template=OPENING)
    with pytest.raises(ValueError, match="thinking_token_budget=2 needs .*AfterThinking"):
        llm.generate(opened, params)
    may_open = llm.chat_prompt_ids(ASK)
    without = params.with_changes(thinking_token_budget=None)
    with caplog.at_level("WARNING", logger="brisklm"):
        assert llm.generate(may_open, params).token_ids == llm.generate(may_open, without).token_ids
    assert "not applied" not in caplog.text
    for blanks in ("", "\n", "\t", "  ", "\n\n\n"):
        writes_the_block = params.with_changes(regex=blanks + r"<think>[a-z]*</think>[a-z]+")
        unbounded = writes_the_block.with_changes(thinking_token_budget=None)
        for call in (lambda p: llm.generate(may_open, p), lambda p: llm.chat(ASK, p).output):
            caplog.clear()
            with caplog.at_level("WARNING", logger="brisklm"):
                assert call(writes_the_block).token_ids == call(unbounded).token_ids
            assert "thinking_token_budget=2 is not applied: the Regex" in caplog.text, blanks
    # and the engine goes on serving
    assert llm.chat(ASK, SamplingParams(temperature=0, max_tokens=3)).output.token_ids


def test_the_server_takes_a_budget(llm):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from brisklm.server.app import build_app

    body = {
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 20,
        "logit_bias": {str(k): v for k, v in opening_bias(llm).items()},
        "thinking_token_budget": 3,
    }
    expected = llm.chat(
        ASK,
        SamplingParams(
            temperature=0, max_tokens=20, logit_bias=opening_bias(llm), thinking_token_budget=3
        ),
    )
    with TestClient(build_app(llm, "tiny")) as http:
        reply = http.post("/v1/chat/completions", json=body).json()
        message = reply["choices"][0]["message"]
        assert message["reasoning_content"] == expected.reasoning == "<think>" * 3
        assert message["content"] == expected.content
        # a constraint from the first token cannot bound a block the prompt opened
        opened = llm.tokenizer.decode(
            llm.chat_prompt_ids(ASK, chat_template=OPENING), skip_special_tokens=False
        )
        own = {"prompt": opened, "guided_regex": "[a-z]+", "thinking_token_budget": 3}
        refused = http.post("/v1/completions", json=own)
        assert refused.status_code == 400, refused.json()
        assert "thinking_token_budget=3 needs" in refused.json()["error"]["message"]
        prompt = llm.tokenizer.decode(llm.chat_prompt_ids(ASK), skip_special_tokens=False)
        del body["messages"]
        body["prompt"] = prompt
        completion = http.post("/v1/completions", json=body).json()
        assert completion["choices"][0]["text"] == expected.output.text
        bad = http.post("/v1/completions", json={**body, "thinking_token_budget": -1})
        assert bad.status_code == 400, bad.json()
        assert bad.json()["error"]["param"] == "thinking_token_budget"


def test_a_block_the_prompt_opened_ends_at_the_budget(llm):
    """A template that opens the block (DeepSeek-R1's, QwQ's): the reply's first tokens count."""
    from tests.engine.test_reasoning_chat import OPENING_TEMPLATE

    kwargs = {"chat_template": OPENING_TEMPLATE}
    params = SamplingParams(temperature=0, max_tokens=16)
    free = llm.chat(ASK, params, **kwargs).output.token_ids
    assert llm.tokenizer.token_to_id("</think>") not in free
    table = llm.tokenizer.token_bytes()
    # (the greedy reply's 4th token ends inside a character: b"\xec\x8a")
    assert ends_inside_character(b"".join(table[t] for t in free[:4]))
    for n in (0, 3, 4):
        reply = llm.chat(ASK, params.with_changes(thinking_token_budget=n), **kwargs)
        ids = reply.output.token_ids
        # the tag comes where a character is whole (past the budget for n=4)
        cut = n
        while ends_inside_character(b"".join(table[t] for t in free[:cut])):
            cut += 1
        assert cut > n or n != 4
        assert ids[:cut] == free[:cut]
        thought = b"\n" + b"".join(table[t] for t in free[:cut])
        # (the prompt's "<think>\n" ends with a newline: no other before the tag)
        closing = llm._thinking_closing[0 if thought.endswith(b"\n") else 1]
        assert ids[cut : cut + len(closing)] == closing
        assert reply.reasoning == thought.decode(errors="replace").strip("\n") and reply.content
        # a grammar after the thinking reads whole characters: a tag forced inside one failed it
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        turn = llm.chat(
            ASK,
            params.with_changes(thinking_token_budget=n, max_tokens=40),
            response_format=answer,
            **kwargs,
        )
        assert "\ufffd" not in turn.reasoning and isinstance(json.loads(turn.content)["a"], int)


def test_the_cli_and_chatbrisk_take_a_budget(think_tokens, llm, capsys):
    from brisklm.cli import main

    prompt = llm.tokenizer.decode(
        llm.chat_prompt_ids(ASK, chat_template=OPENING), skip_special_tokens=False
    )
    expected = llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=10, thinking_token_budget=2)
    )
    assert "</think>" in expected.text
    argv = ["generate", "--model", str(think_tokens), "--temperature", "0", "--max-tokens", "10"]
    assert main([*argv, "--thinking-token-budget", "2", prompt]) == 0
    assert capsys.readouterr().out.rstrip("\n") == expected.text.rstrip("\n")
    assert main([*argv, "--thinking-token-budget", "-1", prompt]) == 1
    error = capsys.readouterr().err
    assert (
        error
        == "brisklm: error: --thinking-token-budget -1: must be an int >= 0 (tokens of a thinking block)\n"
    )

    langchain = pytest.importorskip("langchain_brisklm")
    chat = langchain.ChatBrisk(
        model=str(think_tokens),
        temperature=0,
        max_tokens=20,
        logit_bias=opening_bias(llm),
        thinking_token_budget=3,
    )
    message = chat.invoke("Hi")
    assert message.additional_kwargs["reasoning_content"] == "<think>" * 3
    assert (
        chat.invoke("Hi", thinking_token_budget=1).additional_kwargs["reasoning_content"]
        == "<think>"
    )


OPENING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n<think>\n"
)


def test_special_token_tags_are_forced_as_their_tokens(think_tokens, tmp_path):
    """Think tags that are special tokens (text cannot spell them): the closing tag is forced as
    its token, and a reply's block opened by the special token is counted."""
    directory = with_special_think_tags(think_tokens, tmp_path / "special")
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as llm:
        close = llm.tokenizer.token_to_id("</think>")
        assert close in llm.tokenizer.special_token_ids
        closing = llm._thinking_closing
        assert closing[0][0] == close and close in closing[1] and closing[1][0] != close
        params = SamplingParams(temperature=0, max_tokens=16, logit_bias=opening_bias(llm))
        free = llm.chat(ASK, params).output.token_ids
        bounded = llm.chat(ASK, params.with_changes(thinking_token_budget=2))
        check_bounded(llm, free, bounded.output.token_ids, 2)
        # a constraint under which the block's rules cannot go: the reply holds no block, and the
        # budget has nothing to bound
        answer = params.with_changes(regex="[a-z]+", logit_bias=None, thinking_token_budget=2)
        turn = llm.chat(ASK, answer)
        assert turn.reasoning is None and re.fullmatch("[a-z]+", turn.content)


def test_a_character_split_at_the_budget_is_waited_for_but_not_forever():
    """The tag waits for a character the budget's last token split, but not for ever: bytes
    that never make one (a lead byte after a lead byte) kept the tag from coming (a
    reviewer's); a bound on the tokens past the budget ends the wait."""
    table = [b"ab", b"\xe4", b"\xb8", b"\xad", b""]
    count = ThinkingBudget(2, "", table, CLOSING)
    feed(count, [0, 1])  # "ab", then the first byte of 中 at the budget
    assert count.state == "counting" and count.free_tokens == 1
    feed(count, [2, 3])  # its other two: whole
    assert count.state == "forcing" and count.count == 4
    for never in (1, 4):  # lead bytes; tokens of no bytes (ids without a token)
        count = ThinkingBudget(2, "", table, CLOSING)
        assert feed(count, [0, 1] + [never] * 8)[-2:] == [1, 0]
        assert count.state == "forcing" and count.count == 2 + 8


def test_a_closing_tag_the_model_began_at_the_budget_is_let_finish():
    """ "</thi" at the budget, then the forced tag: "...</thi\\n</think>" (a review's)."""
    count = budget(2, opened="")
    feed(count, [2, 4])  # "ab", "</thi": the budget, the tag begun
    assert count.state == "counting" and count.free_tokens == 1
    feed(count, [5])  # "nk>": the model's own tag, whole
    assert count.state == "done" and count.forced_token is None
