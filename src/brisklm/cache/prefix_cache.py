"""Prefix caching over the contiguous KV cache: a finished request's keys and values stay in its
slot, and a new request whose prompt starts with the same tokens takes that slot and computes
only the rest (a chat's system prompt and tool definitions, a few-shot preamble)."""

from __future__ import annotations

from collections.abc import Sequence

# A reuse shorter than this does not take a slot holding another prefix while an empty one is free.
MIN_REUSE = 16


def common_prefix_length(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens the two sequences share."""
    length = min(len(cached), len(prompt))
    for index in range(length):
        if cached[index] != prompt[index]:
            return index
    return length


class PrefixCache:
    """The token ids whose keys and values each free slot still holds, and which slot a new
    request should take.

    A request takes the free slot sharing the longest prefix with its prompt, and computes from
    there on (at least its last prompt token: its logits give the first output). Where that slot
    holds more than the shared prefix (another continuation: a chat's next turn would reuse it)
    and an empty slot is free, the prefix is copied there instead and both stay. Without a reuse
    of ``MIN_REUSE`` tokens a request takes an empty slot, else the slot retained longest ago.

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
        self._clock = 0

    def retain(self, slot: int, token_ids: Sequence[int]) -> None:
        """A finished request left ``token_ids`` (its leading tokens' keys and values) in ``slot``."""
        if not token_ids:
            self.forget(slot)
            return
        self._clock += 1
        self._tokens[slot] = list(token_ids)
        self._retained_at[slot] = self._clock

    def forget(self, slot: int) -> None:
        """The slot holds nothing reusable."""
        self._tokens.pop(slot, None)
        self._retained_at.pop(slot, None)

    def cached_tokens(self, slot: int) -> list[int]:
        """The tokens retained in ``slot`` (empty if none)."""
        return list(self._tokens.get(slot, ()))

    def choose(
        self, prompt: Sequence[int], free_slots: Sequence[int]
    ) -> tuple[int, int, int | None]:
        """(the slot a request with ``prompt`` takes, how many of its tokens it reuses, the slot
        to copy those tokens' keys and values from first, or None: they are in place)."""
        if not free_slots:
            raise ValueError("no free slot to choose from")
        best_slot, best, best_common = -1, 0, 0
        for slot in free_slots:
            cached = self._tokens.get(slot)
            if cached is None or not prompt or cached[0] != prompt[0]:
                continue
            common = common_prefix_length(cached, prompt)
            reuse = min(common, len(prompt) - 1) // self.granularity * self.granularity
            if reuse > best or (reuse == best and reuse and self._older(slot, best_slot)):
                best_slot, best, best_common = slot, reuse, common
        empty = [slot for slot in free_slots if slot not in self._tokens]
        if best >= MIN_REUSE and empty and len(self._tokens[best_slot]) > best_common:
            return min(empty), best, best_slot
        if best >= MIN_REUSE or (best and not empty):
            self.forget(best_slot)
            return best_slot, best, None
        if empty:
            return min(empty), 0, None
        oldest = min(free_slots, key=lambda slot: self._retained_at[slot])
        self.forget(oldest)
        return oldest, 0, None

    def _older(self, slot: int, other: int) -> bool:
        return self._retained_at[slot] < self._retained_at.get(other, self._clock + 1)
