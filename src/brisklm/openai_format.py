"""OpenAI's API shapes that brisklm's LangChain classes and its server share: token logprobs as
OpenAI reports them, and the JSON schema of a ``response_format``."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from brisklm.constrained.json_schema import JSON_OPTIONS
from brisklm.outputs import TokenLogprob


def reply_logprobs(
    entries: Sequence[TokenLogprob],
    token_ids: Sequence[int],
    stop_reason: Any,
    eos_token_ids: Collection[int],
) -> list[TokenLogprob]:
    """The logprobs of a chat reply's tokens (or of a stream chunk's, the last chunk's ending
    the reply): without the token that ended the turn (an eos, or a stop token id: no text of the
    reply), as OpenAI reports them."""
    if entries and token_ids and (stop_reason is None or isinstance(stop_reason, int)):
        last = token_ids[-1]
        if last == stop_reason or (stop_reason is None and last in eos_token_ids):
            return list(entries[:-1])
    return list(entries)


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
    # The chosen token always, as OpenAI's completions give it (up to logprobs + 1 entries).
    by_text.setdefault(entry.token, entry.logprob)
    return by_text


RESPONSE_FORMATS = (
    'response_format must be {"type": "text"} (the default: no constraint), '
    '{"type": "json_object"}, {"type": "json_schema", "schema": {...}} '
    'or OpenAI\'s {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, '
    '"strict": ...}}, where the schema is a JSON Schema dict (or `true`: any JSON)'
)


def _json_schema_entry(response_format: dict[str, Any]) -> Any:
    """The schema of a json_schema response_format, flat or in OpenAI's nested shape."""
    nested = response_format.get("json_schema")
    if "schema" in response_format and nested is not None:
        raise ValueError(
            "response_format has both a schema and a json_schema entry; give the schema once. "
            + RESPONSE_FORMATS
        )
    if nested is not None:
        if not isinstance(nested, dict) or "schema" not in nested:
            raise ValueError(
                f"response_format's json_schema entry must be a dict with a schema, got "
                f"{nested!r}; {RESPONSE_FORMATS}"
            )
        # OpenAI's strict: accepted; the reply always follows the schema as given.
        strict = nested.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"response_format's json_schema.strict must be a bool, got {strict!r}")
        schema = nested["schema"]
    elif "schema" in response_format:
        schema = response_format["schema"]
    else:
        raise ValueError(f"response_format {response_format!r} has no schema; {RESPONSE_FORMATS}")
    if not isinstance(schema, (dict, bool)):
        raise ValueError(
            f"response_format's schema must be a JSON Schema dict (or `true`), got "
            f"{type(schema).__name__} {schema!r}; {RESPONSE_FORMATS}"
        )
    return schema


def response_format_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON Schema to decode under for a `response_format` (None for none given, or OpenAI's
    default `{"type": "text"}`: plain text); ValueError for any other shape."""
    if response_format is None or response_format == {"type": "text"}:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        schema = _json_schema_entry(response_format)
    else:
        raise ValueError(f"unsupported response_format {response_format!r}; {RESPONSE_FORMATS}")
    if schema is True:  # the JSON Schema `true`: any JSON value
        schema = {}
    elif schema is False:
        raise ValueError(
            f"response_format's schema is `false`, which no JSON value matches; {RESPONSE_FORMATS}"
        )
    schema = dict(schema)
    guidance = schema.get("x-guidance", {})
    if not isinstance(guidance, dict):
        raise ValueError(
            f"response_format's schema has an x-guidance entry that is not an object: {guidance!r}"
        )
    # Spaced separators as json.dumps writes them, the JSON style chat models see in training.
    schema["x-guidance"] = {**JSON_OPTIONS, **guidance}
    return schema
