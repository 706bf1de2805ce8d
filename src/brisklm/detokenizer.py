"""Incremental detokenizer: turns generated token ids into text deltas that never split a character."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brisklm.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Streams the text of generated tokens with the prefix/read offset technique.

    Each step decodes two short windows that start at `prefix_offset`: the tokens already emitted in the
    previous step (`prefix_offset:read_offset`) and the same plus everything since; the delta is the
    difference. Starting the window one step back gives every token its leading space in context
    (sentencepiece decoding strips the '▁' of the first token it sees), and the first window starts with
    the last few prompt tokens for the same reason. Text is held back while it ends in U+FFFD (an
    incomplete UTF-8 sequence) and, for byte-fallback tokenizers, while the last token is a `<0xNN>` piece:
    the decoder replaces a whole run of byte pieces with U+FFFDs if any byte in it is invalid, so a run is
    only final once a non-byte token ends it.

    A byte-level BPE tokenizer whose decoding is the concatenation of its tokens' bytes
    (`Tokenizer.decodes_by_concatenation`, special tokens skipped, or
    `decodes_specials_by_concatenation`, special tokens kept) takes a shorter way: each token's
    bytes go through an incremental UTF-8 decoder, which holds back an incomplete character and
    replaces invalid bytes as `decode` does. No decode call per token: after a forward pass that
    streamed a model's weights through the caches, the two calls of the windows took ~75 us a token
    with a 32,000-token vocabulary.

    Invariant: the concatenation of all deltas plus `flush()` equals
    `decode(prompt_ids + ids)[len(decode(prompt_ids)):]` for prompts that end on a complete character,
    and `decode(ids)` (with the first token's leading space) after one that ends inside a character;
    with an empty prompt that is exactly `decode(ids)` (unless `keep_first_space`: then the first
    token keeps the leading space sentencepiece decoding strips). With `skip_special_tokens` special
    tokens add no text and do not break byte runs, as in `decode`.
    """

    PROMPT_CONTEXT_TOKENS = 6
    # Dropping already-emitted ids keeps the id list (and the slicing) small on long generations
    MAX_STALE_IDS = 256

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        keep_first_space: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._skipped_ids = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        self._byte_ids = tokenizer.byte_fallback_ids
        self._ids: list[int] = self._prompt_context(
            [i for i in prompt_ids if i not in self._skipped_ids]
        )
        if keep_first_space and not self._ids and tokenizer.context_token_id is not None:
            # No prompt text to decode after (an empty prompt, or special tokens alone): an
            # ordinary token stands in, so the first token keeps its leading space. Constrained
            # requests ask for it: their grammar counted that space (" yes" came out "yes").
            self._ids = [tokenizer.context_token_id]
        self.prefix_offset = 0
        self.read_offset = len(self._ids)
        self._prefix_text: str | None = None
        self._text = ""
        # The bytes of each token, where decoding concatenates them, and the UTF-8 decoder they go
        # through; None: the windows above.
        self._token_bytes: list[bytes] | None = None
        # The current run of byte pieces through a strict UTF-8 decoder (None once a byte in it
        # is invalid) and the character its last byte completed (``byte_run_char``).
        self._run_utf8: codecs.IncrementalDecoder | None
        self._run_char: str
        self._end_byte_run()
        if (
            tokenizer.decodes_by_concatenation
            if skip_special_tokens
            else tokenizer.decodes_specials_by_concatenation
        ):
            self._token_bytes = tokenizer.token_bytes()
            self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def _prompt_context(self, ids: list[int]) -> list[int]:
        """The last few prompt tokens before any byte pieces that end the prompt, starting where a
        character starts.

        Byte pieces that end the prompt are left out: the decoder reads adjacent byte pieces as one
        run, and a run with an invalid byte becomes U+FFFD throughout, so an output starting with
        an invalid byte turned the prompt's last character ("\n" as <0x0A> in Llama 2 and Mistral
        chat prompts) into U+FFFD output too. A window that starts inside a UTF-8 sequence of byte
        pieces decodes to U+FFFD, so the start moves back (at most three bytes) to the piece
        holding the character's first byte. A prompt of byte pieces alone gets the tokenizer's
        one-letter ``context_token_id`` instead: without context the sentencepiece decoder would
        strip the first generated token's leading space (every word's), and kept as context the
        pieces joined the output's (after ``[<s>, <0xC3>]``, "naïve" came out "��ïve").

        Other tokens that leave the prompt inside a character (a byte-level BPE byte token, when
        special tokens are kept and the text is decoded in windows) are left out too: the window
        completed the character with the output's first bytes ("é" where ``decode`` of the output
        gives U+FFFD).
        """
        end = len(ids)
        while end and ids[end - 1] in self._byte_ids:
            end -= 1
        if not end and ids and self._tokenizer.context_token_id is not None:
            return [self._tokenizer.context_token_id]
        ids = ids[:end] if end else ids
        start = max(0, len(ids) - self.PROMPT_CONTEXT_TOKENS)
        for _ in range(3):
            if start == 0 or not self._is_continuation_byte(ids[start]):
                break
            start -= 1
        context = ids[start:]
        for _ in range(3):  # a character is at most four bytes
            if not context or not self._decode(context).endswith(REPLACEMENT_CHAR):
                break
            context = context[:-1]
        return context

    def _is_continuation_byte(self, token_id: int) -> bool:
        """Whether the token is a byte piece ``<0xNN>`` with NN in 0x80-0xBF (inside a character)."""
        if token_id not in self._byte_ids:
            return False
        return 0x80 <= int(self._tokenizer.id_to_token(token_id)[3:5], 16) <= 0xBF

    @property
    def text(self) -> str:
        """All text emitted so far (the concatenation of the deltas)."""
        return self._text

    def add(self, token_id: int) -> str:
        """Take one generated token and return the text it completes ("" while text is held back)."""
        if token_id in self._skipped_ids:
            return ""
        if self._token_bytes is not None:
            if not 0 <= token_id < len(self._token_bytes):
                return ""  # no token: decode ignores it too
            delta = self._utf8.decode(self._token_bytes[token_id])
            self._text += delta
            return delta
        self._ids.append(token_id)
        if token_id in self._byte_ids:
            self._feed_byte_run(token_id)
            return ""
        self._end_byte_run()
        return self._emit(final=False)

    @property
    def byte_run_char(self) -> str:
        """The character the last token completed, when it is a ``<0xNN>`` piece of a run of byte
        pieces whose bytes so far are valid UTF-8 ending on a whole character; "" otherwise."""
        return self._run_char

    def _feed_byte_run(self, token_id: int) -> None:
        self._run_char = ""
        if self._run_utf8 is None:
            return  # an invalid byte earlier in the run: decode makes the whole run U+FFFD
        byte = int(self._tokenizer.id_to_token(token_id)[3:5], 16)
        try:
            self._run_char = self._run_utf8.decode(bytes((byte,)))
        except UnicodeDecodeError:
            self._run_utf8 = None

    def _end_byte_run(self) -> None:
        self._run_utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self._run_char = ""

    def held_byte_run_text(self) -> str:
        """The text a held run of byte pieces would add if the run ended here, or "".

        Non-empty only while ``byte_run_char`` is: then ending the run now (``flush``) emits
        exactly what ``decode`` gives for these ids, and a stop rule can judge the text at the
        token that completed it instead of at the later token that ends the run (a Llama 2
        ``"\n"`` is ``<0x0A>``). Nothing changes: text held back stays held back."""
        return (self._window_delta(final=False) or "") if self._run_char else ""

    def flush(self) -> str:
        """Emit whatever is held back (call once generation ends); may contain U+FFFD for invalid bytes."""
        if self._token_bytes is not None:
            delta = self._utf8.decode(b"", final=True)
            self._text += delta
            return delta
        self._end_byte_run()
        return self._emit(final=True)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def _window_delta(self, final: bool) -> str | None:
        """The text the tokens since ``read_offset`` add, or None while it is held back (not
        ``final`` and the window's text ends inside a character or has not grown)."""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[self.prefix_offset : self.read_offset])
        prefix_text = self._prefix_text
        if self.read_offset == len(self._ids):
            return None
        new_text = self._decode(self._ids[self.prefix_offset :])
        if not final and (len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR)):
            return None
        # The window's old text is a prefix of its new text except after a prompt that ends inside a
        # character; then emit from where the two part, which resynchronises on the next step
        return new_text[_common_prefix_length(prefix_text, new_text) :]

    def _emit(self, final: bool) -> str:
        delta = self._window_delta(final)
        if delta is None:
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self._ids)
        self._prefix_text = None
        if self.prefix_offset > self.MAX_STALE_IDS:
            del self._ids[: self.prefix_offset]
            self.read_offset -= self.prefix_offset
            self.prefix_offset = 0
        self._text += delta
        return delta


def _common_prefix_length(a: str, b: str) -> int:
    if b.startswith(a):
        return len(a)
    length = 0
    for char_a, char_b in zip(a, b, strict=False):
        if char_a != char_b:
            break
        length += 1
    return length
