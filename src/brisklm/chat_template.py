"""Renders Hugging Face jinja2 chat templates exactly as transformers' apply_chat_template(tokenize=False)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from brisklm.tool_call_ids import mistral_tool_call_id
from brisklm.tool_schema import tool_json_schema

# Names a message's reasoning may come under; templates read the first (transformers aliases them all)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template failed to compile or raised while rendering (e.g. through raise_exception)."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering keeps the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(
            lineno
        )

    def _render_body(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """`dict` inside templates, limited so attribute access cannot reach Python internals."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's namespace() refusing underscore-prefixed attributes, as transformers' sandbox does."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick for namespace(self=...)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}"
            )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Unlike jinja's own tojson this does not HTML-escape, and it exposes json.dumps' options
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=64)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template once per source text, in transformers' sandboxed environment."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _TemplateDict()
    environment.globals["namespace"] = _TemplateNamespace
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(
            f"the chat template does not compile: {error} (line {error.lineno})"
        ) from error


def _to_dicts(value: Any) -> Any:
    """Message objects (dataclasses, pydantic models) and anything nested in them, as dicts."""
    if isinstance(value, Mapping):
        return {key: _to_dicts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_dicts(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_to_dicts(item) for item in value)
    if callable(getattr(value, "to_message_dict", None)) and not isinstance(value, type):
        # brisklm's ToolCall: the OpenAI shape every family's template reads.
        return _to_dicts(value.to_message_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _to_dicts(value.model_dump())
    return value


def _plain_data(value: Any) -> Any:
    """Rebuild what the template sees from plain JSON types; other objects become inert "<TypeName>" strings."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain_data(key): _plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain_data(item) for item in value)
    numpy = sys.modules.get(
        "numpy"
    )  # a numpy scalar implies numpy is imported; never import it here
    if numpy is not None and isinstance(value, numpy.generic):
        return _plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _check_message(index: int, message: dict[str, Any]) -> None:
    """The fields every template relies on, checked so a bad one is named (not a TypeError inside
    the template): role a str, content a str, a number, a dict or a list of content blocks (dicts),
    tool_calls a list of dicts each naming its function."""
    where = f"messages[{index}]"
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError(f"{where}.role must be a non-empty str, got {role!r}")
    content = message.get("content")
    # A dict or a number is passed through as transformers does: Llama 3.1's template writes a
    # tool result given as a dict with tojson, and a tool's number prints as the template says.
    if content is not None and not isinstance(content, str | dict | int | float):
        if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
            raise ValueError(
                f"{where}.content must be a str, a number, a dict or a list of content blocks "
                f"(dicts), got {type(content).__name__}"
            )
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return
    if not isinstance(tool_calls, list):
        raise ValueError(f"{where}.tool_calls must be a list, got {type(tool_calls).__name__}")
    for number, call in enumerate(tool_calls):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(
                f"{where}.tool_calls[{number}] must be a dict with a function name "
                '({"type": "function", "function": {"name": ..., "arguments": ...}} or '
                f'{{"name": ..., "arguments": ...}}), got {call!r}'
            )


def _check_tools(tools: list[dict[str, Any]]) -> None:
    """Function tools (OpenAI form or flat) need a unique non-empty name and, if given, dict
    parameters; a model could not call a nameless tool, and a call to a duplicated name is
    ambiguous. Tools of another ``type`` go to the template as given."""
    seen: dict[str, int] = {}
    for index, tool in enumerate(tools):
        if tool.get("type", "function") != "function":
            continue
        function = tool.get("function", tool)
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{index}] needs a non-empty str name, got {name!r}")
        parameters = function.get("parameters")  # type: ignore[union-attr]
        if parameters is not None and not isinstance(parameters, dict):
            raise ValueError(
                f"tools[{index}] ({name!r}): parameters must be a JSON Schema dict, got "
                f"{type(parameters).__name__}"
            )
        if name in seen:
            raise ValueError(
                f"tools[{index}] and tools[{seen[name]}] are both named {name!r}: tool names "
                "must be unique"
            )
        seen[name] = index


def check_messages_list(messages: object, sequence: bool = False) -> None:
    """ValueError unless ``messages`` holds messages: an iterable (``sequence``: a sequence, a
    list or tuple) but no str, bytes or dict (a str was read character by character, None
    failed inside the template's loop)."""
    wanted = Sequence if sequence else Iterable
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, wanted):
        raise ValueError(
            f"messages must be a list of message dicts ({{'role': ..., 'content': ...}}), "
            f"got {type(messages).__name__}"
        )


def _normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    normalized = []
    messages = getattr(messages, "messages", messages)
    check_messages_list(messages)
    for index, message in enumerate(_to_dicts(list(messages))):
        if not isinstance(message, dict):
            raise TypeError(
                f"chat messages must be dicts, dataclasses or pydantic models, got {message!r}"
            )
        # APIs send content=None / tool_calls=None; templates handle a missing key but would print "None"
        message = {key: value for key, value in message.items() if value is not None}
        _check_message(index, message)
        reasoning = next(
            (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        normalized.append(message)
    return normalized


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    /,
    *,
    documents: Sequence[Mapping[str, Any]] | None = None,
    continue_final_message: bool | str = False,
    **extra: Any,
) -> str:
    """Render `messages` (and `tools`) with a chat template.

    The template sees `messages`, `tools` (JSON schema dicts; functions and pydantic models are converted
    by `tool_schema.tool_json_schema`), `documents`, `add_generation_prompt`, the special tokens
    (`bos_token`, `eos_token`, ...) and any extra keyword arguments, which override special tokens of the
    same name (the parameters before `/` are positional, so a template variable may be called
    `template` or `special_tokens`, as in transformers). `continue_final_message` renders the last
    message open-ended, so generation continues its content (a prefill), or the field it names
    (e.g. "reasoning_content", to continue the model's thinking); it implies add_generation_prompt=False. Raises ChatTemplateError (a
    ValueError) for a template that fails, including its own raise_exception calls, and ValueError for
    an empty conversation.
    """
    messages = _normalize_messages(messages)
    if not messages:
        raise ValueError(
            "cannot apply a chat template to an empty conversation; give at least one message"
        )
    if _NINE_CHARACTER_IDS in template:
        messages = _nine_character_ids(messages)
    compiled = compile_chat_template(template)
    tool_schemas = None if tools is None else [tool_json_schema(tool) for tool in tools]
    if tool_schemas is not None:
        _check_tools(tool_schemas)
    _check_documents(documents)
    variables = _plain_data({**(special_tokens or {}), **extra})
    final_content = None
    if not isinstance(continue_final_message, bool | str):
        raise TypeError(
            "continue_final_message must be a bool or the name of the final message's field to "
            f"continue (e.g. 'reasoning_content'), got {continue_final_message!r}"
        )
    if continue_final_message:
        add_generation_prompt = False
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final_content = _tag_final_message(messages, template, field)
    try:
        rendered = compiled.render(
            messages=_plain_data(messages),
            tools=_plain_data(tool_schemas),
            documents=_plain_data(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as error:
        missed = isinstance(error, jinja2.UndefinedError) and "content" in str(error)
        hint = _missing_content(messages) if missed else ""
        raise ChatTemplateError(f"the chat template raised an error: {error}{hint}") from error
    except Exception as error:
        # Python errors inside the template: values of a type it does not handle (e.g. content
        # blocks for a template that concatenates strings), a division by zero, jinja's sandbox
        # refusing range() past 100,000 (OverflowError).
        raise ChatTemplateError(
            f"the chat template failed on these messages ({type(error).__name__}: {error}); "
            f"check the types of the message fields and tools it reads{_content_blocks(messages)}"
        ) from error
    if final_content is not None:
        rendered = _cut_at_final_message(rendered, final_content)
    return rendered


def _content_blocks(messages: list[dict[str, Any]]) -> str:
    """Where a template failed on a value's type: the messages whose content is a list of blocks,
    named, which a template written for text content cannot read."""
    lists = [f"messages[{i}]" for i, m in enumerate(messages) if isinstance(m.get("content"), list)]
    if not lists:
        return ""
    verb = "gives" if len(lists) == 1 else "give"
    return (
        f" ({', '.join(lists)} {verb} content as a list of blocks, which this template may not "
        "take: give the text as a str)"
    )


def _missing_content(messages: list[dict[str, Any]]) -> str:
    """Where a template read a field that is not there: the messages without content (None or
    left out) but for those that carry tool calls, named, since templates read every message's."""
    missing = [
        f"messages[{i}] ({m['role']})"
        for i, m in enumerate(messages)
        if "content" not in m and "tool_calls" not in m
    ]
    if not missing:
        return ""
    verb = "has" if len(missing) == 1 else "have"
    return f"; {', '.join(missing)} {verb} no content (None or left out): give each a str"


# Mistral's templates refuse any tool-call id that is not 9 characters long (the check reads
# `tool_call.id|length != 9`), so a history from another source (OpenAI-style "call_..." ids, LangChain)
# cannot be rendered as transformers would render it: it would raise. Such ids are mapped, as vLLM
# does for Mistral models, to 9 ASCII letters and digits derived from the id, the same in the
# assistant's calls and the tool results that answer them; so is a 9-character id of other
# characters ("call_1234", which the template would take): Mistral's models were trained on
# [A-Za-z0-9]{9} ids, and mistral_common refuses others.
_NINE_CHARACTER_IDS = "length != 9"


def _nine_character_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        message = dict(message)
        if isinstance(message.get("tool_call_id"), str):
            message["tool_call_id"] = mistral_tool_call_id(message["tool_call_id"])
        if isinstance(message.get("tool_calls"), list):
            calls = []
            for call in message["tool_calls"]:
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    call = {**call, "id": mistral_tool_call_id(call["id"])}
                calls.append(call)
            message["tool_calls"] = calls
        out.append(message)
    return out


# A marker appended to the final message so its end can be found (and cut) in the rendered chat
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tag_final_message(messages: list[dict[str, Any]], template: str, field: str) -> str:
    """Append the marker to the last message's ``field`` (its last text block, for a list);
    return the text it continues. Reasoning comes under several names (``_normalize_messages``
    copies it to each): every copy is tagged, whichever the template reads."""
    final = messages[-1].get(field)
    if final is None:
        raise ValueError(
            f"continue_final_message is set but the final message has no {field!r} to continue"
        )
    fields = [field]
    if field in _REASONING_FIELDS:
        fields = [name for name in _REASONING_FIELDS if messages[-1].get(name) == final]
    if not any(name in template for name in fields):
        raise ValueError(
            f"continue_final_message is set but the chat template never reads {field!r}"
        )
    if isinstance(final, list | tuple):
        for block in reversed(final):
            if isinstance(block, dict) and "text" in block:
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return text
        raise ValueError("continue_final_message is set but the final message has no text block")
    if not isinstance(final, str):
        raise ValueError(
            f"continue_final_message is set but the final message's {field!r} is a "
            f"{type(final).__name__}, not text"
        )
    for name in fields:
        messages[-1][name] = final + _CONTINUE_TAG
    return final


def _check_documents(documents: Any) -> None:
    """Documents for RAG templates, as transformers takes them: a list of dicts ('title' and
    'text' in most templates). A string's attributes rendered as Python reprs."""
    if documents is None:
        return
    if not isinstance(documents, list | tuple):
        raise ValueError(
            f"documents must be a list of dicts (e.g. with 'title' and 'text'), got "
            f"{type(documents).__name__}"
        )
    for i, document in enumerate(documents):
        if not isinstance(document, Mapping):
            raise ValueError(
                f"documents[{i}] must be a dict (e.g. with 'title' and 'text'), got "
                f"{type(document).__name__} {document!r:.60}"
            )


def _cut_at_final_message(rendered: str, final_content: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_content.strip() not in rendered or tag not in rendered:
        raise ValueError(
            "continue_final_message is set but the chat template dropped part of the final message, "
            "so the chat cannot be continued from it"
        )
    tag_position = rendered.rindex(tag)
    if rendered[tag_position : tag_position + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:tag_position]
    # The template trimmed the message's trailing space, and with it part of the marker
    return rendered[:tag_position].rstrip()
