"""Builds the llguidance tokenizer (token trie + tokenize function) for a brisklm tokenizer."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from llguidance import LLTokenizer

logger = logging.getLogger(__name__)

# Text before which a dummy-prefix tokenizer (sentencepiece `add_dummy_prefix`) adds its space.
_SENTINEL = "\n"


class TokenizerLike(Protocol):
    """What the bridge needs from `brisklm.tokenizer.Tokenizer` (duck-typed)."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    special_token_ids: frozenset[int]

    def token_bytes(self) -> list[bytes]: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...


class _ExactTokenize:
    """llguidance's TokenizerWrapper protocol over `encode`, returning tokens for exactly the text.

    llguidance tokenizes forced text mid-sequence (fast-forward tokens), so a tokenizer that adds a
    dummy-prefix space at the start of `encode` would inject a space. Such output is detected by
    comparing bytes, and the text is then encoded after a sentinel whose tokens are dropped; if
    that does not reproduce the bytes either, a greedy longest-match over the vocabulary is used.
    """

    is_tokenizer_wrapper = True  # the attribute LLTokenizer checks

    def __init__(
        self,
        tokenizer: TokenizerLike,
        token_bytes: Sequence[bytes],
        eos_token_ids: Sequence[int],
        usable_tokens: int,
    ) -> None:
        vocab_size = tokenizer.vocab_size
        special = set(tokenizer.special_token_ids)
        usable = min(usable_tokens, len(token_bytes), vocab_size)
        tokens = list(token_bytes[:usable]) + [b""] * (vocab_size - usable)
        special.update(i for i, b in enumerate(tokens) if not b)  # empty ids can never be text
        self.tokens = tokens
        self.eos_token_id = eos_token_ids[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(special)
        self._encode = tokenizer.encode
        self._special = frozenset(special)
        self._ids_of_bytes = {b: i for i, b in enumerate(tokens) if i not in special}
        self._max_token_len = max((len(b) for b in self._ids_of_bytes), default=1)
        self._sentinel_ids = self._encode(_SENTINEL, add_special_tokens=False)

    def _bytes(self, ids: Sequence[int]) -> bytes | None:
        if any(not 0 <= i < len(self.tokens) for i in ids):
            return None
        return b"".join(self.tokens[i] for i in ids)

    def _greedy(self, data: bytes) -> list[int]:
        ids: list[int] = []
        pos = 0
        while pos < len(data):
            for size in range(min(self._max_token_len, len(data) - pos), 0, -1):
                token = self._ids_of_bytes.get(data[pos : pos + size])
                if token is not None:
                    ids.append(token)
                    pos += size
                    break
            else:
                return ids  # a byte no token spells: it cannot be generated anyway
        return ids

    def _as_text(self, ids: Sequence[int]) -> list[int]:
        """`ids` with each special token `encode` recognised in the text spelled in plain tokens:
        text a grammar forces is text (`<|im_end|>` in a regex), and llguidance accepts no special
        token for it."""
        out: list[int] = []
        for i in ids:
            if i in self._special and 0 <= i < len(self.tokens):
                out.extend(self._greedy(self.tokens[i]))
            else:
                out.append(i)
        return out

    def __call__(self, text: str | bytes) -> list[int]:
        # Called from Rust, which cannot take a Python exception: never raise.
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        try:
            text = data.decode("utf-8")
            ids = self._as_text(self._encode(text, add_special_tokens=False))
            if self._bytes(ids) == data:
                return ids
            ids = self._as_text(self._encode(_SENTINEL + text, add_special_tokens=False))
            head = len(self._sentinel_ids)
            if ids[:head] == self._sentinel_ids and self._bytes(ids[head:]) == data:
                return ids[head:]
        except Exception:  # a failing tokenizer falls back to greedy
            logger.debug(
                "tokenizer encode failed for %r; using greedy tokenization", data, exc_info=True
            )
        return self._greedy(data)


def usable_eos_token_ids(tokenizer: TokenizerLike, usable_tokens: int | None) -> tuple[int, ...]:
    """The tokenizer's EOS ids the model can emit (below `usable_tokens`; None: all of them)."""
    limit = tokenizer.vocab_size if usable_tokens is None else usable_tokens
    return tuple(t for t in tokenizer.eos_token_ids if t < limit)


def llg_tokenizer_for(tokenizer: TokenizerLike, usable_tokens: int | None = None) -> LLTokenizer:
    """The llguidance tokenizer for `tokenizer`; expensive (vocabulary-sized), so callers cache it.

    The token trie is built from `token_bytes()`, `special_token_ids` are special (no text can
    produce them), and forced text is tokenized with `encode` (see `_ExactTokenize`). All of
    `eos_token_ids` end a constrained output.

    `usable_tokens`: how many of the ids a model can read and emit, when its embedding is smaller
    than the tokenizer (added tokens without a resize): the ids past it spell no text here, so a
    grammar neither allows nor forces them (a forced id would index past the embedding).

    llguidance can also read a tokenizer.json itself, but HF `tokenizers` reads a special token's
    text as that token (`encode("<|im_end|>")` gives its id; no setting saved in the file turns
    that off), so a grammar that forces such text would fail its request: the first thing it forced
    was a special token where text was required. Tokenizing in Python costs ~7 us a call against
    ~3 us in Rust, once per forced run of text.
    """
    eos_token_ids = usable_eos_token_ids(tokenizer, usable_tokens)
    if not tokenizer.eos_token_ids:
        raise ValueError("constrained decoding needs a tokenizer with at least one EOS token id")
    if not eos_token_ids:
        raise ValueError(
            f"constrained decoding needs an EOS token the model can emit: the tokenizer's "
            f"{list(tokenizer.eos_token_ids)} are past the model's vocabulary of "
            f"{tokenizer.vocab_size if usable_tokens is None else usable_tokens}"
        )
    wrapper = _ExactTokenize(
        tokenizer,
        tokenizer.token_bytes(),
        eos_token_ids,
        tokenizer.vocab_size if usable_tokens is None else usable_tokens,
    )
    return LLTokenizer(wrapper, eos_token=list(eos_token_ids))
