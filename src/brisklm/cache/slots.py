"""Slot allocation for the contiguous KV cache: one slot (a row of the cache) per running request."""

from __future__ import annotations

import heapq


class SlotAllocator:
    """Hands out the lowest free slot, so running requests tend to occupy a contiguous range."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots))
        heapq.heapify(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        return heapq.heappop(self._free)

    def free_slots(self) -> list[int]:
        return sorted(self._free)

    def take(self, slot: int) -> None:
        """Allocate a given free slot (one a PrefixCache chose)."""
        if slot not in self._free:
            raise ValueError(f"slot {slot} is not free")
        self._free.remove(slot)
        heapq.heapify(self._free)

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")
        heapq.heappush(self._free, slot)
