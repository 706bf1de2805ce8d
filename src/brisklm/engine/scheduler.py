"""Decides what the next forward pass runs: every decoding request's next token, plus prompt chunks."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from brisklm.cache.prefix_cache import MIN_REUSE, PrefixCache, common_prefix_length
from brisklm.cache.slots import SlotAllocator
from brisklm.engine.request import Request, RequestStatus


@dataclass
class ScheduledBatch:
    """Requests for one forward pass, in slot order.

    ``prefill_lens[i]`` is how many prompt tokens request i feeds (the next chunk of its prompt),
    0 for a request past its prompt, which decodes.
    """

    requests: list[Request]
    prefill_lens: list[int]

    @property
    def has_prefill(self) -> bool:
        return any(self.prefill_lens)

    def apart(self) -> list[ScheduledBatch]:
        """The pass split into passes that can fail on their own: the decoding requests together,
        then each prompt's chunk alone (a prompt too large for memory fails only itself)."""
        decoding = [r for r, n in zip(self.requests, self.prefill_lens) if not n]
        parts = [ScheduledBatch(decoding, [0] * len(decoding))] if decoding else []
        parts += [ScheduledBatch([r], [n]) for r, n in zip(self.requests, self.prefill_lens) if n]
        return parts


class Scheduler:
    """Admits waiting requests into free cache slots and builds each pass from the running ones.

    Prompts enter the cache in chunks of at most ``prefill_chunk_size`` tokens, cut at multiples of
    it from the prompt's start (so where a prompt is cut does not depend on what else is running),
    one chunk per request per pass. A pass carries every decoding request's next token together
    with chunks, first admitted first, up to ``max_prefill_tokens`` prompt tokens: a chunk that
    does not fit is passed over for later ones that do, and the first always runs. A long prompt
    therefore delays the requests decoding beside it by one chunk's compute per token, not by its
    whole prefill. Rows of different lengths in one pass are packed, not padded (see
    ``AttentionMetadata.split_single_token_rows`` for attention).

    With a ``prefix_cache``, a request takes the free slot whose retained tokens share the longest
    prefix with its prompt and starts past them; ``claim_slot(slot, length, source, prompt)`` is
    called then, to keep the slot's first ``length`` positions (copied from slot ``source`` first
    unless it is None) and clear the rest. A running request's slot is a source too:
    ``copyable(request)`` says how many of its leading positions a copy may take (its prompt's
    keys as computed so far, where a request computing them would compute them alike).

    Requests that share a prefix and arrive together compute it once. Where every pass computes
    each token alike (the prefix cache's granularity 1: the native pass), a waiting request that
    shares at least ``MIN_REUSE`` more tokens with a running request's prompt than it could reuse
    now waits until that request has computed them, then copies them (n samples of one prompt, a
    batch of calls with one system prompt and tools). A waiting request keeps its place: the
    requests behind it take only the slots left over.

    ``max_running``: at most this many requests run (and wait for a prefix) at once; with more
    slots than that, the others only keep finished requests' prefixes (``prefix_cache_slots``).
    """

    def __init__(
        self,
        num_slots: int,
        max_prefill_tokens: int,
        prefill_chunk_size: int,
        prefix_cache: PrefixCache | None = None,
        claim_slot: Callable[[int, int, int | None, list[int]], None] | None = None,
        copyable: Callable[[Request], int] | None = None,
        max_running: int | None = None,
    ) -> None:
        if len({prefix_cache is None, claim_slot is None, copyable is None}) > 1:
            raise ValueError(
                "a prefix cache needs claim_slot and copyable, and they a prefix cache"
            )
        self.prefix_cache = prefix_cache
        self._claim_slot = claim_slot
        self._copyable = copyable
        # Waiting requests held for a running one's prefix -> (that request, tokens awaited).
        self._awaited: dict[Request, tuple[Request, int]] = {}
        self.slots = SlotAllocator(num_slots)
        # At most this many requests run; the slots past it only keep prefixes (None: a request
        # in every slot).
        self.max_running = num_slots if max_running is None else max_running
        if not 1 <= self.max_running <= num_slots:
            raise ValueError(f"max_running must be in [1, {num_slots}], got {max_running}")
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_chunk_size = prefill_chunk_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Running requests still feeding their prompt, first admitted first.
        self.prefilling: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        admitted = False
        held: list[Request] = []  # each keeps a slot for itself
        while (
            self.waiting
            and self.slots.num_free > len(held)
            and len(self.running) + len(held) < self.max_running
        ):
            request = self.waiting.popleft()
            if self._awaits_prefix(request):
                held.append(request)
                continue
            self._admit(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.prefilling.append(request)
            admitted = True
        self.waiting.extendleft(reversed(held))
        if admitted:
            self.running.sort(key=lambda r: r.slot if r.slot is not None else -1)
        if not self.running:
            return None
        self.prefilling = [r for r in self.prefilling if r.is_prefilling]
        chunks: dict[int, int] = {}
        budget = self.max_prefill_tokens
        for request in self.prefilling:
            size = request.next_prompt_chunk(self.prefill_chunk_size)
            if chunks and size > budget:
                continue  # a later, shorter chunk may still fit
            chunks[id(request)] = size
            budget -= size
        requests = [r for r in self.running if id(r) in chunks or not r.is_prefilling]
        return ScheduledBatch(requests, [chunks.get(id(r), 0) for r in requests])

    def _copy_sources(self) -> list[tuple[int, list[int]]]:
        """(slot, the tokens a copy may take from it) of each running request."""
        assert self._copyable is not None
        sources: list[tuple[int, list[int]]] = []
        for request in self.running:
            if request.slot is not None and (length := self._copyable(request)):
                sources.append((request.slot, request.prompt_token_ids[:length]))
        return sources

    def _awaits_prefix(self, request: Request) -> bool:
        """Whether ``request`` waits for a running request still computing a prefix it shares
        (see the class)."""
        if (
            self.prefix_cache is None
            or self.prefix_cache.granularity != 1
            or request.params.prompt_logprobs is not None
        ):
            return False
        awaited = self._awaited.pop(request, None)
        if awaited is not None and awaited[0].status is RequestStatus.RUNNING:
            leader, length = awaited
            if leader.is_prefilling and leader.num_cached < length:
                self._awaited[request] = awaited
                return True
            return False  # computed: the admission copies it
        prompt = request.prompt_token_ids
        leader, length = None, 0
        for other in self.prefilling:
            if other.status is not RequestStatus.RUNNING or not other.is_prefilling:
                continue
            if other.prompt_token_ids[:1] != prompt[:1]:
                continue
            shared = common_prefix_length(other.prompt_token_ids, prompt)
            reuse = self.prefix_cache.reusable(shared, prompt)
            if reuse > length and other.num_cached < reuse:
                leader, length = other, reuse
        if leader is None or length < MIN_REUSE:
            return False
        now = self.prefix_cache.best_reuse(prompt, self.slots.free_slots(), self._copy_sources())
        if length - now < MIN_REUSE:
            return False
        self._awaited[request] = (leader, length)
        return True

    def _admit(self, request: Request) -> None:
        if self.prefix_cache is None or self._claim_slot is None:
            request.slot = self.slots.allocate()
            return
        # A request with prompt logprobs computes its whole prompt (a reused prefix has no
        # logits): it takes a slot as a prompt sharing nothing would.
        wanted = [] if request.params.prompt_logprobs is not None else request.prompt_token_ids
        slot, reused, source = self.prefix_cache.choose(
            wanted, self.slots.free_slots(), self._copy_sources()
        )
        self.slots.take(slot)
        self._claim_slot(slot, reused, source, request.prompt_token_ids)
        request.slot = slot
        request.num_cached = request.num_cached_prompt_tokens = reused

    def finish(self, request: Request) -> None:
        """Release a finished or aborted request's slot (whether it was waiting or running)."""
        if request in self.running:
            self.running.remove(request)
            if request in self.prefilling:
                self.prefilling.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
            self._awaited.pop(request, None)
        if request.slot is not None:
            self.slots.free(request.slot)
            request.slot = None

    def find(self, request_id: str) -> Request | None:
        for request in (*self.running, *self.waiting):
            if request.request_id == request_id:
                return request
        return None
