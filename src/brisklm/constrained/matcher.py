"""GrammarMatcher: per-request grammar state (accept, rollback, token bitmask) over llguidance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from brisklm.constrained.errors import first_paragraph

if TYPE_CHECKING:
    from llguidance import LLMatcher

    from brisklm.constrained.compiler import CompiledGrammar


def allocate_token_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """A CPU int32 bitmask (batch, ceil(vocab_size / 32)), all tokens allowed.

    `vocab_size` is the tokenizer's (`CompiledGrammar.vocab_size`), not the model's padded
    vocabulary: `apply_token_bitmask_` masks out logits beyond the bitmask. Pinned when CUDA is
    available so the copy to the GPU can be asynchronous.
    """
    if batch < 0 or vocab_size < 1:
        raise ValueError(f"need batch >= 0 and vocab_size >= 1, got {batch}, {vocab_size}")
    shape = (batch, (vocab_size + 31) // 32)
    return torch.full(shape, -1, dtype=torch.int32, pin_memory=torch.cuda.is_available())


def _check_bitmask(bitmask: torch.Tensor, width: int) -> None:
    if (
        bitmask.dtype != torch.int32
        or bitmask.dim() != 2
        or bitmask.device.type != "cpu"
        or not bitmask.is_contiguous()
    ):
        raise ValueError(
            "bitmask must be a contiguous CPU int32 tensor of shape (batch, words), got "
            f"{bitmask.dtype} {tuple(bitmask.shape)} on {bitmask.device}"
        )
    if bitmask.shape[1] != width:
        raise ValueError(
            f"bitmask has {bitmask.shape[1]} words per row but this tokenizer needs {width} "
            "(ceil(vocab_size / 32)); allocate it with allocate_token_bitmask"
        )


class GrammarMatcher:
    """Grammar state of one request: which tokens may come next, given those accepted so far.

    A rejected token leaves the state unchanged. EOS (any of the tokenizer's EOS ids) is accepted
    only where the output is complete, and terminates the matcher; `rollback` undoes accepted
    tokens, EOS included (speculative decoding). Not thread-safe: one request, one thread at a time.
    """

    def __init__(self, compiled: CompiledGrammar) -> None:
        self.compiled = compiled
        self._llm = compiled._prototype.deep_copy()
        self._eos_token_ids = frozenset(compiled.eos_token_ids)
        self._vocab_size = compiled.vocab_size
        self._num_tokens = 0  # accepted tokens, EOS included
        self._terminated = False
        # llguidance does not record an EOS consumed when it was already stopped (the grammar could
        # not continue), so rolling that EOS back must not roll back llguidance.
        self._eos_unrecorded = False
        # The accepted tokens, and a copy of llguidance's state after each EOS taken as content (a
        # grammar that names it), with the number of tokens then: once it has consumed such an
        # EOS, llguidance (1.9) rolls back to a state that refuses tokens it took before.
        self._tokens: list[int] = []
        self._after_content_eos: list[tuple[int, LLMatcher]] = []
        # A panic of a copy that probed a token (it poisons the state they share).
        self._probe_error: str | None = None

    @property
    def num_tokens(self) -> int:
        """Number of tokens accepted so far (EOS included)."""
        return self._num_tokens

    @property
    def error(self) -> str | None:
        """Why the matcher failed (an llguidance limit or internal error), or None."""
        message = self._llm.get_error() or self._probe_error
        return first_paragraph(message) if message else None

    @property
    def took_eos_as_content(self) -> bool:
        """Whether an EOS was accepted as content (a grammar that names it) among the tokens."""
        return bool(self._after_content_eos)

    def is_terminated(self) -> bool:
        """True once EOS has been accepted."""
        return self._terminated

    def is_accepting(self) -> bool:
        """True if the output so far is complete, so EOS would be accepted now."""
        return not self._llm.is_error() and self._llm.is_accepting()

    def is_stopped(self) -> bool:
        """True if no token but EOS can follow (grammar exhausted, terminated, or failed)."""
        return self._terminated or self._llm.is_stopped()

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token if the grammar allows it; False (state unchanged) otherwise."""
        token_id = int(token_id)  # numpy / torch scalars would miss the EOS set lookup
        if self._terminated or self._llm.is_error() or not 0 <= token_id < self._vocab_size:
            return False
        if token_id in self._eos_token_ids and self._llm.is_accepting():
            # The end. After an EOS taken as content llguidance (1.9) panics consuming the final
            # one (and the panic poisons the state every matcher of the grammar shares): nothing
            # follows the end, so it is recorded here only, as for an exhausted grammar.
            was_stopped = self._llm.is_stopped() or self.took_eos_as_content
            if not was_stopped and not self._llm.consume_token(token_id):
                return False
            self._terminated = True
            self._eos_unrecorded = was_stopped
            self._accepted(token_id)
            return True
        # Validate first: a failed consume would put llguidance into a permanent error state. An
        # EOS here is not the end: it is content only where the grammar names it (`<[2]>`).
        if self._count_valid(self._llm, [token_id]) != 1 or not self._llm.consume_token(token_id):
            return False
        self._accepted(token_id)
        if token_id in self._eos_token_ids:
            self._after_content_eos.append((self._num_tokens, self._llm.deep_copy()))
        return True

    def _accepted(self, token_id: int) -> None:
        self._tokens.append(token_id)
        self._num_tokens += 1

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Accept tokens in order up to the first rejected one; returns how many were accepted."""
        for n, token_id in enumerate(token_ids):
            if not self.accept_token(token_id):
                return n
        return len(token_ids)

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of `token_ids` would be accepted, without changing the state."""
        if self._terminated or self._llm.is_error():
            return 0
        ids = [int(t) for t in token_ids]
        for n, token_id in enumerate(ids):
            if not 0 <= token_id < self._vocab_size:
                ids = ids[:n]
                break
        return self._count_valid(self._llm, ids)

    def _count_valid(self, llm: LLMatcher, ids: list[int]) -> int:
        """How many leading ``ids`` ``llm`` would accept; ``llm`` is left as it was."""
        eos_at = next((k for k, t in enumerate(ids) if t in self._eos_token_ids), None)
        if eos_at is None:
            return llm.validate_tokens(ids) if ids else 0
        # Decide the EOS ourselves: llguidance refuses it where the grammar is already exhausted
        # (then it ends the output) and where the grammar names it as a token (then it is content).
        num_valid = llm.validate_tokens(ids[:eos_at]) if eos_at else 0
        if num_valid < eos_at:
            return num_valid
        probe = llm
        if eos_at:
            probe = llm.deep_copy()
            probe.consume_tokens(ids[:eos_at])
        if probe.is_accepting():
            return eos_at + 1
        if probe is llm:
            probe = llm.deep_copy()
        if not probe.consume_token(ids[eos_at]) or probe.is_error():
            error = probe.get_error() if probe.is_error() else ""
            if error.startswith("panic"):  # llguidance (1.9), after an EOS taken as content
                self._probe_error = self._probe_error or error
            return eos_at
        return eos_at + 1 + self._count_valid(probe, ids[eos_at + 1 :])

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (EOS included)."""
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"can roll back 0..{self._num_tokens} tokens, got {num_tokens}")
        if num_tokens == 0:
            return
        keep = self._num_tokens - num_tokens
        if self._after_content_eos:
            self._replay(keep)
            return
        del self._tokens[keep:]
        num_llg = num_tokens
        if self._terminated:
            self._terminated = False
            if self._eos_unrecorded:
                num_llg -= 1
                self._eos_unrecorded = False
        if num_llg and not self._llm.rollback(num_llg):
            raise RuntimeError(f"llguidance rollback failed: {self.error}")
        self._num_tokens -= num_tokens

    def _replay(self, keep: int) -> None:
        """Roll back to the first ``keep`` tokens without llguidance's rollback, which is wrong
        once an EOS was taken as content: from the state copied after the last such EOS among
        them (or the start), accept the tokens after it again."""
        while self._after_content_eos and self._after_content_eos[-1][0] > keep:
            self._after_content_eos.pop()
        start, state = self._after_content_eos[-1] if self._after_content_eos else (0, None)
        self._llm = (state if state is not None else self.compiled._prototype).deep_copy()
        replayed = self._tokens[start:keep]
        del self._tokens[start:]
        self._num_tokens, self._terminated, self._eos_unrecorded = start, False, False
        if self.accept_tokens(replayed) != len(replayed):
            raise RuntimeError(f"llguidance rollback failed: {self.error}")

    def reset(self) -> None:
        """Back to the start of the grammar."""
        self.rollback(self._num_tokens)

    def compute_ff_tokens(self) -> list[int]:
        """Tokens the grammar forces next (possibly none); accept them with `accept_tokens`."""
        if self._terminated or self._llm.is_error():
            return []
        return list(self._llm.compute_ff_tokens())

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the allowed next tokens into `bitmask[row]` (bit t%32 of word t//32 = token t).

        After EOS or a failure only EOS is allowed, so the request can end.
        """
        _check_bitmask(bitmask, self.compiled.bitmask_width)
        if not 0 <= row < bitmask.shape[0]:
            raise IndexError(f"row {row} out of range for a bitmask of {bitmask.shape[0]} rows")
        target = bitmask[row]
        self._llm.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * target.element_size())


def fill_bitmasks(
    matchers: Sequence[GrammarMatcher],
    bitmask: torch.Tensor,
    rows: Sequence[int] | None = None,
) -> None:
    """Fill `bitmask[rows[i]]` for `matchers[i]` in parallel, without holding the GIL.

    Run it in a worker thread to overlap mask computation with the model forward. `rows`
    defaults to 0..len(matchers)-1; all matchers must share one tokenizer (one compiler).
    """
    if not matchers:
        return
    rows = list(range(len(matchers))) if rows is None else [int(r) for r in rows]
    if len(rows) != len(matchers):
        raise ValueError(f"{len(matchers)} matchers but {len(rows)} rows")
    if len(set(rows)) != len(rows) or any(not 0 <= r < bitmask.shape[0] for r in rows):
        raise ValueError(f"rows must be distinct and in 0..{bitmask.shape[0] - 1}, got {rows}")
    width = matchers[0].compiled.bitmask_width
    _check_bitmask(bitmask, width)
    executor = matchers[0].compiled._executor
    if any(m.compiled._executor is not executor for m in matchers):
        raise ValueError("fill_bitmasks needs matchers compiled by one GrammarCompiler")
    pairs = [(m._llm, r) for m, r in zip(matchers, rows, strict=True)]
    executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), width * 4, bitmask.shape[0])
