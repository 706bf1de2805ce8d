"""A progress bar over a batch of requests (``generate(..., show_progress=True)``): the
completions finished (a prompt's ``SamplingParams.n`` each), and the output tokens a second so far."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from brisklm.checks import check_bool


class BatchProgress:
    """tqdm's bar on stderr for ``total`` requests, or nothing at all unless ``show`` (no tqdm
    object: even a disabled one can start tqdm's monitor thread)."""

    def __init__(self, total: int, show: bool) -> None:
        check_bool("show_progress", show)
        self._bar: Any = None
        if show:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc="Generating", unit="completion", dynamic_ncols=True)
        self._tokens = 0
        self._start = time.perf_counter()

    def finished(self, request: Any) -> None:
        """``request`` (a Request) has finished: one more completion, its output tokens counted."""
        if self._bar is None:
            return
        self._tokens += len(request.output_token_ids)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._bar.set_postfix_str(f"{self._tokens / elapsed:,.1f} output tokens/s", refresh=False)
        self._bar.update(1)

    def __enter__(self) -> BatchProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.close()
