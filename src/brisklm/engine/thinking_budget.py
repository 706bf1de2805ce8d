"""A reasoning model's thinking bounded in tokens (``SamplingParams.thinking_token_budget``, as
vLLM's ``thinking_token_budget`` and llama.cpp's reasoning budget bound it): the engine counts
the tokens of a reply's thinking block, and once they reach the budget forces the block's
closing tag, so that the reply goes on to its answer (or its tool calls) instead of thinking
until ``max_tokens``.

A request's ``ThinkingBudget`` reads each token it appends (``take``) and says how many more it
may take before it needs the engine's attention (``free_tokens``): several native decode steps a
call and speculative proposals stop there, and at 0 the engine takes ``forced_token`` instead of
sampling, as it takes a grammar's forced token.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Sequence
from typing import Literal

from brisklm.constrained.thinking import CLOSE
from brisklm.reasoning import block_opening

logger = logging.getLogger(__name__)

_CLOSE = CLOSE.encode()


# Tokens past the budget that the block's text may take to end on a whole character (or to finish
# a closing tag the model began), where each token still ends inside one (text whose token
# boundaries keep splitting characters: byte pieces of CJK text; or bytes that never make one, a
# lead byte after a lead byte, which no grammar lets through); past them the tag is forced anyway.
_PAST_BUDGET = 8


def _utf8_decoder() -> codecs.IncrementalDecoder:
    """A decoder whose held-back bytes (``getstate()[0]``) are the first bytes of a character,
    valid so far, that the text ends with (a byte-level BPE token may end there)."""
    return codecs.getincrementaldecoder("utf-8")("replace")


class ThinkingBudget:
    """One request's thinking block, counted against ``budget`` tokens.

    ``opened``: where the prompt has opened the block (the reply begins inside it), the block's
    text the prompt holds; None where the reply may open one (``brisklm.reasoning.block_opening``
    reads its start). ``token_bytes``: each id's bytes (``Tokenizer.token_bytes``).
    ``closing``: the tokens that close the block, after thinking text that ends with a newline
    and after text that does not (``"</think>\\n\\n"`` and ``"\\n</think>\\n\\n"``, as
    chat templates lay the block out).

    States: "waiting" for the reply to open a block (until its start is known), "counting" its
    tokens, "forcing" the closing tag, "done" (the block closed, by the model or by force, or the
    reply opened none). The budget counts the reply's tokens only (a reasoning prefill's text in
    the prompt is not counted). Where the budget's last token ends inside a character (a
    byte-level BPE token may hold part of one), or with the first part of a closing tag, the block
    takes a token at a time until its text ends on a whole character, or the tag is whole (at most
    ``_PAST_BUDGET`` tokens past the budget): a tag forced inside a character would leave it
    broken, and a grammar after the thinking (which reads UTF-8 text) would refuse it."""

    def __init__(
        self,
        budget: int,
        opened: str | None,
        token_bytes: Sequence[bytes],
        closing: tuple[Sequence[int], Sequence[int]],
    ) -> None:
        self.budget = budget
        self.state: Literal["waiting", "counting", "forcing", "done"] = "waiting"
        self.count = 0  # tokens of the block's text so far
        self._table = token_bytes
        self._closing = closing
        self._forced: list[int] = []
        self._reply = ""  # while waiting: the reply's text, less its leading blanks
        self._decoder = _utf8_decoder()  # the reply's text, while waiting
        self._block_text = _utf8_decoder()  # the block's: whether it ends inside a character
        self._tail = b""  # the block's last bytes, where a closing tag may be arriving
        self._ends_line = False  # the block's text so far ends with a newline
        if opened is not None:
            self._enter_block(opened.encode())

    @property
    def free_tokens(self) -> int | None:
        """How many tokens the request may take before the budget must look at it again: None
        without limit (done), 0 while it forces the closing tag."""
        if self.state == "counting":
            return max(self.budget - self.count, 1)
        if self.state == "waiting":
            # (a block opened by the first of them leaves the rest to count: at most the budget)
            return self.budget + 1
        return 0 if self.state == "forcing" else None

    @property
    def forced_token(self) -> int | None:
        """The token the budget forces next (None: none)."""
        return self._forced[0] if self._forced else None

    def take(self, token_id: int) -> None:
        """Read a token the request has appended."""
        if self.state == "done":
            return
        if self.state == "forcing":
            if token_id == self._forced[0]:
                del self._forced[0]
            else:  # (every path takes forced_token here: a bug if not)
                logger.warning(
                    "thinking budget: token %d taken where %d was forced; forcing no more",
                    token_id,
                    self._forced[0],
                )
                self._forced.clear()
            if not self._forced:
                self.state = "done"
            return
        data = self._table[token_id] if 0 <= token_id < len(self._table) else b""
        if self.state == "waiting":
            self._reply = (self._reply + self._decoder.decode(data)).lstrip()
            start = block_opening(self._reply)
            if start is None:
                return
            if start < 0:
                self.state = "done"
            else:  # (with the bytes of a character the decoder holds back)
                self._enter_block(self._reply[start:].encode() + self._decoder.getstate()[0])
            return
        self.count += 1
        self._read(data)

    def _enter_block(self, text: bytes) -> None:
        """Start counting (``text``: the block's text that came with its opening tag)."""
        self.state = "counting"
        self._read(text)

    def _unfinished(self) -> bool:
        """The block's text ends inside a character, or with the first part of a closing tag
        (the model's own, which a forced one would leave cut)."""
        if self._block_text.getstate()[0]:
            return True
        return any(self._tail.endswith(_CLOSE[:k]) for k in range(1, len(_CLOSE)))

    def _read(self, data: bytes) -> None:
        """Follow the block's text with ``data``: done at a closing tag, forcing one at the
        budget."""
        window = self._tail + data
        if _CLOSE in window:
            self.state = "done"
            return
        self._tail = window[-(len(_CLOSE) - 1) :]
        if data:
            self._ends_line = data.endswith(b"\n")
        self._block_text.decode(data)
        if self.count >= self.budget and (
            not self._unfinished() or self.count >= self.budget + _PAST_BUDGET
        ):
            self.state = "forcing"
            self._forced = list(self._closing[0] if self._ends_line else self._closing[1])
            if not self._forced:
                self.state = "done"
