"""Prefix caching over the contiguous KV cache: a finished request's keys and values stay in its
slot, and a new request whose prompt starts with the same tokens takes that slot and computes
only the rest (a chat's system prompt and tool definitions, a few-shot preamble)."""

from __future__ import annotations

from collections.abc import Sequence

# A reuse shorter than this does not take a slot holding another prefix while an empty one is free.
MIN_REUSE = 16


def common_prefix_length(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens the two sequences share: a bisection over slice comparisons,
    which run in C (a token-by-token loop took ~2 ms for 8 slots of 4k-token prompts)."""
    cached, prompt = list(cached), list(prompt)
    low, high = 0, min(len(cached), len(prompt))  # [0, low) matches; the first mismatch < high
    if cached[:high] == prompt[:high]:
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if cached[low:middle] == prompt[low:middle]:
            low = middle
        else:
            high = middle
    return low


class PrefixCache:
    """The token ids whose keys and values each free slot still holds, and which slot a new
    request should take.

    A request takes the free slot sharing the longest prefix with its prompt, and computes from
    there on (at least its last prompt token: its logits give the first output). Where that slot
    holds more than the shared prefix (another continuation: a chat's next turn would reuse it),
    the prefix is copied to an empty slot instead and both stay; with none empty, where the
    prompt parts from the slot's inside that request's prompt (another conversation sharing its
    start), to the slot retained longest ago, unless that is the one holding it. A prompt that
    shares the whole of that prompt (its conversation's next turn, which may part from the
    reply where a template renders it otherwise) takes the slot.
    Without a reuse of ``MIN_REUSE`` tokens a request takes an empty slot, else the slot retained
    longest ago.

    Slots of running requests are sources too (``choose``'s ``running``): their prompts' keys,
    computed so far, are copied into the new request's slot, so requests sharing a prefix that
    run together compute it once (n samples of one prompt, a batch sharing a system prompt).

    ``granularity``: reuses are cut to a multiple of it. Where a pass computes a token's keys,
    values and logits alike whatever else the pass holds (brisklm's native CPU pass), 1; else
    the prompt chunk size, so the rest of a prompt enters the cache in the very chunks it would
    without reuse, and the output stays the same to the bit.
    """

    def __init__(self, granularity: int = 1) -> None:
        if granularity < 1:
            raise ValueError(f"granularity must be >= 1, got {granularity}")
        self.granularity = granularity
        self._tokens: dict[int, list[int]] = {}
        self._retained_at: dict[int, int] = {}
        # How many of a slot's tokens were its request's prompt (the rest, its output).
        self._prompt_lengths: dict[int, int] = {}
        self._clock = 0

    def retain(self, slot: int, token_ids: Sequence[int], prompt_length: int | None = None) -> None:
        """A finished request left ``token_ids`` (its leading tokens' keys and values) in ``slot``,
        the first ``prompt_length`` of them its prompt (None: all)."""
        if not token_ids:
            self.forget(slot)
            return
        self._clock += 1
        self._tokens[slot] = list(token_ids)
        self._retained_at[slot] = self._clock
        whole = len(token_ids)
        self._prompt_lengths[slot] = whole if prompt_length is None else min(prompt_length, whole)

    def forget(self, slot: int) -> None:
        """The slot holds nothing reusable."""
        self._tokens.pop(slot, None)
        self._retained_at.pop(slot, None)
        self._prompt_lengths.pop(slot, None)

    def cached_tokens(self, slot: int) -> list[int]:
        """The tokens retained in ``slot`` (empty if none)."""
        return list(self._tokens.get(slot, ()))

    def choose(
        self,
        prompt: Sequence[int],
        free_slots: Sequence[int],
        running: Sequence[tuple[int, Sequence[int]]] = (),
    ) -> tuple[int, int, int | None]:
        """(the slot a request with ``prompt`` takes, how many of its tokens it reuses, the slot
        to copy those tokens' keys and values from first, or None: they are in place).

        ``running``: (slot, the tokens whose keys it holds for a copy) of each running request,
        its prompt as far as computed (a request admitted earlier in the same round: the prefix
        it reuses). A copy from there goes to an empty slot, else the one retained longest ago."""
        if not free_slots:
            raise ValueError("no free slot to choose from")
        best_slot, best, best_common, reuses = self._best_retained(prompt, free_slots)
        source, copied = self._best_running(prompt, running)
        empty = [slot for slot in free_slots if slot not in self._tokens]
        if copied > best and copied >= MIN_REUSE:
            destination = min(empty) if empty else self._oldest(free_slots)
            return self._claim(destination, copied, source)
        if best >= MIN_REUSE and len(self._tokens[best_slot]) > best_common:
            # The slot holds more than the prefix: copied to an empty slot, else, where the
            # prompt parts from the slot's inside that request's prompt (another conversation
            # sharing its start, not this one's next turn), to the slot retained longest ago
            # where that is another (the longer sequence stays).
            oldest = self._oldest(free_slots)
            elsewhere = best_common < self._prompt_lengths[best_slot] and oldest != best_slot
            if empty or elsewhere:
                return self._claim(min(empty) if empty else oldest, best, best_slot)
        if best >= MIN_REUSE:
            return self._claim(best_slot, best, None)
        if empty:
            return self._claim(min(empty), 0, None)
        # A few shared tokens (a chat template's opening) do not make a slot worth giving up
        # before the one retained longest ago, which keeps what it shares.
        oldest = self._oldest(free_slots)
        return self._claim(oldest, reuses.get(oldest, 0), None)

    def best_reuse(
        self,
        prompt: Sequence[int],
        free_slots: Sequence[int],
        running: Sequence[tuple[int, Sequence[int]]] = (),
    ) -> int:
        """How many of ``prompt``'s tokens ``choose`` would reuse from the best source it weighs
        (no change); 0 below ``MIN_REUSE``, which ``choose`` copies from nowhere."""
        retained = self._best_retained(prompt, free_slots)[1]
        best = max(retained, self._best_running(prompt, running)[1])
        return best if best >= MIN_REUSE else 0

    def reusable(self, common: int, prompt: Sequence[int]) -> int:
        """Of ``common`` leading tokens shared with a source, how many ``prompt`` may reuse: at
        least its last token is computed (its logits give the first output), in whole units of
        ``granularity``."""
        return min(common, len(prompt) - 1) // self.granularity * self.granularity

    def _best_retained(
        self, prompt: Sequence[int], free_slots: Sequence[int]
    ) -> tuple[int, int, int, dict[int, int]]:
        """(the free slot whose retained tokens ``prompt`` reuses most, the reuse, the tokens it
        shares, each slot's reuse); of equal reuses, the slot retained longest ago."""
        best_slot, best, best_common = -1, 0, 0
        reuses: dict[int, int] = {}
        for slot in free_slots:
            cached = self._tokens.get(slot)
            if cached is None or not prompt or cached[0] != prompt[0]:
                continue
            common = common_prefix_length(cached, prompt)
            reuse = reuses[slot] = self.reusable(common, prompt)
            if reuse > best or (reuse == best and reuse and self._older(slot, best_slot)):
                best_slot, best, best_common = slot, reuse, common
        return best_slot, best, best_common, reuses

    def _best_running(
        self, prompt: Sequence[int], running: Sequence[tuple[int, Sequence[int]]]
    ) -> tuple[int, int]:
        """(the running slot ``prompt`` may copy the most from, how many tokens)."""
        source, copied = -1, 0
        for slot, held in running:
            if not held or not prompt or held[0] != prompt[0]:
                continue
            reuse = self.reusable(common_prefix_length(held, prompt), prompt)
            if reuse > copied:
                source, copied = slot, reuse
        return source, copied

    def _oldest(self, free_slots: Sequence[int]) -> int:
        return min(free_slots, key=lambda slot: self._retained_at.get(slot, -1))

    def _claim(self, slot: int, reuse: int, source: int | None) -> tuple[int, int, int | None]:
        self.forget(slot)
        return slot, reuse, source

    def _older(self, slot: int, other: int) -> bool:
        return self._retained_at[slot] < self._retained_at.get(other, self._clock + 1)
