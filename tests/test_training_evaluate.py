"""training/evaluate.py's scoring of tool calls: why a call misses (the first of count, name,
argument names, value) and the exact match by prompt length."""

from __future__ import annotations

import pytest

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
