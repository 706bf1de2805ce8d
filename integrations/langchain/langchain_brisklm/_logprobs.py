"""Token logprobs in the shapes OpenAI's LangChain classes report them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brisklm.outputs import TokenLogprob


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """ChatOpenAI's ``response_metadata["logprobs"]``: ``{"content": [{"token", "bytes",
    "logprob", "top_logprobs": [...]}, ...]}``, one entry a generated token. The ``content`` lists
    of a stream's chunks join when LangChain adds the chunks up."""
    return {
        "content": [
            {
                "token": entry.token,
                "bytes": list(entry.token_bytes),
                "logprob": entry.logprob,
                "top_logprobs": [
                    {"token": top.token, "bytes": list(top.token_bytes), "logprob": top.logprob}
                    for top in entry.top
                ],
            }
            for entry in entries
        ]
    }


def completion_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's completions ``logprobs`` (``generation_info["logprobs"]``): ``tokens``,
    ``token_logprobs`` and ``top_logprobs`` (a dict of token text to logprob per token: of
    alternatives with the same text, such as the pieces of a character, the likeliest)."""
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [_top_by_text(entry) for entry in entries],
    }


def _top_by_text(entry: TokenLogprob) -> dict[str, float]:
    by_text: dict[str, float] = {}
    for top in entry.top:  # (likeliest first)
        by_text.setdefault(top.token, top.logprob)
    return by_text
