"""vLLM's ``/tokenize`` and ``/detokenize``: the token ids of a prompt or of a chat as the
model's template renders it (what a request would send the model), and the text of ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brisklm.llm import LLM
from brisklm.server.protocol import (
    ApiError,
    chat_messages,
    chat_template_kwargs,
    chat_tools,
    check_fields,
    check_model,
    field_in_error,
    get_field,
)

_TOKENIZE_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "tools",
        "add_special_tokens",
        "add_generation_prompt",
        "return_token_strs",
        "chat_template_kwargs",
    }
)
_DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def tokenize(llm: LLM, body: Mapping[str, Any], served: str) -> dict[str, Any]:
    """``{"count", "max_model_len", "tokens", "token_strs"}`` for ``prompt`` (text; the
    tokenizer's special tokens added unless ``add_special_tokens`` is false) or ``messages``
    (and ``tools``, and ``chat_template_kwargs``) rendered by the chat template (with the
    assistant's turn opened unless ``add_generation_prompt`` is false; no special tokens added:
    the template writes them)."""
    check_fields(body, _TOKENIZE_FIELDS, "/tokenize")
    check_model(body, served)
    if ("prompt" in body) == ("messages" in body):
        raise ApiError("give one of prompt (text) or messages (a chat)", param="prompt")
    chat = "messages" in body
    special = _flag(body, "add_special_tokens", not chat)
    generation = _flag(body, "add_generation_prompt", True)
    names = _flag(body, "return_token_strs", False)
    if chat:
        messages, tools = chat_messages(body["messages"]), chat_tools(body.get("tools"))
        variables = chat_template_kwargs(body)
        try:
            text = llm.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=generation, **variables
            )
        except ValueError as error:
            raise ApiError(str(error), param=field_in_error(error, "messages")) from None
    else:
        for name in ("add_generation_prompt", "chat_template_kwargs"):
            if name in body:
                raise ApiError(f"{name} needs messages", param=name)
        text = body["prompt"]
        if not isinstance(text, str):
            raise ApiError(f"prompt must be a string, got {text!r}", param="prompt")
    try:
        ids = llm.tokenizer.encode(text, add_special_tokens=special)
    except ValueError as error:  # (text that is not valid Unicode)
        raise ApiError(str(error), param="messages" if chat else "prompt") from None
    return {
        "count": len(ids),
        "max_model_len": llm.max_seq_len,
        "tokens": ids,
        "token_strs": [llm.tokenizer.id_to_token(i) for i in ids] if names else None,
    }


def detokenize(llm: LLM, body: Mapping[str, Any], served: str) -> dict[str, Any]:
    """``{"prompt": text}`` of ``tokens`` (special tokens kept, as transformers decodes)."""
    check_fields(body, _DETOKENIZE_FIELDS, "/detokenize")
    check_model(body, served)
    ids = body.get("tokens")
    vocab = llm.tokenizer.vocab_size
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids
    ):
        raise ApiError(f"tokens must be a list of token ids in [0, {vocab})", param="tokens")
    return {"prompt": llm.tokenizer.decode(ids, skip_special_tokens=False)}


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = get_field(body, name, bool, "true or false")
    return default if value is None else value
