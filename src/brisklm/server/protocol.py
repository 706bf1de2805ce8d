"""OpenAI's request and response shapes for ``brisklm serve``: a request body read into
SamplingParams (and messages, tools) with an error naming the field at fault, and the responses
and stream chunks written back. No web framework here: ``app`` serves these over HTTP."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brisklm.llm import NOT_TEMPLATE_VARIABLES
from brisklm.openai_format import completion_logprobs, response_format_schema
from brisklm.outputs import TokenLogprob, Usage
from brisklm.sampling import SamplingParams
from brisklm.sampling.params import MAX_LOGPROBS, MAX_N
from brisklm.tool_calls import answer_grammar, openai_tool_choice
from brisklm.tool_formats import ReplyConstraint

if TYPE_CHECKING:
    from brisklm.llm import LLM
    from brisklm.tool_calls import ToolCall
    from brisklm.tool_formats import ToolCallFormat


class ApiError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error body."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


# Fields both endpoints read, OpenAI's and (marked) brisklm's / vLLM's extensions.
_SAMPLING = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "user",
    # extensions, as vLLM's server names them
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "thinking_token_budget",
}
COMPLETION_FIELDS = frozenset(
    _SAMPLING | {"prompt", "logprobs", "echo", "suffix", "best_of", "prompt_logprobs"}
)
# OpenAI's chat fields that ask nothing a local model's reply could differ by: checked, and
# without effect (an end user's id, a prompt cache's key and retention, a predicted output, which
# only speeds OpenAI's replies, a reasoning model's verbosity, stored completions and their tags,
# a processing tier).
_HINTS = {
    "user": (str, "a string"),
    "metadata": (dict, "an object"),
    "store": (bool, "true or false"),
    "service_tier": (str, "a string (auto, default, flex, scale or priority)"),
    "safety_identifier": (str, "a string"),
    "prompt_cache_key": (str, "a string"),
    "prompt_cache_retention": (str, "a string"),
    "prediction": (dict, 'an object ({"type": "content", "content": ...})'),
    "verbosity": (str, "a string (low, medium or high)"),
}
CHAT_FIELDS = frozenset(
    _SAMPLING
    | {
        "messages",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        # vLLM's: the chat template's variables ({"enable_thinking": false} for Qwen3)
        "chat_template_kwargs",
        # passed to the chat template as its variable, as vLLM does (gpt-oss's reads it)
        "reasoning_effort",
        "modalities",
        *_HINTS,
    }
)
# Arguments of the template's rendering that are the request's (or the server's) to set.
_RENDERING_ARGUMENTS = (
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "tokenize",
    "return_dict",
    "return_tensors",
)
_ROLES = ("system", "developer", "user", "assistant", "tool")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def read_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError("the request body is not valid JSON: it is nested too deeply") from None
    except ValueError as error:  # (not JSON, not UTF-8, or a number of too many digits)
        raise ApiError(f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def check_fields(body: Mapping[str, Any], allowed: frozenset[str], endpoint: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(
            f"unrecognized request argument {unknown[0]!r} for {endpoint}; supported: "
            f"{', '.join(sorted(allowed))}",
            param=unknown[0],
        )


def check_model(body: Mapping[str, Any], served: str) -> None:
    """A request may name the served model, or no model."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(f"model must be a string, got {model!r}", param="model")
    if model is not None and model != served:
        raise ApiError(
            f"the model {model!r} does not exist here; this server serves {served!r}",
            param="model",
            status=404,
            code="model_not_found",
        )


def get_field(body: Mapping[str, Any], name: str, kinds: type | tuple[type, ...], what: str) -> Any:
    """``body[name]``, None where it is missing or null; an ApiError naming it unless it is of
    ``kinds`` (``what`` says so in words; a bool is not an int)."""
    value = body.get(name)
    if value is None:
        return None
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise ApiError(f"{name} must be {what}, got {value!r}", param=name)
    return value


@dataclass
class StreamOptions:
    stream: bool = False
    include_usage: bool = False


def stream_options(body: Mapping[str, Any]) -> StreamOptions:
    stream = get_field(body, "stream", bool, "true or false") or False
    options = get_field(body, "stream_options", dict, 'an object like {"include_usage": true}')
    if options is None:
        return StreamOptions(stream)
    if not stream:
        raise ApiError("stream_options is only allowed with stream: true", param="stream_options")
    # (include_obfuscation pads OpenAI's chunks against side channels: nothing to pad here)
    unknown = sorted(set(options) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise ApiError(
            f"stream_options has an unknown key {unknown[0]!r}; supported: include_usage, "
            "include_obfuscation",
            param="stream_options",
        )
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise ApiError(
            f"stream_options.include_usage must be true or false, got {include!r}",
            param="stream_options",
        )
    return StreamOptions(stream, include)


def sampling_changes(
    body: Mapping[str, Any], max_tokens_field: str = "max_tokens"
) -> dict[str, Any]:
    """The SamplingParams fields a request sets (values are checked by SamplingParams)."""
    changes: dict[str, Any] = {}
    if body.get(max_tokens_field) is not None:
        changes["max_tokens"] = body[max_tokens_field]
    for name in (
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "top_k",
        "min_p",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "thinking_token_budget",
    ):
        if body.get(name) is not None:
            changes[name] = body[name]
    stop = body.get("stop")
    if stop is not None:
        changes["stop"] = [stop] if isinstance(stop, str) else stop
    bias = get_field(body, "logit_bias", dict, 'an object of token ids to biases, {"50256": -100}')
    if bias:
        try:
            changes["logit_bias"] = {int(token): value for token, value in bias.items()}
        except ValueError:
            raise ApiError(
                f"logit_bias keys must be token ids (integers as strings), got {sorted(bias)!r}",
                param="logit_bias",
            ) from None
    fields = CONSTRAINT_FIELDS.values()
    given = [name for name in body if name in fields and body[name] is not None]  # (its order)
    if len(given) > 1:
        raise ApiError(
            f"at most one guided_* constraint may be given, got {', '.join(given)}",
            param=given[1],
        )
    for option, name in CONSTRAINT_FIELDS.items():
        if name in given:
            changes[option] = body[name]
    grammar = changes.get("grammar")
    if isinstance(grammar, str) and _GBNF_ROOT.search(grammar):
        changes["grammar_syntax"] = "gbnf"
    return changes


# A guided_grammar with a GBNF root rule (vLLM's examples and llama.cpp's grammars are written
# so) is read as GBNF; Lark has no `::=`, and its grammars start at `start`.
_GBNF_ROOT = re.compile(r"^[ \t]*root[ \t]*::=", re.MULTILINE)


def field_in_error(error: Exception, default: str | None) -> str | None:
    """The request field an error from the library names at its start, else ``default``: a tool
    the template refused ("tools[1] and tools[0] are both named ..."), a sampling field past the
    vocabulary ("SamplingParams.logit_bias=..."; those that get past ``make_params`` have the
    request's names)."""
    text = str(error)
    if text.startswith("tools["):
        return "tools"
    named = re.match(r"SamplingParams\.(\w+)=", text)
    return named.group(1) if named else default


def make_params(
    llm: LLM, changes: dict[str, Any], fields: Mapping[str, str] | None = None
) -> SamplingParams:
    """The request's SamplingParams over the model's defaults; a bad value is an ApiError that
    names the request's field (``fields``: SamplingParams field -> request field, where they
    differ)."""
    try:
        return llm.default_sampling_params(**changes)
    except (ValueError, TypeError) as error:
        named = re.match(r"(?:SamplingParams\.)?(\w+)", str(error))
        name = named.group(1) if named and named.group(1) in changes else None
        names = {**CONSTRAINT_FIELDS, **(fields or {})}
        raise ApiError(str(error), param=names.get(name, name) if name else None) from None


# The SamplingParams constraint options and the request fields (vLLM's) that give them.
CONSTRAINT_FIELDS = {
    "json_schema": "guided_json",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "grammar": "guided_grammar",
}


def _guided_field(changes: Mapping[str, Any]) -> str | None:
    """The guided_* field that gave the request's constraint, if one did."""
    return next((name for option, name in CONSTRAINT_FIELDS.items() if option in changes), None)


def choices_wanted(body: Mapping[str, Any]) -> int:
    """``n``: how many choices a prompt gets."""
    n = body.get("n", 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ApiError(f"n must be an integer in [1, {MAX_N}], got {n!r}", param="n")
    return n


# ------------------------------------------------------------------------------ completions


@dataclass
class CompletionRequest:
    prompts: list[str | list[int]]
    params: SamplingParams
    options: StreamOptions
    # The request field that gave the constraint (a grammar that fails to compile names it).
    constraint_field: str | None = None
    n: int = 1  # choices a prompt
    echo: bool = False  # the reply's text (and logprobs) begin with the prompt's
    no_output: bool = False  # max_tokens 0 (with echo): the prompt alone
    prompt_logprobs: bool = False  # the request asked for the prompt_logprobs extension


def completion_request(llm: LLM, body: Mapping[str, Any], served: str) -> CompletionRequest:
    check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    check_model(body, served)
    get_field(body, "user", *_HINTS["user"])
    for name, allowed in (("suffix", (None,)), ("best_of", (None, 1))):
        if body.get(name) not in allowed:
            raise ApiError(f"{name} is not supported (only its default)", param=name)
    prompts = _prompts(body.get("prompt"))
    echo = get_field(body, "echo", bool, "true or false") or False
    body = dict(body)
    # max_tokens 0 with echo: the prompt's logprobs alone (lm-eval's loglikelihood requests);
    # the engine decodes one token, which the reply leaves out.
    no_output = echo and body.get("max_tokens") == 0 and not isinstance(body["max_tokens"], bool)
    if no_output:
        body["max_tokens"] = 1
    changes = sampling_changes(body)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if isinstance(logprobs, bool) or not isinstance(logprobs, int):
            raise ApiError(
                f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {logprobs!r}",
                param="logprobs",
            )
        changes["logprobs"] = logprobs
    asked = body.get("prompt_logprobs")
    if asked is not None:
        changes["prompt_logprobs"] = asked
    if echo and logprobs is not None:  # the echoed prompt's logprobs
        if asked is not None and asked != logprobs:
            raise ApiError(
                "echo with logprobs reports the prompt's logprobs with logprobs' alternatives; "
                "give prompt_logprobs the same count, or leave it out",
                param="prompt_logprobs",
            )
        changes["prompt_logprobs"] = logprobs
    return CompletionRequest(
        prompts,
        make_params(llm, changes),
        stream_options(body),
        _guided_field(changes),
        choices_wanted(body),
        echo=echo,
        no_output=no_output,
        prompt_logprobs=asked is not None,
    )


def _prompts(prompt: Any) -> list[str | list[int]]:
    """A completion's prompts: a string, a list of strings, a list of token ids or a list of
    such lists."""
    what = "a string, a list of strings, a list of token ids, or a list of token-id lists"
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise ApiError(f"prompt must be {what}, got {prompt!r}", param="prompt")
    if all(_is_id(t) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in prompt):
        return [list(p) for p in prompt]
    raise ApiError(f"prompt must be {what}", param="prompt")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def completion_choice(
    index: int,
    text: str,
    logprobs: Sequence[TokenLogprob] | None,
    finish_reason: str | None,
    prompt_logprobs: Sequence[TokenLogprob | None] | None = None,
    text_start: int = 0,
) -> dict[str, Any]:
    """A completion choice; ``text_start``: where its tokens' text offsets begin (a stream's
    chunk: the length of the tokens' text before it)."""
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": None
        if logprobs is None
        else _offsets(completion_logprobs(logprobs), text_start),
        "finish_reason": finish_reason,
    }
    if prompt_logprobs is not None:
        choice["prompt_logprobs"] = prompt_logprob_entries(prompt_logprobs)
    return choice


def prompt_logprob_entries(entries: Sequence[TokenLogprob | None]) -> list[dict[str, Any] | None]:
    """The prompt_logprobs extension's entries (the first token's None)."""
    return [None if e is None else _entry(e) for e in entries]


def echoed_choice(
    index: int,
    text: str,
    first_token: str,
    prompt_entries: Sequence[TokenLogprob],
    entries: Sequence[TokenLogprob],
    finish_reason: str | None,
) -> dict[str, Any]:
    """A choice whose text begins with its prompt (``echo``), the logprobs too: the prompt's
    first token has none (None, as OpenAI writes it), each other one its logprob given the
    tokens before it."""
    logprobs = completion_logprobs([*prompt_entries, *entries])
    echoed = {
        "tokens": [first_token, *logprobs["tokens"]],
        "token_logprobs": [None, *logprobs["token_logprobs"]],
        "top_logprobs": [None, *logprobs["top_logprobs"]],
    }
    return {
        "index": index,
        "text": text,
        "logprobs": _offsets(echoed, 0),
        "finish_reason": finish_reason,
    }


def _offsets(logprobs: dict[str, Any], start: int) -> dict[str, Any]:
    """OpenAI's ``text_offset``: where each token's text begins, its tokens' texts laid end to
    end from ``start`` (as vLLM counts them)."""
    offsets = []
    for token in logprobs["tokens"]:
        offsets.append(start)
        start += len(token)
    return {**logprobs, "text_offset": offsets}


def text_length(choice: Mapping[str, Any]) -> int:
    """The length of a choice's tokens' texts (a stream's next ``text_start`` moves by it)."""
    logprobs = choice.get("logprobs")
    return sum(len(token) for token in logprobs["tokens"]) if logprobs else 0


def _entry(entry: TokenLogprob) -> dict[str, Any]:
    """A prompt token's logprob entry (brisklm's extension): the token, its logprob and rank, and
    the most likely tokens there."""
    return {
        "token_id": entry.token_id,
        "token": entry.token,
        "logprob": entry.logprob,
        "rank": entry.rank,
        "top_logprobs": [
            {"token_id": t.token_id, "token": t.token, "logprob": t.logprob} for t in entry.top
        ],
    }


# ------------------------------------------------------------------------------------- chat


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: SamplingParams
    options: StreamOptions
    # The tools' or response_format's constraint, built again for the rendered prompt where a
    # reasoning model's thinking may come first (LLM.chat_decoding).
    reply_constraint: ReplyConstraint | None = None
    # The request field that gave the constraint (a grammar that fails to compile names it).
    constraint_field: str | None = None
    n: int = 1  # choices
    # chat_template_kwargs: variables the chat template reads besides messages and tools
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Whether (and how) a reply may open with a thinking block: LLM.reasoning_start's, set once
    # the prompt is rendered.
    reasoning_start: bool | None = None

    @property
    def tool_format(self) -> ToolCallFormat | None:
        """The model's tool-call format where the reply may hold calls (None: text only)."""
        return None if self.reply_constraint is None else self.reply_constraint.calls_format


def chat_template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """``chat_template_kwargs``: the chat template's variables (vLLM's field), none of them a
    request field or an argument of the rendering the server sets."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(
            "chat_template_kwargs must be an object of the chat template's variables (as "
            f'{{"enable_thinking": false}}), got {value!r}',
            param="chat_template_kwargs",
        )
    for name in value:
        where = (
            "a field of the request"
            if name in CHAT_FIELDS and name != "reasoning_effort"  # (vLLM takes it either way)
            else "set by the server"
            if name in _RENDERING_ARGUMENTS
            else "a sampling option"
            if name in NOT_TEMPLATE_VARIABLES
            else None
        )
        if where is not None:
            raise ApiError(
                f"chat_template_kwargs may not hold {name!r}: it is {where}, not a variable of "
                "the chat template",
                param="chat_template_kwargs",
            )
    return dict(value)


def chat_request(llm: LLM, body: Mapping[str, Any], served: str) -> ChatRequest:
    check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    check_model(body, served)
    for name, (kind, what) in _HINTS.items():
        get_field(body, name, kind, what)
    modalities = get_field(body, "modalities", list, '["text"]')
    if modalities is not None and (not modalities or any(m != "text" for m in modalities)):
        raise ApiError(
            f'modalities must be ["text"]: this server writes text only, got {modalities!r}',
            param="modalities",
        )
    template_kwargs = chat_template_kwargs(body)
    effort = get_field(body, "reasoning_effort", str, "a string (such as low, medium or high)")
    if effort is not None:
        given = template_kwargs.setdefault("reasoning_effort", effort)
        if given != effort:
            raise ApiError(
                f"reasoning_effort is {effort!r} and chat_template_kwargs' {given!r}: give one",
                param="reasoning_effort",
            )
    messages = chat_messages(body.get("messages"))
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        if body["max_tokens"] != body["max_completion_tokens"]:
            raise ApiError(
                "max_tokens and max_completion_tokens differ; give one (max_completion_tokens is "
                "OpenAI's newer name)",
                param="max_completion_tokens",
            )
    field_name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    changes = sampling_changes(body, field_name)
    fields = {"max_tokens": field_name, "logprobs": "top_logprobs"}
    wants_logprobs = get_field(body, "logprobs", bool, "true or false") or False
    top = body.get("top_logprobs")
    if top is not None:
        if not wants_logprobs:
            raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs")
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS:
            raise ApiError(
                f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {top!r}",
                param="top_logprobs",
            )
    if wants_logprobs:
        changes["logprobs"] = top or 0
    constraint_field = _guided_field(changes)
    tools = chat_tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), [t["function"]["name"] for t in tools or []])
    parallel = get_field(body, "parallel_tool_calls", bool, "true or false")
    try:
        answer = response_format_schema(body.get("response_format"))
    except ValueError as error:
        raise ApiError(str(error), param="response_format") from None
    if answer is not None and constraint_field is not None:
        raise ApiError(
            "response_format and a guided_* constraint were both given; give one",
            param="response_format",
        )
    if tools and constraint_field is not None:
        raise ApiError(
            "tools and a guided_* constraint were both given; the tools' grammar decides "
            "the reply (use response_format for a JSON answer beside tools)",
            param="tools",
        )
    if tools and answer is not None:  # (its error would seem the tools')
        try:
            answer_grammar(answer)
        except ValueError as error:
            raise ApiError(str(error), param="response_format") from None
    format = llm.tool_call_format() if tools else None
    reply = ReplyConstraint.of_request(format, tools or (), choice, parallel, answer)
    if reply is not None:
        field = "tools" if tools else "response_format"  # (a grammar error names it)
        try:
            changes.update(reply.changes())
        except ValueError as error:
            raise ApiError(str(error), param=field) from None
        constraint_field = fields["json_schema"] = fields["grammar"] = field
    return ChatRequest(
        messages=messages,
        tools=tools,
        params=make_params(llm, changes, fields),
        options=stream_options(body),
        reply_constraint=reply,
        constraint_field=constraint_field,
        n=choices_wanted(body),
        template_kwargs=template_kwargs,
    )


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as chat templates read them: text content (a list of text parts joined),
    developer as system, tool-call arguments as objects."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            'messages must be a non-empty list of messages ({"role": ..., "content": ...})',
            param="messages",
        )
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ApiError(f"{where} must be an object, got {message!r}", param="messages")
        role = message.get("role")
        if role not in _ROLES:
            raise ApiError(
                f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}", param="messages"
            )
        content = message.get("content")
        refusal = message.get("refusal") if role == "assistant" else None
        if content is None and isinstance(refusal, str):
            content = refusal  # an assistant's refusal sent back: what it said
        converted: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _content(content, where, refusals=role == "assistant"),
        }
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ApiError(f"{where}.tool_calls must be a list of calls", param="messages")
        if calls:
            if role != "assistant":
                raise ApiError(
                    f"{where} has tool_calls but is not an assistant message", param="messages"
                )
            converted["tool_calls"] = [
                _call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)
            ]
        elif converted["content"] is None:
            raise ApiError(f"{where} has no content", param="messages")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ApiError(f"{where} (a tool message) needs its tool_call_id", param="messages")
            converted["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            converted["name"] = message["name"]
        # A reply's thinking sent back with it (Qwen3's template shows it within a tool loop).
        reasoning = message.get("reasoning_content")
        if reasoning is not None:
            if role != "assistant" or not isinstance(reasoning, str):
                raise ApiError(
                    f"{where}.reasoning_content must be a string, on an assistant message",
                    param="messages",
                )
            converted["reasoning_content"] = reasoning
        out.append(converted)
    return out


def _content(content: Any, where: str, refusals: bool = False) -> str | None:
    """A message's content as text: a list of text parts joined (and, with ``refusals``, an
    assistant's refusal parts: what it said)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get(kind) if kind == "text" or (refusals and kind == "refusal") else None
            if not isinstance(text, str):
                raise ApiError(
                    f"{where}.content holds a part other than text ({part!r}); this server "
                    "takes text only",
                    param="messages",
                )
            texts.append(text)
        return "".join(texts)
    raise ApiError(f"{where}.content must be a string or a list of text parts", param="messages")


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(
            f'{where} must be {{"type": "function", "function": {{"name", "arguments"}}}}',
            param="messages",
        )
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError as error:
            raise ApiError(
                f"{where}.function.arguments is not valid JSON: {error}", param="messages"
            ) from None
    if not isinstance(arguments, dict):
        raise ApiError(f"{where}.function.arguments must be a JSON object", param="messages")
    return {
        "id": call.get("id") or new_id("call"),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ApiError(
            'tools must be a list of {"type": "function", "function": {...}}', param="tools"
        )
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise ApiError(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                f'"description": ..., "parameters": {{...}}}}}}, got {tool!r}',
                param="tools",
            )
    return tools or None


def _tool_choice(choice: Any, names: list[str]) -> str:
    """ "auto", "required", "none", or the one tool's name (``openai_tool_choice``)."""
    try:
        return openai_tool_choice(choice, names)
    except ValueError as error:
        raise ApiError(str(error), param="tool_choice") from None


def tool_call_dict(call: ToolCall) -> dict[str, Any]:
    """A call as OpenAI writes it: the arguments as JSON text."""
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }


# ---------------------------------------------------------------------------------- shared


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        **usage.counts(),
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


def envelope(kind: str, response_id: str, model: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }
