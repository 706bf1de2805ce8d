"""A reasoning model's thinking told apart from its reply: the text of a ``<think>...</think>``
block that opens an assistant turn (Qwen3, DeepSeek-R1's distills, QwQ).

Whether a reply can hold one is read from the chat template (``template_reasons``: it writes
or strips the closing tag), and whether the prompt has opened it already (``LLM.reasoning_start``:
DeepSeek-R1's newer templates end the generation prompt with ``<think>\\n``, and a prefill of
the reasoning, ``continue_final_message="reasoning_content"``, ends inside the block, so the
reply begins inside it and only closes it). A chat reply's constraint comes after the thinking,
as vLLM's reasoning parsers apply one: the tools' grammars are built so (``thinking_grammar``),
and a response format's or the caller's own is put after the block's rules
(``brisklm.constrained.AfterThinking``) unless it writes the block itself
(``may_close_thinking``) or the rules would change it (``LLM.chat_decoding`` decides).
``ReasoningSplitter`` splits a reply as it streams; ``split_reasoning`` a whole one. The newlines
that templates put around the thinking (``<think>\\n...\\n</think>\\n\\n``) belong to neither
part. A reply that does not open with the
block is all content; one cut off inside it (``max_tokens``) is all reasoning.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from typing import Any

from brisklm.constrained.spec import AfterThinking, Grammar
from brisklm.constrained.thinking import CLOSE, OPEN, holds_thinking_rules, thinking_rules
from brisklm.tool_calls import partial_tag_length, start_rule


@functools.lru_cache(maxsize=64)
def template_reasons(template: str | None) -> bool:
    """Whether a chat template knows thinking blocks: it writes the closing tag, or strips it
    from earlier replies (DeepSeek-R1's first templates), outside its comments."""
    return template is not None and CLOSE in re.sub(r"\{#.*?#\}", "", template, flags=re.S)


_MARKUP = re.compile(r"<[|｜][^|｜<>]*[|｜]>")  # a template's turn markup: <|im_start|>, <｜User｜>


def prompt_thinking(prompt_text: str) -> bool | None:
    """Where a rendered prompt's text leaves its reply as to a thinking block, by its last one
    and the template markup after it (``<|...|>``, ``<｜...｜>``; ``[INST]``-like tags aside):
    True inside a block the prompt opened (the reply begins in it: DeepSeek-R1's newer
    templates, a reasoning prefill); None after a block the prompt closed in the reply's own
    turn, no markup after it (Qwen3's ``enable_thinking=False`` writes an empty one: the reply
    holds none, as vLLM reads it); False where the reply may open one."""
    start, close = prompt_text.rfind(OPEN), prompt_text.rfind(CLOSE)
    if start < 0:
        return False
    if close > start:
        return None if _MARKUP.search(prompt_text, close) is None else False
    return _MARKUP.search(prompt_text, start) is None


def may_close_thinking(constraint: Any) -> bool:
    """Whether output under ``constraint`` (a SamplingParams' resolved constraint) may close a
    thinking block: no constraint, or a regex, choice or grammar that writes the closing tag
    (a JSON schema or a forced tool call does not)."""
    if constraint is None:
        return True
    texts = [getattr(constraint, "pattern", None), getattr(constraint, "text", None)]
    texts += list(getattr(constraint, "options", None) or ())
    return any(isinstance(text, str) and CLOSE in text.replace("\\", "") for text in texts)


def thinks_first(constraint: Any) -> bool:
    """Whether output under ``constraint`` (a SamplingParams' resolved constraint) begins with a
    thinking block's rules, its own output after them: an ``AfterThinking``, or a grammar that
    ``thinking_grammar`` built (the tools' for a reasoning model's reply)."""
    if isinstance(constraint, AfterThinking):
        return True
    return isinstance(constraint, Grammar) and holds_thinking_rules(constraint.text)


def block_opening(text: str) -> int | None:
    """Of a reply that may open with a thinking block: where the block's text begins in ``text``
    (after its opening tag), -1 where the reply opens none, None while that is not known (only
    whitespace so far, or the tag arriving)."""
    first = len(text) - len(text.lstrip())
    if text.startswith(OPEN, first):
        return first + len(OPEN)
    return None if OPEN.startswith(text[first:]) else -1


# (and-not for a lexeme of text). Blanks as Python's str.lstrip sees them (block_opening's): \s and
# \x1c-\x1f, which llguidance's \s leaves out.
_NOT_OPENING = r" & ~/(?s:[\s\x1c-\x1f]*<think>.*)/"


def thinking_grammar(grammar: str, thinking: bool | None, reply_texts: Collection[str] = ()) -> str:
    """``grammar`` (a Lark grammar of a chat reply, from rule ``start``) for a reply that may
    hold a thinking block first, as ``thinking`` (``LLM.reasoning_start``'s) says: None, none
    (``grammar`` as it is); False, the reply may open one; True, the reply begins inside one and
    closes it. The thinking is free text, and ``grammar`` applies after it (and its blanks).

    ``reply_texts``: the names of the lexemes of free text that may begin ``grammar``'s reply.
    Where the reply may open a block, they may not begin with the opening tag, so that the
    block's lexeme alone reads it: a lazy lexeme of the reply (the Hermes text before a call's
    tag) would end inside the thinking, at a tag it mentions, and commit the reply to a call."""
    if thinking is None:
        return grammar
    lines = grammar.splitlines()
    start, body = start_rule(lines)
    lines[start] = f"reply: {body}"
    if not thinking:
        guarded = set()
        for i, line in enumerate(lines):
            name = line.partition(":")[0]
            if name in reply_texts:
                lines[i] = line + _NOT_OPENING
                guarded.add(name)
        # (a text lexeme the grammar uses that is defined otherwise, "TEXT[lazy]: ...", would
        # go unguarded, and a tag in the thinking commit the reply to a call)
        unguarded = [n for n in reply_texts if n not in guarded and re.search(rf"\b{n}\b", body)]
        assert not unguarded, f"the reply's text lexemes {unguarded} are not guarded"
    lines[start:start] = thinking_rules(thinking)
    return "\n".join(lines) + "\n"


class ReasoningSplitter:
    """Splits a reply's text, fed as it streams, into reasoning and content: ``feed`` returns
    each piece's ``(reasoning, content)`` delta, holding back what may still turn out to be a
    tag (or the newlines before the closing tag); ``finish`` returns the rest. The deltas of a
    stream add up to ``split_reasoning``'s parts of the whole."""

    def __init__(self, inside: bool = False) -> None:
        # "start": not yet known whether the reply opens a block; "thinking"; "after": just
        # closed (newlines dropped); "content".
        self._state = "thinking" if inside else "start"
        self._held = ""
        self._thought = False  # any reasoning text yet (leading newlines are dropped)
        self.reasoned = inside  # the reply holds a thinking block

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, content = "", ""
        self._held += text
        if self._state == "start":
            opened = block_opening(self._held)
            if opened is None:
                return "", ""  # whitespace, or the tag arriving
            if opened >= 0:
                self._state, self.reasoned = "thinking", True
                self._held = self._held[opened:]
            else:
                self._state = "content"
        if self._state == "thinking":
            if not self._thought:
                self._held = self._held.lstrip("\n")
            end = self._held.find(CLOSE)
            if end < 0:
                keep = len(self._held) - partial_tag_length(self._held, CLOSE)
                keep = len(self._held[:keep].rstrip("\n"))  # (the newlines before the tag)
                reasoning, self._held = self._held[:keep], self._held[keep:]
                self._thought = self._thought or bool(reasoning)
                return reasoning, ""
            reasoning = self._held[:end].rstrip("\n")
            self._thought = self._thought or bool(reasoning)
            self._held, self._state = self._held[end + len(CLOSE) :], "after"
        if self._state == "after":
            self._held = self._held.lstrip("\n")
            if not self._held:
                return reasoning, ""
            self._state = "content"
        content, self._held = self._held, ""
        return reasoning, content

    @property
    def empty_block(self) -> bool:
        """The reply holds a thinking block and no reasoning text has come out of it: a stream
        reports its reasoning as "" (not absent), as the whole reply's is."""
        return self.reasoned and not self._thought

    def take(self, text: str, last: bool) -> tuple[str, str]:
        """``feed`` a stream's piece, and ``finish`` after the ``last``."""
        reasoning, content = self.feed(text)
        if not last:
            return reasoning, content
        more_reasoning, more_content = self.finish()
        return reasoning + more_reasoning, content + more_content

    def finish(self) -> tuple[str, str]:
        """The text held back at the reply's end: a reply cut inside its thinking keeps it as
        reasoning (newlines and a partial tag included), a lone start as content."""
        held, self._held = self._held, ""
        if self._state == "thinking":
            self._thought = self._thought or bool(held)
            return held, ""
        return "", held if self._state in ("start", "content") else ""


def split_reasoning(text: str, inside: bool | None = False) -> tuple[str | None, str]:
    """A whole reply's ``(reasoning, content)``: reasoning None where the reply holds no
    thinking block (``inside``: the prompt opened it, see ``prompt_thinking``; None: the reply
    holds none, as ``LLM.reasoning_start`` says of a template that knows no thinking)."""
    if inside is None:
        return None, text
    splitter = ReasoningSplitter(inside)
    reasoning, content = splitter.take(text, last=True)
    return (reasoning if splitter.reasoned else None), content
