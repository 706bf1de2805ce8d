"""Watch the forward passes a ModelRunner runs, through either of its entry points."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def spy_on_passes(runner: Any, record: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``record(batch)`` before each pass ``runner`` runs, whether through ``forward`` or
    ``forward_greedy`` (greedy rows on raw logits); returns a function that undoes it."""
    forward, forward_greedy = runner.forward, runner.forward_greedy

    def watched(batch):
        record(batch)
        return forward(batch)

    def watched_greedy(batch, columns):
        record(batch)
        return forward_greedy(batch, columns)

    runner.forward, runner.forward_greedy = watched, watched_greedy

    def undo() -> None:
        runner.forward, runner.forward_greedy = forward, forward_greedy

    return undo
