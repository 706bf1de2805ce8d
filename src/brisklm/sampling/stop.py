"""Stop strings: find them in growing output text and hold back text that may become one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    """Where a stop string occurs in the text: ``text[start:end] == stop_str``."""

    start: int
    end: int
    stop_str: str


def find_stop_string(
    text: str,
    stop: Sequence[str],
    num_new_chars: int | None = None,
    min_end: int = 0,
    max_end: int | None = None,
) -> StopMatch | None:
    """The first stop string to complete in ``text``, or None.

    ``num_new_chars`` says how many characters at the end of ``text`` arrived since the last call,
    which (as before them there was no match) means a new match must end inside them: only the
    tail ``len(stop_str) - 1`` characters before them is searched. None searches all of ``text``.

    "First" is the match that ends earliest, ties going to the one that starts earliest: that is
    the match a character-by-character stream would hit first, so the result does not depend on
    how the text was split into chunks. Matches that end at or before ``min_end`` do not count,
    nor (``max_end`` given) those that end after ``max_end``.
    """
    num_old_chars = 0 if num_new_chars is None else max(0, len(text) - num_new_chars)
    best: StopMatch | None = None
    for stop_str in stop:
        start = text.find(
            stop_str,
            max(0, num_old_chars - len(stop_str) + 1, min_end - len(stop_str) + 1),
            len(text) if max_end is None else max_end,
        )
        if start < 0:
            continue
        end = start + len(stop_str)
        if best is None or (end, start) < (best.end, best.start):
            best = StopMatch(start, end, stop_str)
    return best


def hold_back_length(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of ``text`` must not be streamed yet: the longest suffix that
    is a proper prefix of some stop string (and so may still turn into one)."""
    longest = 0
    for stop_str in stop:
        # Only suffixes longer than the best so far can improve it.
        for length in range(min(len(stop_str) - 1, len(text)), longest, -1):
            if text.endswith(stop_str[:length]):
                longest = length
                break
    return longest


class StopStringMatcher:
    """Per-request stop-string state for a stream of text deltas.

    Feed each new piece of detokenized text to :meth:`append`; it returns the text that is safe to
    emit now. Text that might be the start of a stop string is withheld until it is either
    confirmed harmless or turns out to be one. Once a stop string completes, :attr:`stopped` is
    True, :attr:`text` is the final output (the stop string excluded, or included when
    ``include_stop_str_in_output``), and everything emitted so far is a prefix of it. When the
    request ends for another reason (eos, max_tokens), :meth:`flush` releases the withheld text.

    ``calls_start`` (a chat reply with tools offered: ``ReplyCalls.calls_start()``) finds where
    the text's first tool call begins, given the text and how much of it was searched before. Stop
    strings apply only to the text before that point, as OpenAI's stop sequences never cut a tool
    call: a match must end there, and once a call has begun no text is withheld.
    """

    def __init__(
        self,
        stop: Sequence[str],
        include_stop_str_in_output: bool = False,
        calls_start: Callable[[str, int], int] | None = None,
    ) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.stop = tuple(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.text = ""
        self.stop_match: StopMatch | None = None
        self._num_emitted = 0
        self._final_chars = frozenset(s[-1] for s in self.stop)
        self._min_end = 0  # matches ending at or before this offset do not count
        self._calls_start = calls_start if self.stop else None
        self._max_end: int | None = None  # where the first tool call begins, once it has

    @property
    def stopped(self) -> bool:
        """True once a stop string has completed."""
        return self.stop_match is not None

    @property
    def stop_str(self) -> str | None:
        """The stop string that ended the request, if any."""
        return None if self.stop_match is None else self.stop_match.stop_str

    def append(self, new_text: str, can_stop: bool = True) -> str:
        """Add ``new_text`` to the output; return the part of the output now safe to stream.

        ``can_stop`` False (a request short of its ``min_tokens``) lets a stop string completed by
        ``new_text`` pass as ordinary text; text that may still become one stays withheld, since
        a stop string that completes once stopping is allowed counts even if it began before.
        """
        if self.stopped:
            raise RuntimeError("append() after a stop string matched: the request is finished")
        self.text += new_text
        if not self.stop:
            return self._emit_up_to(len(self.text))
        self._max_end = self._calls_begin(self.text, len(self.text) - len(new_text))
        match = (
            find_stop_string(self.text, self.stop, len(new_text), self._min_end, self._max_end)
            if can_stop
            else None
        )
        if match is not None:
            self.stop_match = match
            self.text = self.text[: match.end if self.include_stop_str_in_output else match.start]
            return self._emit_up_to(len(self.text))
        # With the stop string included in the output any text is final once seen: a later match
        # ends after it, so nothing needs holding back; nor once a tool call has begun, as no
        # match may end after its start.
        final = self.include_stop_str_in_output or self._max_end is not None
        held = 0 if final else hold_back_length(self.text, self.stop)
        return self._emit_up_to(len(self.text) - held)

    def may_end_with(self, char: str) -> bool:
        """Whether some stop string ends with the character ``char``."""
        return char in self._final_chars

    def would_stop(self, new_text: str) -> bool:
        """Whether appending ``new_text`` would complete a stop string (stopping allowed)."""
        text = self.text + new_text
        max_end = self._calls_begin(text, len(self.text))
        return find_stop_string(text, self.stop, len(new_text), self._min_end, max_end) is not None

    def _calls_begin(self, text: str, searched: int) -> int | None:
        """Where the first tool call begins in ``text`` (of which ``searched`` characters were
        searched before), or None: no call yet, or no ``calls_start``."""
        if self._max_end is not None or self._calls_start is None:
            return self._max_end
        start = self._calls_start(text, searched)
        return None if start < 0 else start

    def no_stop_ending_before(self, end: int) -> None:
        """Let no stop string count that ends at or before character ``end`` of the text (text a
        request produced short of ``min_tokens`` that reaches the matcher later)."""
        self._min_end = max(self._min_end, end)

    def flush(self) -> str:
        """Release whatever is withheld: call when the request finishes without a stop string."""
        return self._emit_up_to(len(self.text))

    def _emit_up_to(self, end: int) -> str:
        if end <= self._num_emitted:
            return ""
        out = self.text[self._num_emitted : end]
        self._num_emitted = end
        return out
