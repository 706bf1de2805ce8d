"""The synthetic copy drills of training/train.py: every weighted token is recoverable from the
context before it, and the copy-only drills draw exactly what they always drew (the shipped seed
model's rebuild depends on it)."""

from __future__ import annotations

import random

import pytest
import torch

from brisklm import default_model_path
from training.train import DRILL_KINDS, FIRST_TEXT_ID, DrillTokens, copy_drills

TOKENIZER_DIR = default_model_path()


@pytest.fixture(scope="module")
def toks() -> DrillTokens:
    return DrillTokens(TOKENIZER_DIR)


def segments(packed, row: int) -> list[tuple[list[int], list[float]]]:
    ids, w, doc = packed.ids[row].tolist(), packed.weights[row].tolist(), packed.doc[row].tolist()
    out: dict[int, tuple[list[int], list[float]]] = {}
    for t, x, d in zip(ids, w, doc, strict=True):
        out.setdefault(d, ([], []))
        out[d][0].append(t)
        out[d][1].append(x)
    return list(out.values())


def original_copy_drills(n_rows: int, row_len: int, vocab_size: int, rng: random.Random):
    """The copy-only drill as the shipped models were trained on it."""
    ids = torch.zeros(n_rows, row_len, dtype=torch.long)
    w = torch.zeros(n_rows, row_len)
    for r in range(n_rows):
        t = 0
        while t < row_len:
            n_a = rng.randint(6, 40)
            a = [rng.randrange(FIRST_TEXT_ID, vocab_size) for _ in range(n_a)]
            seq = (a + a)[: row_len - t]
            n = len(seq)
            ids[r, t : t + n] = torch.tensor(seq)
            w[r, t + n_a + 1 : t + n] = 1.0
            t += n
    return ids, w


def test_copy_only_drills_are_unchanged(toks: DrillTokens) -> None:
    ids, w = original_copy_drills(4, 385, toks.vocab_size, random.Random(7))
    packed = copy_drills(4, 385, toks, random.Random(7))
    assert torch.equal(packed.ids, ids)
    assert torch.equal(packed.weights, w)


@pytest.mark.parametrize("kind", DRILL_KINDS)
def test_weighted_tokens_are_in_the_context(toks: DrillTokens, kind: str) -> None:
    packed = copy_drills(6, 385, toks, random.Random(3), (kind,))
    n_weighted = 0
    for row in range(6):
        segs = segments(packed, row)
        assert sum(len(s) for s, _ in segs) == 385
        for seq, w in segs[:-1]:  # the last segment of a row is cut short
            assert w[0] == 0.0
            n_weighted += int(sum(w))
            if kind in ("copy", "digits"):
                half = len(seq) // 2
                assert seq[:half] == seq[half:]
                assert w == [0.0] * (half + 1) + [1.0] * (half - 1)
                if kind == "digits":
                    assert len(set(seq)) <= 13  # a small alphabet: tokens repeat
            else:
                # k:v, pairs then the same pairs reordered; every weighted value follows its key
                first = [i for i, x in enumerate(w) if x][0] - 1
                text = seq[:first]
                pairs_a = split_pairs(text, toks)
                pairs_b = split_pairs(seq[first:], toks)
                assert sorted(pairs_a) == sorted(pairs_b)
                assert pairs_a != pairs_b
    assert n_weighted > 500


def split_pairs(seq: list[int], toks: DrillTokens) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    pairs, cur = [], []
    for t in seq:
        if t == toks.comma and toks.colon in cur:
            i = len(cur) - 1 - cur[::-1].index(toks.colon)
            pairs.append((tuple(cur[:i]), tuple(cur[i + 1 :])))
            cur = []
        else:
            cur.append(t)
    assert not cur
    return pairs


def test_mixed_kinds_fill_rows(toks: DrillTokens) -> None:
    packed = copy_drills(3, 385, toks, random.Random(0), DRILL_KINDS)
    assert packed.ids.shape == (3, 385)
    assert (packed.ids >= 0).all() and (packed.ids < toks.vocab_size).all()
    assert 0.3 < float(packed.weights.mean()) < 0.7
