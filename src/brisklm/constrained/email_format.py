"""The ``email`` format as a pattern that JSON Schema (RFC 5321's Mailbox) and Pydantic's
``EmailStr`` (the email-validator package) both accept.

llguidance's own email format took addresses email-validator refuses, so a model could fill a
Pydantic ``EmailStr`` field with ``bob@example``, ``a@1.2.3.4`` or ``x@host.local`` and fail its
validation. This pattern keeps to what both accept: a dot-atom local part of ASCII characters, a
domain of two or more labels, hostname labels (letters, digits and inner hyphens, at most 63
characters, no ``--`` at the third and fourth: IDNA's mark) but the last, which is letters and
digits ending with a letter and none of the special-use names email-validator refuses; at most
254 characters in all. Quoted local parts, address literals (``[127.0.0.1]``) and internationalized
addresses are left out: valid, but never needed to write an address.
"""

from __future__ import annotations

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LOCAL_PART = rf"{_ATEXT}+(?:\.{_ATEXT}+)*"
MAX_LABEL = 63
MAX_ADDRESS = 254
# email-validator's SPECIAL_USE_DOMAIN_NAMES: refused as a domain's last label, in any case.
SPECIAL_USE_NAMES = ("arpa", "invalid", "local", "localhost", "onion", "test")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"

_Trie = dict[str, tuple["_Trie", bool]]


def _last_label(excluded: tuple[str, ...]) -> str:
    """A domain's last label: letters and digits ending with a letter, at most ``MAX_LABEL``
    characters, and none of ``excluded`` (lowercase letters) in any case. Without lookahead, the exclusion walks a trie of the excluded words: at
    each of their prefixes a label may end (unless the prefix is a word), leave the trie with any
    other character and go on freely, or follow a word."""
    trie: _Trie = {}
    for word in excluded:
        node = trie
        for index, char in enumerate(word):
            child, is_word = node.get(char, ({}, False))
            node[char] = (child, is_word or index == len(word) - 1)
            node = child
    return _from(trie, depth=0, is_word=False)


def _from(children: _Trie, depth: int, is_word: bool) -> str:
    """The rest of a label after ``depth`` characters along the trie (all letters)."""
    alternatives = [] if depth == 0 or is_word else [""]
    rest = MAX_LABEL - depth - 1  # characters allowed after the next one
    free = "".join(c + c.upper() for c in _LETTERS if c not in children)
    ending = rf"(?:[A-Za-z0-9]{{0,{rest - 1}}}[A-Za-z])" if rest >= 1 else None
    if free:
        alternatives.append(f"[{free}]{ending}?" if ending else f"[{free}]")
    if ending:  # a digit must be followed to a letter
        alternatives.append(f"[0-9]{ending}")
    for char in sorted(children):
        child, word = children[char]
        alternatives.append(f"[{char}{char.upper()}]{_from(child, depth + 1, word)}")
    return "(?:" + "|".join(alternatives) + ")"


def email_pattern(label: str) -> str:
    """The anchored pattern (Rust syntax), ``label`` a hostname label's."""
    return rf"^{_LOCAL_PART}@(?:{label}\.)+{_last_label(SPECIAL_USE_NAMES)}$"
