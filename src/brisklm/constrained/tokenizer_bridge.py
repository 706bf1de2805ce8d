"""Builds the llguidance tokenizer (token trie + tokenize function) for a brisklm tokenizer."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, Protocol

from llguidance import LLTokenizer

logger = logging.getLogger(__name__)

# llguidance marks special tokens with this leading byte so that no text can produce them.
_SPECIAL_MARKER = b"\xff"
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

    def __init__(self, tokenizer: TokenizerLike, token_bytes: Sequence[bytes]) -> None:
        vocab_size = tokenizer.vocab_size
        special = set(tokenizer.special_token_ids)
        tokens = list(token_bytes[:vocab_size]) + [b""] * (vocab_size - len(token_bytes))
        special.update(i for i, b in enumerate(tokens) if not b)  # empty ids can never be text
        self.tokens = tokens
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(special)
        self._encode = tokenizer.encode
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

    def __call__(self, text: str | bytes) -> list[int]:
        # Called from Rust, which cannot take a Python exception: never raise.
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        try:
            text = data.decode("utf-8")
            ids = self._encode(text, add_special_tokens=False)
            if self._bytes(ids) == data:
                return list(ids)
            ids = self._encode(_SENTINEL + text, add_special_tokens=False)
            head = len(self._sentinel_ids)
            if ids[:head] == self._sentinel_ids and self._bytes(ids[head:]) == data:
                return list(ids[head:])
        except Exception:  # a failing tokenizer falls back to greedy
            logger.debug(
                "tokenizer encode failed for %r; using greedy tokenization", data, exc_info=True
            )
        return self._greedy(data)


def _tokenizer_json_text(
    tokenizer: Any, tokenizer_json: str | os.PathLike[str] | None
) -> str | None:
    source = (
        tokenizer_json if tokenizer_json is not None else getattr(tokenizer, "tokenizer_json", None)
    )
    if source is None:
        return None
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return source
    with open(source, encoding="utf-8") as f:
        return f.read()


def _agrees(llg: LLTokenizer, tokenizer: TokenizerLike, token_bytes: Sequence[bytes]) -> bool:
    """Does llguidance read tokenizer.json as `token_bytes()` / `special_token_ids` describe it?"""
    if llg.vocab_size != tokenizer.vocab_size:
        return False
    special = tokenizer.special_token_ids
    # A special token read as plain text could be sampled wherever its text is allowed.
    if not all(llg.is_special_token(i) for i in special if 0 <= i < tokenizer.vocab_size):
        return False
    # And the reverse: llguidance marks every added token special, even ones whose text the
    # tokenizer treats as ordinary (Hermes `<tool_call>` tags); a grammar could then force text
    # that no token can be accepted for.
    if any(
        llg.is_special_token(i)
        for i in range(min(len(token_bytes), tokenizer.vocab_size))
        if i not in special and not token_bytes[i].startswith(_SPECIAL_MARKER)
    ):
        return False
    # A token starting with byte 0xFF (never in UTF-8) collides with llguidance's special marker
    # and reads as empty there: harmless, as no text can contain it.
    return all(
        llg.decode_bytes([i]) == token_bytes[i]
        for i in range(min(len(token_bytes), tokenizer.vocab_size))
        if i not in special and token_bytes[i] and not token_bytes[i].startswith(_SPECIAL_MARKER)
    )


def llg_tokenizer_for(
    tokenizer: TokenizerLike, *, tokenizer_json: str | os.PathLike[str] | None = None
) -> LLTokenizer:
    """The llguidance tokenizer for `tokenizer`; expensive (vocabulary-sized), so callers cache it.

    For a tokenizer.json-backed tokenizer llguidance reads tokenizer.json itself (HF `tokenizers`
    in Rust: tokenizing forced text needs no Python and no GIL). The file comes from
    `tokenizer_json` (a path or the JSON text) or else the tokenizer's `tokenizer_json` attribute.
    It is used only if llguidance can read it and decodes every token to the same bytes as
    `token_bytes()`; otherwise, and for sentencepiece tokenizers, the trie is built from `token_bytes()` and text is
    tokenized with `encode` (see `_ExactTokenize`). All of `eos_token_ids` end a constrained output.
    """
    if not tokenizer.eos_token_ids:
        raise ValueError("constrained decoding needs a tokenizer with at least one EOS token id")
    token_bytes = tokenizer.token_bytes()
    eos = list(tokenizer.eos_token_ids)
    json_text = _tokenizer_json_text(tokenizer, tokenizer_json)
    if json_text is not None:
        try:
            llg = LLTokenizer(json_text, n_vocab=tokenizer.vocab_size, eos_token=eos)
            reason = (
                None
                if _agrees(llg, tokenizer, token_bytes)
                else "reads it differently from token_bytes()"
            )
        except ValueError as e:
            reason = f"cannot read it ({e})"
        if reason is None:
            return llg
        logger.info(
            "llguidance %s tokenizer.json; building its tokenizer from token_bytes() and encode()",
            reason,
        )
    return LLTokenizer(_ExactTokenize(tokenizer, token_bytes), eos_token=eos)
