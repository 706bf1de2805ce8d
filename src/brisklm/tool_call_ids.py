"""Tool-call ids: the OpenAI style, and the 9 alphanumeric characters Mistral's templates require."""

from __future__ import annotations

import hashlib
import secrets
import string
import uuid

MISTRAL_ID_LENGTH = 9
_ALPHANUMERIC = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """A fresh id in the OpenAI style, `call_` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


def mistral_tool_call_id(source: str | None = None) -> str:
    """9 alphanumeric characters. Random without ``source``; otherwise ``source`` itself when it
    already has that shape, else characters derived from it (the same for the same ``source``, so
    a call and the tool result that answers it keep matching ids)."""
    if source is None:
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(MISTRAL_ID_LENGTH))
    if len(source) == MISTRAL_ID_LENGTH and source.isascii() and source.isalnum():
        return source
    number = int.from_bytes(hashlib.sha256(source.encode("utf-8")).digest()[:8], "big")
    characters = []
    for _ in range(MISTRAL_ID_LENGTH):
        number, index = divmod(number, len(_ALPHANUMERIC))
        characters.append(_ALPHANUMERIC[index])
    return "".join(characters)
