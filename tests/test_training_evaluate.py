"""training/evaluate.py's scoring of tool calls: why a call misses (the first of count, name,
argument names, value), the exact match by prompt length, and the text answers to small talk with
tools offered."""

from __future__ import annotations

import pytest

from training import evaluate
from training.evaluate import by_length, call_miss, same_value

EXPECTED = [
    {"name": "book_room", "arguments": {"guest": "Zoë", "nights": 3}},
    {"name": "send_note", "arguments": {}},
]


def calls(*pairs: tuple[str, dict]) -> list[dict]:
    return [{"name": n, "arguments": a} for n, a in pairs]


def test_matching_calls_are_no_miss() -> None:
    same = calls(("book_room", {"nights": 3, "guest": "Zoë"}), ("send_note", {}))
    assert call_miss(same, EXPECTED) is None


@pytest.mark.parametrize(
    ("got", "kind"),
    [
        (calls(("book_room", {"guest": "Zoë", "nights": 3})), "count"),
        ([], "count"),
        # a wrong name is reported before wrong arguments in the same call
        (calls(("book_desk", {"guest": "Zoe"}), ("send_note", {})), "name"),
        (calls(("send_note", {}), ("book_room", {"guest": "Zoë", "nights": 3})), "name"),
        (calls(("book_room", {"guest": "Zoë"}), ("send_note", {})), "keys"),
        (calls(("book_room", {"guest": "Zoë", "nights": 3, "x": 1}), ("send_note", {})), "keys"),
        (calls(("book_room", {"guest": "Zoe", "nights": 3}), ("send_note", {})), "value"),
        (calls(("book_room", {"guest": "Zoë", "nights": "3"}), ("send_note", {})), "value"),
        (calls(("book_room", {"guest": "Zoë", "nights": 3.5}), ("send_note", {})), "value"),
    ],
)
def test_call_miss_kind(got: list[dict], kind: str) -> None:
    assert call_miss(got, EXPECTED) == kind


def test_a_bool_never_equals_a_number() -> None:
    assert not same_value(True, 1) and not same_value(0, False)
    assert call_miss(calls(("f", {"on": 1})), calls(("f", {"on": True}))) == "value"
    assert same_value({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2}]})


def test_exact_match_by_prompt_length() -> None:
    table = by_length([12, 99, 100, 350, 399, 399], [True, False, True, True, True, False])
    assert table == {
        "0-99": {"exact_match": 0.5, "n": 2},
        "100-199": {"exact_match": 1.0, "n": 1},
        "300-399": {"exact_match": 2 / 3, "n": 3},
    }
    # in order of length, empty buckets left out
    assert list(table) == ["0-99", "100-199", "300-399"]
    with pytest.raises(ValueError):
        by_length([1, 2], [True])


class CannedRunner:
    """Stands in for evaluate.Runner: returns the given texts, in order, for any prompts."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.params: list = []

    def prompt(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return [len(messages), len(tools or [])]

    def generate(self, prompts: list[list[int]], params: list) -> list[str]:
        self.params = params
        return self.texts[: len(prompts)]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.mark.parametrize("constrained", [True, False])
def test_no_tool_answers_count_text_without_a_call(constrained: bool) -> None:
    def item(user: str, reply: str, small_talk: bool) -> dict:
        prompt = [{"role": "user", "content": user}]
        return {"prompt_messages": prompt, "tools": TOOLS, "expected_text": reply} | (
            {"small_talk": True} if small_talk else {}
        )

    items = [
        item("Hi there", "Hello! How can I help you today?", True),  # the reply written: exact
        item("Cheers", "You're welcome!", True),  # another text answer: counted, not exact
        item("Hey there", "Hello!", True),  # a call: not a text answer
        item("Good evening", "Hello!", True),  # a call that does not parse: not one either
        item("What is 2 plus 3?", "5.", False),  # empty text: not an answer
    ]
    texts = [
        "Hello! How can I help you today?",
        "Glad I could help!",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "there"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "argu',
        "  ",
    ]
    run = CannedRunner(texts)
    metrics, failures = evaluate.eval_no_tool(run, items, constrained)  # type: ignore[arg-type]
    assert metrics == {
        "text_answer": 2 / 5,
        "small_talk_text_answer": 2 / 4,
        "small_talk_items": 4,
        "reply_exact": 1 / 5,
    }
    assert [f["request"] for f in failures] == ["Hey there", "Good evening", "What is 2 plus 3?"]
    # constrained, each prompt gets its tools' grammar (text or calls); unconstrained, none
    assert all((p.grammar is not None) == constrained for p in run.params)
    assert evaluate.GRAMMAR_TASKS["tool_none"] is evaluate.eval_no_tool


def test_chat_turns_are_scored_against_the_first_assistant_reply() -> None:
    # A chat without a system message took its first two messages as the prompt (user, assistant)
    # and was scored against the second user question
    def chat(*messages: tuple[str, str]) -> dict:
        return {"kind": "chat", "messages": [{"role": r, "content": c} for r, c in messages]}

    samples = [
        chat(("user", "Thank you!"), ("assistant", "You're welcome!"),
             ("user", "What day comes after Saturday?"), ("assistant", "Sunday.")),
        chat(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"),
             ("user", "Bye"), ("assistant", "Goodbye!")),
        chat(("user", "2+2?"), ("assistant", "4.")),
    ]  # fmt: skip
    run = CannedRunner(["You're welcome!", "Hello!", "5."])
    metrics, failures = evaluate.eval_chat(run, samples, 10)  # type: ignore[arg-type]
    assert metrics["chat_exact"] == 2 / 3
    assert [f["expected"] for f in failures] == ["4."]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--limit", "0"], "--limit 0: at least 1"),  # it failed later: "no prompts given"
        (["--data", "no-such-set"], "no no-such-set/eval.json: --data names a set"),
    ],
)
def test_bad_evaluation_flags_are_usage_errors(monkeypatch, capsys, flags, words) -> None:
    import sys

    monkeypatch.setattr(sys, "argv", ["evaluate.py", "--data", "no-such-set", *flags])
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main()
    assert exit_info.value.code == 2 and words in capsys.readouterr().err
