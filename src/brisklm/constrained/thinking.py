"""The Lark (llguidance) rules of a reasoning model's thinking block before a reply's grammar:
``<think>`` free text ``</think>``, then up to two newlines. ``brisklm.reasoning.thinking_grammar``
puts them before the tools' grammars, ``AfterThinking`` before any constraint."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"

# The block is one lazy lexeme, which ends at the first closing tag; a newline or two may follow
# it, as templates write "</think>\n\n" (the newlines ReasoningSplitter drops; no more: a forced
# call or answer would have room to waste its tokens on blanks).
_BLOCK = {
    # opened by the reply (after blanks, as Python's str.lstrip sees them: \s and \x1c-\x1f,
    # which llguidance's \s leaves out), or by the prompt
    False: 'thinking[lazy]: /[\\s\\x1c-\\x1f]*/ "<think>" /(?s:.*)/ "</think>"',
    True: 'thinking[lazy]: /(?s:.*)/ "</think>"',
}
_START = {
    False: "start: (thinking THOUGHT_END?)? reply",
    True: "start: thinking THOUGHT_END? reply",
}


def thinking_rules(opened: bool) -> list[str]:
    """The rules of a grammar whose ``start`` is a thinking block, then rule ``reply`` (which
    the caller defines): the block opened by the prompt (``opened``: the reply begins inside
    it and must close it) or by the reply (which may also go straight to ``reply``)."""
    return [_START[opened], _BLOCK[opened], "THOUGHT_END: /\\n{1,2}/"]


def holds_thinking_rules(grammar: str) -> bool:
    """Whether a Lark grammar's text holds a thinking block's rules (``thinking_rules``): its
    reply comes after the block."""
    return any(rule in grammar for rule in _BLOCK.values())
