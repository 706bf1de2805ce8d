"""Stop strings: matching across chunks, earliest match, hold-back, and a random-chunking property."""

import random
from typing import Any

import pytest

from brisklm.sampling import StopStringMatcher, find_stop_string, hold_back_length


def reference_final_text(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """Brute force: grow the text one character at a time and stop at the first completed match
    (the longest one when several complete on the same character)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stop if text[:end].endswith(s)]
        if done:
            s = max(done, key=len)
            return (text[:end] if include else text[: end - len(s)]), s
    return text, None


def stream(
    chunks: list[str], stop: list[str], include: bool = False, calls_start: Any = None
) -> tuple[list[str], StopStringMatcher]:
    matcher = StopStringMatcher(stop, include_stop_str_in_output=include, calls_start=calls_start)
    emitted = []
    for chunk in chunks:
        emitted.append(matcher.append(chunk))
        if matcher.stopped:
            break
    if not matcher.stopped:
        emitted.append(matcher.flush())
    return emitted, matcher


def random_case(
    rng: random.Random,
    alphabet: str,
    max_stop_len: int,
    max_stops: int,
    min_text: int,
    max_text: int,
    max_cuts: int,
) -> tuple[list[str], str, list[str]]:
    """Random stop strings, a random text, and the text cut into random chunks."""
    stop = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, max_stop_len)))
        for _ in range(rng.randint(1, max_stops))
    ]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(min_text, max_text)))
    cuts = sorted(
        rng.sample(range(1, len(text)), min(rng.randint(0, max_cuts), max(len(text) - 1, 0)))
    )
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return stop, text, chunks


def test_stop_string_spanning_chunks() -> None:
    emitted, matcher = stream(["Hello wor", "ld#", "## and more"], ["###"])
    assert emitted == ["Hello wor", "ld", ""]  # "#" withheld until it turned out to be the stop
    assert matcher.stopped and matcher.stop_str == "###" and matcher.text == "Hello world"


def test_several_stop_strings_earliest_wins() -> None:
    assert find_stop_string("foo END bar STOP", ["STOP", "END"]).stop_str == "END"
    # "yz" completes before "xyz12" does, so it wins even though "xyz12" starts first.
    match = find_stop_string("axyz12", ["xyz12", "yz"])
    assert (match.start, match.end, match.stop_str) == (2, 4, "yz")
    # Same end: the longer (earlier starting) one.
    assert find_stop_string("abc", ["bc", "abc"]).stop_str == "abc"
    assert find_stop_string("nothing here", ["STOP"]) is None


def test_search_only_covers_the_tail_that_can_hold_a_new_match() -> None:
    # A match entirely inside the already-checked text is not searched for again ...
    assert find_stop_string("STOP then more", ["STOP"], num_new_chars=5) is None
    # ... but one straddling the old/new boundary is found.
    match = find_stop_string("xx ST" + "OP yy", ["STOP"], num_new_chars=5)
    assert (match.start, match.end) == (3, 7)


def test_overlapping_prefixes() -> None:
    emitted, matcher = stream(["a", "a", "a", "b", "c"], ["aab"])
    assert "".join(emitted) == "a" == matcher.text
    assert emitted[:3] == ["", "", "a"]  # "aa" could start "aab"; the third "a" frees the first
    emitted, matcher = stream(["<", "<|", "end|>"], ["<|end|>"])
    assert "".join(emitted) == "<" and matcher.stop_str == "<|end|>"


def test_hold_back_length() -> None:
    assert hold_back_length("hello <", ["<|end|>"]) == 1
    assert hold_back_length("hello <|en", ["<|end|>"]) == 4
    assert hold_back_length("abc", ["abcd", "bcx"]) == 3
    assert hold_back_length("abc", ["bcx", "cz"]) == 2
    assert hold_back_length("abc", ["xyz"]) == 0
    assert hold_back_length("ab", ["ab"]) == 0  # a whole stop string is a match, not a prefix
    assert hold_back_length("", ["ab"]) == 0
    assert hold_back_length("anything", []) == 0


def test_include_stop_str_and_flush() -> None:
    emitted, matcher = stream(["say ", "EN", "D now"], ["END"], include=True)
    assert emitted == ["say ", "EN", "D"]  # nothing withheld: the stop string is output anyway
    assert matcher.text == "say END"
    emitted, matcher = stream(["no stop <", "|e"], ["<|end|>"])
    assert emitted == ["no stop ", "", "<|e"]  # flush releases the withheld tail
    assert not matcher.stopped and matcher.stop_str is None
    with pytest.raises(RuntimeError):
        stream(["x STOP"], ["STOP"])[1].append("more")
    with pytest.raises(ValueError):
        StopStringMatcher(["ok", ""])


def test_no_stop_strings_streams_everything() -> None:
    emitted, matcher = stream(["a", "bc", ""], [])
    assert emitted == ["a", "bc", "", ""] and matcher.text == "abc"


@pytest.mark.parametrize("include", [False, True])
def test_random_chunkings_property(include: bool) -> None:
    rng = random.Random(2024)
    for _ in range(400):
        stop, text, chunks = random_case(rng, "ab<|>", 4, 3, 0, 30, 8)
        final, stop_str = reference_final_text(text, stop, include)

        matcher = StopStringMatcher(stop, include_stop_str_in_output=include)
        emitted = ""
        for chunk in chunks:
            emitted += matcher.append(chunk)
            assert final.startswith(emitted), (text, stop, chunks)
            if not include:
                assert not any(s in emitted for s in stop)
            if matcher.stopped:
                break
            # Withheld text is only ever a possible start of a stop string.
            held = matcher.text[len(emitted) :]
            assert not held or any(s.startswith(held) and s != held for s in stop)
        if not matcher.stopped:
            emitted += matcher.flush()
        assert emitted == final == matcher.text, (text, stop, chunks)
        assert matcher.stop_str == stop_str


def test_stop_strings_held_off_until_stopping_is_allowed() -> None:
    # min_tokens: a stop string completed while stopping is not allowed is ordinary text.
    matcher = StopStringMatcher(["\n"])
    assert matcher.append("a\n", can_stop=False) == "a\n"
    assert matcher.append("b\nc", can_stop=True) == "b"
    assert matcher.stopped and matcher.text == "a\nb"
    # A stop string that began before stopping was allowed and completes after it counts; its
    # start stays withheld meanwhile.
    matcher = StopStringMatcher(["END"])
    assert matcher.append("xEN", can_stop=False) == "x"
    assert matcher.append("D", can_stop=True) == ""
    assert matcher.stopped and matcher.text == "x"


@pytest.mark.parametrize("include", [False, True])
def test_random_chunkings_with_stopping_allowed_late(include: bool) -> None:
    rng = random.Random(77)
    for _ in range(400):
        stop, text, chunks = random_case(rng, "ab<|", 3, 2, 1, 24, 6)
        first_active = rng.randint(0, len(chunks))
        boundary = sum(len(c) for c in chunks[:first_active])
        # Brute force: the first match that ends after the boundary.
        final, stop_str = text, None
        for end in range(boundary + 1, len(text) + 1):
            done = [s for s in stop if text[:end].endswith(s)]
            if done:
                stop_str = max(done, key=len)
                final = text[:end] if include else text[: end - len(stop_str)]
                break

        matcher = StopStringMatcher(stop, include_stop_str_in_output=include)
        emitted = ""
        for index, chunk in enumerate(chunks):
            emitted += matcher.append(chunk, can_stop=index >= first_active)
            assert final.startswith(emitted), (text, stop, chunks, first_active)
            if matcher.stopped:
                break
        if not matcher.stopped:
            emitted += matcher.flush()
        assert emitted == final == matcher.text, (text, stop, chunks, first_active)
        assert matcher.stop_str == stop_str


def _calls_at_marker(text: str, searched: int) -> int:
    """A reply's calls begin at its first "<c>" (as ToolCallFormat.calls_start finds a tag)."""
    return text.find("<c>", max(0, searched - 2))


def test_stop_strings_apply_only_before_the_first_tool_call() -> None:
    """As OpenAI's stop sequences, ours cut text, never a tool call: with a calls_start, a stop
    string counts only where it ends before the first call begins, in any chunking."""
    text = 'Sure, <c>{"city": "Paris, France"}</c> and, more'
    for size in range(1, len(text) + 1):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        emitted, matcher = stream(chunks, [", F", "c>", "</c>"], calls_start=_calls_at_marker)
        assert not matcher.stopped and "".join(emitted) == matcher.text == text, size
        emitted, before = stream(chunks, [", "], calls_start=_calls_at_marker)
        assert before.stopped and "".join(emitted) == before.text == "Sure", size


def test_text_withheld_before_a_call_goes_out_once_the_call_begins() -> None:
    matcher = StopStringMatcher(["Sure<x"], calls_start=_calls_at_marker)
    assert matcher.append("Sure") == ""  # may still become the stop string
    assert matcher.append("<c>{") == "Sure<c>{"  # no match may end past the call's start
    assert matcher.would_stop("Sure<x") is False and matcher.append("Sure<x") == "Sure<x"
    plain = StopStringMatcher(["Sure<x"])
    assert plain.append('<c>{"Sure') == '<c>{"'
    assert plain.would_stop("<x") and plain.append("<x") == "" and plain.stopped


def test_a_call_that_never_comes_leaves_stop_strings_as_they_were() -> None:
    rng = random.Random(7)
    for _ in range(300):
        stop, text, _ = random_case(rng, "ab<c>", 3, 3, 0, 30, 8)
        text = text.replace("<c>", "")
        chunks = [text[i : i + 3] for i in range(0, len(text), 3)]
        emitted, matcher = stream(chunks, stop, calls_start=_calls_at_marker)
        assert (matcher.text, matcher.stop_str) == reference_final_text(text, stop, False)
        assert "".join(emitted) == matcher.text
