"""Constrained decoding in the engine: grammars compiled per request, masks computed alongside the
forward pass and applied to the logits, forced tokens fed without sampling."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from brisklm.constrained import (
    GrammarCompiler,
    GrammarMatcher,
    allocate_token_bitmask,
    apply_token_bitmask_,
    fill_bitmasks,
)
from brisklm.constrained.compiler import DEFAULT_GRAMMAR_CACHE_SIZE
from brisklm.engine.request import Request
from brisklm.kernels.omp import available_cpus
from brisklm.sampling import SamplingParams
from brisklm.tokenizer import Tokenizer


class StructuredOutputs:
    """Owns the grammar compiler (one per tokenizer, with its cache) and the per-step token bitmask."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_batch_size: int,
        usable_tokens: int | None = None,
        cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE,
        device: torch.device | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.device = device or torch.device("cpu")  # where the model's passes run
        self.usable_tokens = usable_tokens  # the ids the model has (GrammarCompiler)
        self.cache_size = cache_size  # compiled grammars kept (GrammarCompiler.max_cache_size)
        self.max_batch_size = max_batch_size
        self._compiler: GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._bitmask: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def compiler(self) -> GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(
                    self.tokenizer,
                    max_cache_size=self.cache_size,
                    usable_tokens=self.usable_tokens,
                )
            return self._compiler

    def matcher_for(self, params: SamplingParams) -> GrammarMatcher | None:
        """A fresh matcher for the request's constraint (compiled once per constraint and cached).

        Raises ConstraintError (a ValueError) for a schema or grammar that cannot be enforced, so
        the caller hears of it before the request is queued.
        """
        if params.constraint is None:
            return None
        return self.compiler.compile(params.constraint).matcher()

    def forget(self, constraint: Any) -> None:
        """Drop a constraint's compiled grammar from the cache (see ``GrammarCompiler.forget``)."""
        if constraint is not None and self._compiler is not None:
            self._compiler.forget(constraint)

    def start_masks(
        self, requests: Sequence[Request], proposals: Sequence[Sequence[int]] | None = None
    ) -> Future[tuple[torch.Tensor, list[int]]] | None:
        """Begin filling the bitmask rows of constrained requests in a worker thread, where
        ``overlaps`` says a CPU is free for it; else fill them now.

        llguidance releases the GIL while it computes masks, so the worker overlaps the model's
        forward pass; ``apply`` waits for it. With speculative ``proposals``, the logits have one
        row per position (``len(proposal) + 1`` per request) and each position gets the mask of
        the grammar state after the proposals before it; the matchers are rolled back afterwards.
        """
        if all(r.matcher is None for r in requests):
            return None
        counts = [1] * len(requests) if proposals is None else [len(p) + 1 for p in proposals]
        num_rows = sum(counts)
        if self._bitmask is None or self._bitmask.shape[0] < num_rows:
            self._bitmask = allocate_token_bitmask(
                max(num_rows, self.max_batch_size), self.tokenizer.vocab_size
            )
        bitmask = self._bitmask
        offsets = [sum(counts[:b]) for b in range(len(counts))]
        constrained = [b for b, r in enumerate(requests) if r.matcher is not None]

        def fill() -> tuple[torch.Tensor, list[int]]:
            if proposals is None:
                rows = [offsets[b] for b in constrained]
                fill_bitmasks([requests[b].matcher for b in constrained], bitmask, rows)
                return bitmask, rows
            rows = []
            for b in constrained:
                matcher = requests[b].matcher
                accepted = 0
                for j in range(counts[b]):
                    matcher.fill_bitmask(bitmask, offsets[b] + j)
                    rows.append(offsets[b] + j)
                    if j < len(proposals[b]):
                        if not matcher.accept_token(proposals[b][j]):
                            break  # verification rejects here: later positions are never reached
                        accepted += 1
                # A matcher that failed (an llguidance limit, here or at a proposal) allows only
                # EOS from there, and llguidance cannot roll it back: left as it is, it fails its
                # own request when the verified tokens reach it (``update_request``), not the batch.
                if matcher.error is None:
                    matcher.rollback(accepted)
            return bitmask, rows

        if self.overlaps():
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brisklm-grammar")
            try:
                return self._pool.submit(fill)
            except RuntimeError:
                # Once the main thread has ended, Python's exit hook refuses new work to every
                # thread pool ("cannot schedule new futures after interpreter shutdown"), while
                # non-daemon threads may still make requests: their masks are filled here instead.
                pass
        done: Future[tuple[torch.Tensor, list[int]]] = Future()
        done.set_result(fill())
        return done

    def overlaps(self) -> bool:
        """Whether a CPU is free for the masks while a pass runs: the pass runs on a GPU, or on
        fewer threads than this process's CPUs. Where the pass's threads take every CPU, a
        worker took a core from them and they waited for it at their barriers: on two cores the
        bundled model's constrained step took 0.43-0.46 ms with the worker and 0.40 ms filling
        the masks first (one request; 1-4% at four; docs/benchmarks.md)."""
        return self.device.type != "cpu" or torch.get_num_threads() < available_cpus()

    @staticmethod
    def apply(pending: Future[tuple[torch.Tensor, list[int]]] | None, logits: torch.Tensor) -> None:
        """Set the logits of tokens the grammars forbid to -inf (only constrained rows are touched)."""
        if pending is None:
            return
        bitmask, rows = pending.result()
        if rows == list(range(logits.shape[0])):
            # Every row constrained: in place, without gathering the rows out and back (at a
            # 128k vocabulary that halved the cost, 0.3 -> 0.15 ms a row).
            apply_token_bitmask_(logits, bitmask[: logits.shape[0]])
            return
        index = torch.tensor(rows, dtype=torch.int64)
        apply_token_bitmask_(logits, bitmask[: logits.shape[0]], index)

    @staticmethod
    def settle(pending: Future[tuple[torch.Tensor, list[int]]] | None) -> None:
        """Wait for a mask job whose pass failed before ``apply``: its worker still advances and
        rolls back the requests' matchers, which nothing else may touch until it is done (the
        engine reruns a failed pass's parts at once). The job's own outcome is not wanted."""
        if pending is not None:
            wait([pending])

    @staticmethod
    def forced_tokens(request: Request) -> list[int]:
        """Tokens the grammar allows no alternative to, to take without sampling (a request with
        logprobs takes them in the next pass, see ``LLMEngine.defer_forced``)."""
        if request.matcher is None:
            return []
        return request.matcher.compute_ff_tokens()

    @staticmethod
    def forced_next(request: Request) -> int | None:
        """The token a request's grammar forces at a sampling step, to take without sampling;
        None when the next token is free. Forced tokens never take a random draw, so a seeded
        request's tokens do not depend on its first token being forced (sampling it under the
        mask drew, and could pick a shorter token than the forced one), nor on whether it
        reports logprobs where a dynamic NTK rotary cuts a forced run short (its rest is taken
        here, one a step, with or without logprobs). A thinking budget's closing tag
        (``Request.thinking``) comes first, taken so one a step."""
        forced = request.thinking_forced_token
        if forced is not None:
            return forced
        if request.matcher is None:
            return None
        forced = request.matcher.compute_ff_tokens()
        return forced[0] if forced else None

    def close(self) -> None:
        """Stop the mask worker thread (a later request starts a new one)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
