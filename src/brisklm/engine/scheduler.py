"""Decides what the next forward pass runs: a prefill of newly admitted requests or a decode step."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from brisklm.cache.slots import SlotAllocator
from brisklm.engine.request import Request, RequestStatus


@dataclass
class ScheduledBatch:
    """Requests for one step. ``is_prefill``: their prompts enter the cache; else each decodes one token."""

    requests: list[Request]
    is_prefill: bool


class Scheduler:
    """Admits waiting requests into free cache slots; otherwise steps every running request.

    Prefill and decode run as separate passes: padding a decode row to a prompt's length would
    waste T times its compute. New requests are admitted as soon as a slot frees up (continuous
    batching), bounded by ``max_prefill_tokens`` per pass.
    """

    def __init__(self, num_slots: int, max_prefill_tokens: int) -> None:
        self.slots = SlotAllocator(num_slots)
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        admitted: list[Request] = []
        num_tokens = 0
        while self.waiting and self.slots.num_free:
            request = self.waiting[0]
            if admitted and num_tokens + request.num_prompt_tokens > self.max_prefill_tokens:
                break
            self.waiting.popleft()
            request.slot = self.slots.allocate()
            request.status = RequestStatus.RUNNING
            admitted.append(request)
            num_tokens += request.num_prompt_tokens
        if admitted:
            self.running.extend(admitted)
            self.running.sort(key=lambda r: r.slot if r.slot is not None else -1)
            return ScheduledBatch(admitted, is_prefill=True)
        if self.running:
            return ScheduledBatch(list(self.running), is_prefill=False)
        return None

    def finish(self, request: Request) -> None:
        """Release a finished or aborted request's slot (whether it was waiting or running)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if request.slot is not None:
            self.slots.free(request.slot)
            request.slot = None

    def find(self, request_id: str) -> Request | None:
        for request in (*self.running, *self.waiting):
            if request.request_id == request_id:
                return request
        return None
