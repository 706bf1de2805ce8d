"""N-gram prompt lookup: right continuation, longest n-gram first, latest occurrence, limits, speed."""

from __future__ import annotations

import numpy as np
import pytest

from brisklm.speculative import DraftRow, NgramProposer, Proposer


def test_finds_the_continuation_of_the_suffix():
    proposer = NgramProposer(max_ngram=3, min_ngram=1, num_speculative_tokens=3)
    #          0  1  2  3  4  5  6  7  8
    context = [5, 6, 7, 8, 9, 1, 2, 6, 7]
    assert proposer.lookup(context) == [8, 9, 1]  # "6 7" occurred at 1..2, followed by 8 9 1


def test_prefers_the_longest_ngram_over_a_more_recent_shorter_one():
    proposer = NgramProposer(max_ngram=3, min_ngram=1, num_speculative_tokens=2)
    context = [1, 2, 3, 40, 41, 9, 3, 50, 51, 1, 2, 3]
    # "3" last occurred at 6 (-> 50 51), but "1 2 3" occurred at 0..2 (-> 40 41): longest wins.
    assert proposer.lookup(context) == [40, 41]
    # Capped at bigrams, "2 3" occurs only at 1..2 as well.
    assert NgramProposer(max_ngram=2, num_speculative_tokens=2).lookup(context) == [40, 41]
    # Unigrams only: the most recent "3" is at 6.
    assert NgramProposer(max_ngram=1, num_speculative_tokens=2).lookup(context) == [50, 51]


def test_prefers_the_most_recent_occurrence():
    proposer = NgramProposer(max_ngram=2, num_speculative_tokens=2)
    context = [7, 8, 1, 1, 0, 7, 8, 2, 2, 0, 7, 8]
    assert proposer.lookup(context) == [2, 2]


def test_returns_empty_when_nothing_matches():
    proposer = NgramProposer(max_ngram=3, min_ngram=1, num_speculative_tokens=4)
    assert proposer.lookup([1, 2, 3, 4, 5]) == []
    assert proposer.lookup([1]) == []
    assert proposer.lookup([]) == []
    # A unigram match exists, but min_ngram=2 rules it out.
    assert NgramProposer(max_ngram=3, min_ngram=2).lookup([4, 1, 2, 3, 4]) == []
    unigram = NgramProposer(max_ngram=3, min_ngram=1, num_speculative_tokens=4)
    assert unigram.lookup([4, 1, 2, 3, 4]) == [1, 2, 3, 4]


def test_respects_k():
    proposer = NgramProposer(max_ngram=2, num_speculative_tokens=4)
    context = list(range(20)) + [3, 4]
    assert proposer.lookup(context) == [5, 6, 7, 8]
    assert proposer.lookup(context, 2) == [5, 6]
    assert proposer.lookup(context, 0) == []
    assert proposer.lookup(context, 10) == list(range(5, 15))


def test_short_period_wraps_around():
    proposer = NgramProposer(max_ngram=3, num_speculative_tokens=5)
    # "9 9 9" last occurred one token earlier: only one token follows it, and repeating the
    # period gives the rest.
    assert proposer.lookup([1, 9, 9, 9, 9]) == [9, 9, 9, 9, 9]
    assert proposer.lookup([0, 1, 2, 1, 2, 1, 2]) == [1, 2, 1, 2, 1]


def test_accepts_numpy_input():
    proposer = NgramProposer(num_speculative_tokens=2)
    assert proposer.lookup(np.array([3, 4, 5, 3, 4])) == [5, 3]


def test_proposer_interface_rows_and_limits():
    proposer = NgramProposer(max_ngram=2, num_speculative_tokens=3)
    assert isinstance(proposer, Proposer)
    rows = [
        DraftRow(
            slot=0, prompt_token_ids=[1, 2, 3, 4], output_token_ids=[1, 2], max_draft_tokens=5
        ),
        DraftRow(slot=1, prompt_token_ids=[1, 2, 3], output_token_ids=[], max_draft_tokens=5),
        DraftRow(slot=2, prompt_token_ids=[1, 2, 3, 1], output_token_ids=[2], max_draft_tokens=1),
        DraftRow(slot=3, prompt_token_ids=[1, 1], output_token_ids=[], max_draft_tokens=0),
    ]
    proposals = proposer.propose(rows)
    assert [p.token_ids for p in proposals] == [[3, 4, 1], [], [3], []]
    assert all(p.probs is None for p in proposals)
    proposer.rollback(0, 2)  # no-ops
    proposer.release(0)


def test_invalid_settings():
    with pytest.raises(ValueError, match="min_ngram"):
        NgramProposer(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        NgramProposer(num_speculative_tokens=0)


def _reference_lookup(tokens: list[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Plain-Python prompt lookup, the definition the fast version must match."""
    length = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                extended = list(tokens)
                while len(extended) < length + k:
                    extended.append(extended[start + n + len(extended) - length])
                return extended[length : length + k]
    return []


def test_matches_plain_python_reference_on_random_contexts():
    rng = np.random.default_rng(0)
    for trial in range(300):
        vocab = int(rng.integers(2, 8))
        tokens = rng.integers(0, vocab, size=int(rng.integers(0, 40))).tolist()
        max_ngram = int(rng.integers(1, 5))
        min_ngram = int(rng.integers(1, max_ngram + 1))
        k = int(rng.integers(1, 6))
        proposer = NgramProposer(max_ngram, min_ngram, k)
        assert proposer.lookup(tokens) == _reference_lookup(tokens, max_ngram, min_ngram, k), (
            trial,
            tokens,
        )


def test_a_long_prompt_is_converted_once(monkeypatch):
    # (This was a timing: under 10 ms a lookup on 8k tokens. What makes it fast is checked
    # instead: the prompt becomes an array once per slot, not at every step.)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 32_000, size=8192).tolist()
    tokens += tokens[1000:1003]  # a trigram to find far back
    proposer = NgramProposer(max_ngram=3, num_speculative_tokens=5)
    assert proposer.lookup(tokens) == tokens[1003:1008]
    row = DraftRow(0, tokens[:6000], tokens[6000:], max_draft_tokens=5)
    first = proposer.propose([row])[0].token_ids
    assert first == tokens[1003:1008]
    converted = []
    fromiter = np.fromiter

    def counted(values, dtype, count=-1):
        converted.append(count)
        return fromiter(values, dtype, count=count)

    monkeypatch.setattr(np, "fromiter", counted)
    for _ in range(5):
        assert proposer.propose([row])[0].token_ids == first
    assert converted == [len(tokens) - 6000] * 5  # the output alone, each step


def test_cached_prompt_is_never_mistaken_for_another_request_in_the_slot():
    proposer = NgramProposer(max_ngram=2, num_speculative_tokens=2)
    first = [1, 2, 3, 1, 2]
    assert proposer.propose([DraftRow(0, first, [], 2)])[0].token_ids == [3, 1]
    # A new request in the same slot without release: a new prompt object, so no stale array.
    second = [1, 2, 8, 9, 1, 2]
    assert proposer.propose([DraftRow(0, second, [], 2)])[0].token_ids == [8, 9]
    # Output tokens are always read fresh.
    assert proposer.propose([DraftRow(0, second, [7, 1, 2], 2)])[0].token_ids == [7, 1]
    proposer.release(0)
    assert proposer.propose([DraftRow(0, second, [], 2)])[0].token_ids == [8, 9]
