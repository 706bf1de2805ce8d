"""brisklm.reasoning: a reply's thinking block told apart from its content, whole and streamed."""

from __future__ import annotations

import random

import pytest

from brisklm.reasoning import (
    ReasoningSplitter,
    may_close_thinking,
    prompt_thinking,
    split_reasoning,
    template_reasons,
)

CASES = [
    # (reply, the prompt opened the block, reasoning, content)
    ("<think>\nLet me see.\n</think>\n\nParis.", False, "Let me see.", "Paris."),
    ("<think>\n\n</think>\n\nHi!", False, "", "Hi!"),
    ("  <think>a\n\nb</think>c\n", False, "a\n\nb", "c\n"),
    ("Paris.", False, None, "Paris."),
    ("The tag <think> mid-reply is content", False, None, "The tag <think> mid-reply is content"),
    ("<thinking> is not the tag", False, None, "<thinking> is not the tag"),
    ("<think>\ncut off by max_tokens\n</thi", False, "cut off by max_tokens\n</thi", ""),
    ("Okay, the user asks.\n</think>\n\nParis.", True, "Okay, the user asks.", "Paris."),
    ("no close at all", True, "no close at all", ""),
    ("", False, None, ""),
    ("<think>x</think>", False, "x", ""),
    (
        "<think>x</think>\n\n<tool_call>\n{}\n</tool_call>",
        False,
        "x",
        "<tool_call>\n{}\n</tool_call>",
    ),
]


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), CASES)
def test_a_whole_reply_splits_into_reasoning_and_content(text, inside, reasoning, content):
    assert split_reasoning(text, inside) == (reasoning, content)
    assert split_reasoning(text, None) == (None, text)  # a template that knows no thinking


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), CASES)
def test_a_streamed_reply_adds_up_to_the_whole_however_it_is_cut(text, inside, reasoning, content):
    rng = random.Random(len(text))
    for _ in range(40):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text), rng.randint(0, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        splitter = ReasoningSplitter(inside)
        thought, said = "", ""
        for piece in pieces:
            r, c = splitter.feed(piece)
            thought, said = thought + r, said + c
            assert "</think>" not in thought and "<think>" not in thought
        r, c = splitter.finish()
        assert (thought + r if splitter.reasoned else None, said + c) == (reasoning, content)


def test_a_stream_holds_back_only_what_may_be_a_tag():
    splitter = ReasoningSplitter()
    assert splitter.feed("<thi") == ("", "")  # maybe the tag
    assert splitter.feed("nk>\nStep one") == ("Step one", "")
    assert splitter.feed("\n</th") == ("", "")  # newlines, then maybe the closing tag
    assert splitter.feed("ey say") == ("\n</they say", "")
    assert splitter.feed("</think>\n") == ("", "")
    assert splitter.feed("\nAnswer") == ("", "Answer")


def test_templates_and_prompts_that_open_thinking():
    assert template_reasons("{{ '<think>\\n' + r + '\\n</think>' }}")
    # DeepSeek-R1's first templates only strip the block from earlier replies
    assert template_reasons("{{ m.content.split('</think>')[-1] }}")
    assert not template_reasons("{{ messages }}{# no <think> ... </think> here #}")
    assert not template_reasons(None)
    assert prompt_thinking("<|im_start|>assistant\n<think>\n") is True
    assert prompt_thinking("<｜Assistant｜><think>\n") is True
    assert prompt_thinking("<|im_start|>assistant\n<think>\nLet me see") is True  # a prefill
    # closed in the reply's turn (Qwen3's enable_thinking=False, a prefill past the block): the
    # reply holds none
    assert prompt_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n") is None
    assert prompt_thinking("<｜Assistant｜><think>\nhm\n</think>\n\nThe answer") is None
    # a user's literal tag, the template's turn markup after it; an earlier reply's block
    assert (
        prompt_thinking("<|im_start|>user\nsay <think><|im_end|>\n<|im_start|>assistant\n") is False
    )
    assert prompt_thinking("<｜User｜>say <think><｜Assistant｜>") is False
    earlier = "<|im_start|>assistant\n<think>\nx\n</think>\n\nHi<|im_end|>\n<|im_start|>user\n"
    assert prompt_thinking(earlier + "Bye<|im_end|>\n<|im_start|>assistant\n") is False
    assert prompt_thinking("<|im_start|>assistant\n") is False


def test_constraints_that_may_close_a_thinking_block():
    from brisklm.constrained.spec import Choice, Grammar, JsonSchema, Regex

    assert may_close_thinking(None)
    assert may_close_thinking(Regex(r"[a-z]+\n</think>\n\nok"))
    assert may_close_thinking(Regex(r"[a-z]+<\/think>ok"))
    assert may_close_thinking(Grammar('start: /[a-z]+/ "</think>" "ok"'))
    assert may_close_thinking(Choice(["a</think>b"]))
    assert not may_close_thinking(JsonSchema({"type": "object"}))
    assert not may_close_thinking(Regex(r"[0-9]+"))
