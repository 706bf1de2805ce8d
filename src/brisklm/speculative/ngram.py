"""N-gram prompt lookup: propose the tokens that followed the latest earlier copy of the context's tail."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from brisklm.speculative.draft_length import DEFAULT_NUM_SPECULATIVE_TOKENS
from brisklm.speculative.proposer import DraftRow, Proposal


class NgramProposer:
    """Prompt lookup decoding: no model, deterministic proposals (``Proposal.probs`` is None).

    For n from ``max_ngram`` down to ``min_ngram``, the context's last n tokens are searched for
    earlier in the context; the longest n that occurs wins, and among its occurrences the most
    recent one. The proposal is what followed that occurrence, up to k tokens. When the occurrence
    is so recent that fewer than k tokens follow it (the text is repeating with a short period),
    the continuation wraps around that period, as an LZ77 copy would: ``a b a b`` proposes
    ``a b a b ...`` rather than stopping after two tokens.

    Lookups are stateless; ``propose`` only keeps each slot's prompt as an array (keyed on the
    prompt list object itself, so a new request is never confused with an old one) to avoid
    converting thousands of prompt tokens every step. ``rollback`` does nothing; ``release``
    drops that array.
    """

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_speculative_tokens = num_speculative_tokens
        # slot -> (the prompt sequence object, its tokens as an array)
        self._prompts: dict[int, tuple[Sequence[int], np.ndarray]] = {}

    def lookup(self, token_ids: Sequence[int] | np.ndarray, k: int | None = None) -> list[int]:
        """Up to ``k`` (default ``num_speculative_tokens``) proposed tokens for this context; [] if
        no n-gram of the allowed lengths recurs."""
        k = self.num_speculative_tokens if k is None else k
        if k <= 0:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        match = _latest_longest_match(tokens, self.max_ngram, self.min_ngram)
        if match is None:
            return []
        start = match + 1  # first token after the occurrence
        period = len(tokens) - start
        return tokens[start + np.arange(k) % period].tolist()

    def propose(self, rows: Sequence[DraftRow]) -> list[Proposal]:
        """:class:`Proposer` interface: one deterministic Proposal per row."""
        proposals = []
        for row in rows:
            k = min(row.max_draft_tokens, self.num_speculative_tokens)
            if k <= 0 or row.num_tokens < 2:
                proposals.append(Proposal([]))
                continue
            prompt = self._prompt_array(row.slot, row.prompt_token_ids)
            output = np.fromiter(
                row.output_token_ids, dtype=np.int64, count=len(row.output_token_ids)
            )
            proposals.append(Proposal(self.lookup(np.concatenate([prompt, output]), k)))
        return proposals

    def _prompt_array(self, slot: int, prompt: Sequence[int]) -> np.ndarray:
        cached = self._prompts.get(slot)
        if cached is not None and cached[0] is prompt and len(cached[1]) == len(prompt):
            return cached[1]
        array = np.fromiter(prompt, dtype=np.int64, count=len(prompt))
        self._prompts[slot] = (prompt, array)
        return array

    def rollback(self, slot: int, num_tokens: int) -> None:
        """Nothing to undo: lookups read only the context they are given."""

    def release(self, slot: int) -> None:
        """Forget the slot's cached prompt array."""
        self._prompts.pop(slot, None)


def _latest_longest_match(tokens: np.ndarray, max_ngram: int, min_ngram: int) -> int | None:
    """End index e of the latest earlier occurrence of the longest matching suffix n-gram, or None.

    An occurrence ending at e (e <= L - 2, so at least one token follows it) matches n tokens when
    ``tokens[e - m] == tokens[L - 1 - m]`` for m < n. The candidates for n + 1 are the candidates
    for n filtered by one more comparison, so after one vectorised pass over the context the work
    is proportional to the number of candidates, not to L times max_ngram.
    """
    length = len(tokens)
    if length < 2:
        return None
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])  # n = 1 candidates, ascending
    best = None
    for n in range(1, max_ngram + 1):
        if n > 1:
            ends = ends[ends >= n - 1]  # an occurrence cannot start before the context does
            ends = ends[tokens[ends - (n - 1)] == tokens[length - n]]
        if not len(ends):
            break
        if n >= min_ngram:
            best = int(ends[-1])
    return best
