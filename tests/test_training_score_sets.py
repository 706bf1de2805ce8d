"""training/score_sets.py: scoring a model on several held-out sets, and pairing two scorings'
misses prompt by prompt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from training import generate_data, score_sets

BUNDLED = Path(__file__).resolve().parents[1] / "src" / "brisklm" / "assets" / "brisk-chat"


def write_set(monkeypatch: pytest.MonkeyPatch, out: Path, seed: int) -> Path:
    monkeypatch.setattr(
        sys,
        "argv",
        ["generate_data", "--out", str(out), "--seed", str(seed), "--num-train", "0",
         "--num-eval", "3", "--request-order"],
    )  # fmt: skip
    generate_data.main()
    return out


@pytest.mark.skipif(not (BUNDLED / "model.safetensors").is_file(), reason="no bundled model")
def test_score_writes_each_set_and_compare_pairs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [write_set(monkeypatch, tmp_path / f"ev{s}", s) for s in (11, 12)]
    scores = tmp_path / "scores"
    score_sets.main(
        ["score", "--model", str(BUNDLED), "--tag", "a", "--out-dir", str(scores), "--limit", "2",
         *map(str, sets)]
    )  # fmt: skip
    printed = capsys.readouterr().out.splitlines()
    records = [json.loads((scores / "a" / f"{s.name}.tool_call.json").read_text()) for s in sets]
    for record, s in zip(records, sets, strict=True):
        assert record["items"] == 2 and record["constrained"] is True
        assert record["set"] == str(s) and record["task"] == "tool_call"
        # the figure and the misses written agree
        assert record["metrics"]["exact_match"] == 1 - len(record["failures"]) / 2
    mean = sum(r["metrics"]["exact_match"] for r in records) / 2
    assert printed[-1] == f"a tool_call: exact_match {mean:.2%} of 4 (mean)"

    # a second tag whose copy of one set's scoring misses every prompt: everything A got right
    # there is "new", nothing is "fixed"
    (scores / "b").mkdir()
    worse = dict(records[0])
    items = json.loads((sets[0] / "eval.json").read_text())["tool_call"][:2]
    worse["failures"] = [
        {"request": it["prompt_messages"][-1]["content"], "expected": it["expected"]}
        for it in items
    ]
    (scores / "b" / f"{sets[0].name}.tool_call.json").write_text(json.dumps(worse))
    score_sets.main(["compare", "--out-dir", str(scores), "a", "b"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"a -> b: fixed 0, new {2 - len(records[0]['failures'])}, z = ")


def failure(request: str, value: int) -> dict:
    return {"request": request, "expected": [{"name": "f", "arguments": {"x": value}}], "got": ""}


def test_compare_counts_repeated_prompts_and_tells_prompts_apart_by_answer() -> None:
    a = {"failures": [failure("r", 1), failure("r", 1), failure("r", 2), failure("s", 1)]}
    b = {"failures": [failure("r", 1), failure("t", 1)]}
    # a's second copy of ("r", 1), ("r", 2) and ("s", 1) are right in b; ("t", 1) is b's own
    assert score_sets.compare_records(a, b) == (3, 1)
    # extraction misses are keyed by their text
    ext = {"failures": [{"text": "Ann is 3.", "expected": {"age": 3}, "got": "{}"}]}
    assert score_sets.compare_records(ext, {"failures": []}) == (1, 0)


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="eval.json does not exist"):
        score_sets.load_items(tmp_path, "tool_call", 10)
    (tmp_path / "eval.json").write_text(json.dumps({"extract": []}))
    with pytest.raises(SystemExit, match=r"has no task 'tool_call' \(it has \['extract'\]\)"):
        score_sets.load_items(tmp_path, "tool_call", 10)
    with pytest.raises(SystemExit, match="no set scored for task 'tool_call' under both"):
        score_sets.main(["compare", "--out-dir", str(tmp_path), "a", "b"])
    with pytest.raises(SystemExit):
        score_sets.main(["score", "--model", "m", "--tag", "t", "--out-dir", "o", "--limit", "0",
                         str(tmp_path)])  # fmt: skip
    assert "--limit must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(not (BUNDLED / "model.safetensors").is_file(), reason="no bundled model")
def test_small_talk_sets_are_scored_by_their_text_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --task tool_none was offered but its scoring looked for exact_match / field_accuracy
    # (KeyError after the first set's record was written)
    data = write_set(monkeypatch, tmp_path / "ev13", 13)
    scores = tmp_path / "scores"
    score_sets.main(
        ["score", "--model", str(BUNDLED), "--tag", "a", "--out-dir", str(scores), "--limit", "2",
         "--task", "tool_none", str(data)]
    )  # fmt: skip
    record = json.loads((scores / "a" / "ev13.tool_none.json").read_text())
    figure = record["metrics"]["text_answer"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"a tool_none: text_answer {figure:.2%} of 2 (mean)"
    )
