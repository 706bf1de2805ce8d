"""Counters of an engine's finished requests (``brisklm serve``'s ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

from brisklm.outputs import FinishReason


@dataclass
class EngineStats:
    """Totals over the requests an engine has finished: updated by the engine thread when it
    releases a request (``LLMEngine.release``), read by any thread. The finish reasons are all
    keys from the start, so that a reader never sees the dict change size."""

    finished: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(get_args(FinishReason), 0)
    )
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, reused from the prefix cache
    generation_tokens: int = 0

    def record(self, request: Any) -> None:
        """``request`` (a Request) has finished, whatever the reason."""
        usage = request.usage
        self.finished[request.finish_reason or "abort"] += 1
        self.prompt_tokens += usage.prompt_tokens
        self.cached_prompt_tokens += usage.cached_prompt_tokens
        self.generation_tokens += usage.completion_tokens
