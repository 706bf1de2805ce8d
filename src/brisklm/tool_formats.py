"""How each model family writes its tool calls: detected from the chat template, parsed, enforced.

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes, Qwen2/2.5,
  brisklm's bundled models; the default for templates that show no other format).
- ``llama3_json``: Llama 3.1/3.2/3.3 JSON tool calling. The whole reply is one call,
  ``{"name": ..., "parameters": {...}}``, possibly after the ``<|python_tag|>`` special token;
  several calls are separated by ``;``.
- ``mistral``: Mistral v0.3 / Nemo. Content, then the ``[TOOL_CALLS]`` special token and a JSON
  array of ``{"name": ..., "arguments": {...}}``. Their templates require call ids of exactly 9
  alphanumeric characters, so calls parsed in this format get such ids. Newer Mistral models
  (tokenizer v11+: Mistral Small 3.x) write each call as ``[TOOL_CALLS]NAME[ARGS]{...}``
  (``[CALL_ID]ID`` may follow the name); both layouts parse, and a template that shows ``[ARGS]``
  gets grammars in the newer one.

The tag tokens are special tokens (in Hermes 3 on Llama 3.1 ``<tool_call>`` and ``</tool_call>``
are too), which decoding drops by default: a chat turn with tools in a format with a tag token is
decoded with ``skip_special_tokens=False`` (``ToolCallFormat.keeps_special_tokens``).
Grammars (``ToolCallFormat.grammar``) write each format as its templates show calls in the history,
with the tag as its token (llguidance's ``<[id]>``), so the constrained output stays in distribution.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from brisklm.reasoning import CLOSE as THINK_CLOSE
from brisklm.reasoning import block_opening, thinking_grammar
from brisklm.tool_call_ids import mistral_tool_call_id, new_tool_call_id
from brisklm.tool_calls import (
    REPLY_TEXTS,
    TOOL_CALL_END,
    TOOL_CALL_START,
    ContentDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallEvent,
    ToolCallStreamParser,
    ToolChoiceMode,
    answer_grammar,
    call_alternatives,
    check_tool_choice_mode,
    grammar_mode,
    json_answer_rule,
    parse_tool_calls,
    partial_tag_length,
    start_rule,
    text_without,
    tool_call_from_json,
    tool_call_grammar,
    unclosed_block_call,
    unclosed_block_start,
)
from brisklm.tool_schema import check_tools_list

FORMAT_NAMES = ("hermes", "llama3_json", "mistral")
MISTRAL_TAG = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
LLAMA_TAG = "<|python_tag|>"
# Mistral v11+: NAME, optionally [CALL_ID]ID, then [ARGS] (or the arguments straight away).
_LEADING_SPACE = re.compile(r"\s*")
_OWN_ID = re.compile(r"[A-Za-z0-9]+")  # a call id of the model's that Mistral's formats keep
# ToolCallFormat.call_id: a parsed call's id, from the one the model wrote (or None) and the
# calls before it in the reply.
CallId = Callable[[object, Sequence[ToolCall]], str]
_V11_HEAD = re.compile(r"\s*([^\s\[\]{}]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9]+)\s*)?(?:\[ARGS\])?\s*")


class ReplyReading(NamedTuple):
    """A reply read in its format (``ToolCallFormat.read_reply``): its content, its calls, the
    text of the call it ended inside (after the format's opening tag; None where none was cut:
    neither content nor a call) and whether it ended inside a call."""

    content: str
    calls: list[ToolCall]
    cut_call: str | None
    ended_inside_call: bool


@dataclass(frozen=True)
class ToolCallFormat:
    """One family's way of writing tool calls; ``tag_token_id`` is the tag's id in the model's
    vocabulary (Hermes: that of ``<tool_call>`` where it is a special token, else None)."""

    name: str = "hermes"
    tag_token_id: int | None = None
    # Mistral v11+ layout ([TOOL_CALLS]NAME[ARGS]{...}): the id of its [ARGS] token.
    args_token_id: int | None = None
    # Hermes: the id of </tool_call> where it is a special token (Hermes 3 on Llama 3.1).
    end_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.name not in FORMAT_NAMES:
            raise ValueError(
                f"unknown tool-call format {self.name!r}; expected one of {', '.join(FORMAT_NAMES)}"
            )

    @property
    def tag(self) -> str | None:
        """The special token that opens the calls (None for hermes when its tags are plain text)."""
        if self.name == "hermes":
            return TOOL_CALL_START if self.tag_token_id is not None else None
        return {"llama3_json": LLAMA_TAG, "mistral": MISTRAL_TAG}[self.name]

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether replies must be decoded with special tokens kept, so the tags reach the parser."""
        return self.tag_token_id is not None or self.end_token_id is not None

    def decoding_options(self, reasoning_start: bool | None = None) -> dict[str, Any]:
        """The SamplingParams options of a reply that may hold calls in this format (after the
        thinking block ``reasoning_start`` says it may hold: ``LLM.reasoning_start``'s): stop
        strings apply only before its calls, and special tokens are kept where the calls' tag is
        one."""
        options: dict[str, Any] = {"reply_calls": ReplyCalls(self, reasoning_start)}
        if self.keeps_special_tokens:
            options["skip_special_tokens"] = False
        return options

    def call_id(self, own: object, calls: Sequence[ToolCall]) -> str:
        """A parsed call's id, after the reply's ``calls`` before it: for Mistral the one the
        model wrote (its JSON's "id", a v11 reply's ``[CALL_ID]``), so that the next prompt
        shows it, where it is letters and digits and no call before it has it (results come
        back matched by id); else a new one."""
        if (
            self.name == "mistral"
            and isinstance(own, str)
            and _OWN_ID.fullmatch(own)
            and all(call.id != own for call in calls)
        ):
            return own
        return self.new_id()

    def new_id(self) -> str:
        return mistral_tool_call_id() if self.name == "mistral" else new_tool_call_id()

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """Split a reply into its content and its tool calls (as ``parse_tool_calls`` for hermes).

        Calls that do not parse leave the reply as content, tags included.
        """
        if self.name == "hermes":
            return parse_tool_calls(text)
        if self.name == "mistral":
            start = text.find(MISTRAL_TAG)
            if start < 0:
                return text.strip(), []
            after = text[start + len(MISTRAL_TAG) :]
            if after.lstrip().startswith(("[", "{")):
                calls = _parse_json_calls(after, self.call_id, array=True)
            else:
                calls = _parse_v11_calls(after, self.call_id)
            return (text[:start].strip(), calls) if calls else (text.strip(), [])
        body = text.strip()
        if body.startswith(LLAMA_TAG):
            body = body[len(LLAMA_TAG) :]
        if not body.lstrip().startswith("{"):
            return text.strip(), []
        calls = _parse_json_calls(body, self.call_id, array=False)
        return ("", calls) if calls else (text.strip(), [])

    def cut_calls(self, text: str) -> tuple[str, list[ToolCall], str | None] | None:
        """For a reply that ended inside its calls (max_tokens, a stop sequence or a stop token):
        the content before the calls, the calls complete before the cut, and the text of the call
        it ended inside (None when only the calls' closing was cut). None for a reply that
        ``parse`` reads whole or that shows no calls; Hermes replies give None too (their blocks
        are split by their own tags, see ``parse_tool_calls``)."""
        if self.name == "hermes" or self.parse(text)[1]:
            return None
        if self.name == "mistral":
            start = text.find(MISTRAL_TAG)
            if start < 0:
                return None
            after = text[start + len(MISTRAL_TAG) :].strip()
            if after.startswith(("[", "{")):
                calls, rest = _leading_json_calls(after, self.call_id, array=True)
            else:
                calls, rest = _leading_v11_calls(after, self.call_id)
            return text[:start].strip(), calls, rest
        body = text.strip()
        if body.startswith(LLAMA_TAG):
            body = body[len(LLAMA_TAG) :]
        elif not _may_begin_a_call(body) or _is_whole_json_answer(body):
            return None
        return "", *_leading_json_calls(body, self.call_id, array=False)

    def calls_start(self, text: str, searched: int = 0, begin: int = 0) -> int:
        """Where the first call of the reply ``text[begin:]`` begins in ``text`` (its opening tag,
        or for Llama 3 the reply's first character when the reply is a call), or -1 while none has
        begun. ``searched``: the length of a prefix of ``text`` already searched, with no call
        begun in it; a call (or its tag) that begins is there in ``text`` from then on, so it is
        found.

        A Llama 3 reply that opens with ``{`` counts as a call from its first character: whether
        it is a call or a JSON answer (a response_format beside tools) shows only at its end."""
        if self.name == "llama3_json":
            first = _LEADING_SPACE.match(text, begin).end()  # type: ignore[union-attr]
            return first if text.startswith(("{", LLAMA_TAG), first) else -1
        tag = TOOL_CALL_START if self.name == "hermes" else MISTRAL_TAG
        return text.find(tag, max(begin, searched - len(tag) + 1))

    def ended_inside_call(self, text: str) -> bool:
        """Whether max_tokens, a stop sequence or a stop token ended the reply inside a call,
        before it was whole (a call whole but for its closing is whole)."""
        return self.read_cut(text)[1]

    def read_cut(self, text: str) -> tuple[tuple[str, list[ToolCall], str | None] | None, bool]:
        """``cut_calls(text)`` and ``ended_inside_call(text)``, read once."""
        if self.name == "hermes":
            start = unclosed_block_start(text)
            inside = start >= 0 and not unclosed_block_call(text[start + len(TOOL_CALL_START) :])
            return None, inside
        cut = self.cut_calls(text)
        return cut, cut is not None and cut[2] is not None

    def read_reply(self, text: str, was_cut: bool, under_grammar: bool) -> ReplyReading:
        """A whole reply's content and calls. ``was_cut``: max_tokens, a stop string or a stop
        token ended it. A Llama 3 / Mistral reply cut inside its calls (``cut_calls``) keeps the
        calls complete before the cut and the content before the calls; a Hermes reply that
        ended inside a call block, the content and calls before that block. A reply that ended
        at eos is read by ``parse`` (text that does not parse is content), and so is a reply
        decoded freely that shows no complete call before its cut (text that only looks like a
        call's start); ``under_grammar``: the reply was decoded under the tools' grammar, where
        a call's start is a call."""
        cut_calls, cut = self.read_cut(text)
        if cut_calls is not None and was_cut and (cut_calls[1] or under_grammar):
            return ReplyReading(*cut_calls, cut)
        if cut and self.name == "hermes":
            # (the cut block's markup was content, beside the calls before it)
            start = unclosed_block_start(text)
            content, calls = self.parse(text[:start])
            return ReplyReading(content.strip(), calls, text[start + len(TOOL_CALL_START) :], cut)
        return ReplyReading(*self.parse(text), None, cut)

    def stream_parser(self) -> ToolCallStreamParser | TailCallStreamParser:
        """An incremental parser whose events add up to ``parse`` of the whole reply."""
        return ToolCallStreamParser() if self.name == "hermes" else TailCallStreamParser(self)

    def grammar(
        self,
        tools: Sequence[Any],
        mode: ToolChoiceMode = "auto",
        *,
        parallel: bool = True,
        answer_schema: Mapping[str, Any] | bool | None = None,
        thinking: bool | None = None,
    ) -> str:
        """A Lark grammar (llguidance) for one assistant turn that may call ``tools`` in this format.

        Modes as ``tool_call_grammar``: "auto" (text, or calls), "required" (calls only), "none"
        (text that does not start calls). llama3_json allows one call per turn (its templates
        cannot render more), whatever ``parallel`` says. ``answer_schema`` (OpenAI's tools beside
        a ``response_format``): in "auto" the reply is the calls or, instead of text, JSON under
        that schema; "required" ignores it, and "none" is that JSON alone. ``thinking``
        (``LLM.reasoning_start``'s for the reply's prompt): a reasoning model's thinking block
        may come first (True: the prompt opened it, and the reply closes it), free text where a
        call tag is no call (``brisklm.reasoning.thinking_grammar``).
        """
        check_tool_choice_mode(mode)
        check_tools_list(tools)
        if answer_schema is not None and not isinstance(answer_schema, Mapping | bool):
            raise ValueError(
                "answer_schema must be a JSON schema (a dict) or a bool, got "
                f"{type(answer_schema).__name__}"
            )
        grammar = self._reply_grammar(tools, mode, parallel, answer_schema)
        return thinking_grammar(grammar, thinking, REPLY_TEXTS)

    def _reply_grammar(
        self,
        tools: Sequence[Any],
        mode: ToolChoiceMode,
        parallel: bool,
        answer_schema: Mapping[str, Any] | bool | None,
    ) -> str:
        """``grammar``'s, for a reply without thinking."""
        if answer_schema is not None and mode != "required":
            if mode == "none":
                return answer_grammar(answer_schema)
            lines = self._reply_grammar(tools, "required", parallel, None).splitlines()
            start, body = start_rule(lines)
            lines[start] = f"start: answer | {body}"
            lines.append(json_answer_rule(answer_schema))
            return "\n".join(lines) + "\n"
        if self.name == "hermes":
            return tool_call_grammar(
                tools,
                mode,
                parallel=parallel,
                start_token_id=self.tag_token_id,
                end_token_id=self.end_token_id,
            )
        lines = ["%llguidance {}"]
        tag = f"<[{self.tag_token_id}]>" if self.tag_token_id is not None else None
        if self.name == "mistral":
            # Text cannot produce the special tag, so content and calls need no lazy split; nor may
            # it spell the tag out of other tokens ("[TOOL_" "CALLS]"): ``parse`` reads the text,
            # and would find a call there that no tool schema checked.
            if mode == "none" or tag is None and mode == "auto":
                lines.append("start: TEXT")
            else:
                if tag is None:
                    raise ValueError(
                        f"the {MISTRAL_TAG} tag is not one token of this tokenizer: the mistral "
                        "tool-call format cannot be enforced"
                    )
                if self.args_token_id is not None:  # v11+: [TOOL_CALLS]NAME[ARGS]{...} per call
                    calls = f"({tag} call)+" if parallel else f"{tag} call"
                else:
                    more = ' (", " call)*' if parallel else ""
                    calls = f'{tag} " "? "[" call{more} "]"'
                # "auto": text, which may end in the calls (or end the reply as it is).
                lines.append(f"start: TEXT ({calls})?" if mode == "auto" else f"start: {calls}")
            lines.append(f"TEXT: {text_without(MISTRAL_TAG)}")
            key = "arguments"
        else:
            # A reply that starts with "{" (after blanks) is a call; text must not. One call per
            # turn whatever ``parallel`` says: Llama 3's templates refuse a turn with several
            # ("This model only supports single tool-calls at once!"), so the history could not
            # be rendered again.
            if mode == "none":
                lines.append("start: TEXT")
            elif mode == "auto":
                lines.append("start: TEXT | call")
            else:
                lines.append("start: call")
            # Blanks as Python's str.strip (what ``parse`` strips) sees them: \s plus \x1c-\x1f.
            # Nor may text start with the tag spelled out of other tokens (``parse`` skips it).
            blanks = r"[\s\x1c-\x1f]*"
            lines.append(
                rf"TEXT: /(?s:{blanks}|{blanks}[^\s\x1c-\x1f{{].*)/"
                rf" & ~/(?s:{blanks}{re.escape(LLAMA_TAG)}.*)/"
            )
            key = "parameters"
        if mode != "none":
            args = None if self.args_token_id is None else f"<[{self.args_token_id}]>"
            lines.extend(call_alternatives(tools, mode, key, name_then=args))
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ReplyConstraint:
    """The constraint of a chat reply under OpenAI's ``tools`` (with ``tool_choice``, given as
    ``mode`` and the ``tools`` it allows) or ``response_format`` (``answer_schema``), or both,
    as the server and ChatBrisk take them. It is built for the reply's prompt (``changes``): a
    reasoning model's thinking may come first, unconstrained, as vLLM's reasoning parsers let
    it."""

    format: ToolCallFormat | None = None  # (where there are tools)
    tools: tuple[Any, ...] = ()
    mode: ToolChoiceMode = "auto"
    parallel: bool = True
    answer_schema: Mapping[str, Any] | bool | None = None
    _built: dict[bool | None, dict[str, Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def of_request(
        cls,
        format: ToolCallFormat | None,
        tools: Sequence[Any],
        choice: str = "auto",
        parallel: bool | None = None,
        answer_schema: Mapping[str, Any] | bool | None = None,
    ) -> ReplyConstraint | None:
        """A request's: its ``tools`` (in ``format``, the model's) and tool choice ("auto",
        "required", "none" or the one tool's name), ``parallel_tool_calls`` (None: allowed) and
        response format's schema; None where it gives neither tools nor a schema."""
        if not tools:
            return None if answer_schema is None else cls(answer_schema=answer_schema)
        mode, allowed = grammar_mode(tools, choice)
        single = choice not in ("auto", "required", "none") or parallel is False
        return cls(format, tuple(allowed), mode, not single, answer_schema)

    @property
    def calls_format(self) -> ToolCallFormat | None:
        """The format to parse the reply's calls in; None where it can hold none (no tools, or
        tool_choice "none")."""
        return self.format if self.tools and self.mode != "none" else None

    def changes(self, thinking: bool | None = None) -> dict[str, Any]:
        """The SamplingParams changes for a reply that may think first as ``thinking``
        (``LLM.reasoning_start``'s: None, it does not): the tools' grammar
        (``ToolCallFormat.grammar``), or without tools the answer's schema, a ``json_schema``
        constraint (``LLM.chat_decoding`` puts a thinking block before it, as before a caller's
        own constraint: ``brisklm.constrained.AfterThinking``). Built once for each ``thinking``
        (a request asks for them as it is checked and again once its prompt is rendered; a
        grammar of a few tools takes ~1 ms)."""
        if thinking not in self._built:
            self._built[thinking] = self._changes(thinking)
        return dict(self._built[thinking])

    def _changes(self, thinking: bool | None) -> dict[str, Any]:
        if self.tools:
            assert self.format is not None, "tools need the format of their calls"
            grammar = self.format.grammar(
                self.tools,
                self.mode,
                parallel=self.parallel,
                answer_schema=self.answer_schema,
                thinking=thinking,
            )
            return {"grammar": grammar}
        return {"json_schema": self.answer_schema}


@dataclass(frozen=True)
class ReplyCalls:
    """How a chat reply holds its tool calls: in ``format``, after the thinking block that
    ``reasoning_start`` (``LLM.reasoning_start``'s) says it may hold, where calls are not parsed.
    ``SamplingParams.reply_calls``: stop strings apply only before the reply's first call."""

    format: ToolCallFormat
    reasoning_start: bool | None = None

    def calls_start(self) -> Callable[[str, int], int]:
        """For one reply: a function of its text so far and the length already searched, giving
        where its first call begins (-1: none yet; as ``ToolCallFormat.calls_start``), calls in
        its thinking (even those of a block cut short) not counted."""
        # Where the thinking block's text begins (after its opening tag), where the content does.
        opened: int | None = 0 if self.reasoning_start else None
        content: int | None = 0 if self.reasoning_start is None else None

        def calls_start(text: str, searched: int) -> int:
            nonlocal opened, content
            if content is None:
                if opened is None:  # does the reply open a block?
                    at = block_opening(text)
                    if at is None:
                        return -1  # not known yet
                    if at < 0:
                        content = 0
                    else:
                        opened = at
                if content is None:
                    assert opened is not None
                    close = text.find(THINK_CLOSE, max(opened, searched - len(THINK_CLOSE) + 1))
                    if close < 0:
                        return -1
                    content = searched = close + len(THINK_CLOSE)
            return self.format.calls_start(text, searched, content)

        return calls_start


def _parse_json_calls(text: str, call_id: CallId, array: bool) -> list[ToolCall]:
    """Calls written as JSON: an array of call objects (or one object) when ``array``, else call
    objects separated by ";". Empty unless all of ``text`` parses into calls."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    position = 0
    text = text.strip()
    while position < len(text):
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return []
        values.extend(value if array and isinstance(value, list) else [value])
        position = end
        rest = text[position:].lstrip()
        if array:
            if rest:
                return []
            break
        if rest and not rest.startswith(";"):
            return []
        position = len(text) - len(rest[1:].lstrip()) if rest else len(text)
    calls = []
    for value in values:
        call = _json_call(value)
        if call is None:
            return []
        calls.append(ToolCall(call.name, call.arguments, id=call_id(value.get("id"), calls)))
    return calls


def _parse_v11_calls(text: str, call_id: CallId) -> list[ToolCall]:
    """Mistral v11+ calls after the first [TOOL_CALLS]: NAME ([CALL_ID]ID)? [ARGS]? {...}, each
    further call after another [TOOL_CALLS]. Empty unless all of it parses."""
    calls, stop = _v11_calls(text, call_id)
    return calls if stop is None else []


def _v11_calls(text: str, call_id: CallId) -> tuple[list[ToolCall], int | None]:
    """The Mistral v11+ calls at the start of ``text`` (after the first [TOOL_CALLS]), read in
    order, and where the first that does not parse begins (None when all of it parses). Read call
    by call, not split at the tags: an argument may hold the text "[TOOL_CALLS]"."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = 0
    while True:
        head = _V11_HEAD.match(text, position)
        if head is None:
            return calls, position
        try:
            arguments, end = decoder.raw_decode(text, head.end())
        except json.JSONDecodeError:
            return calls, position
        rest = len(text) - len(text[end:].lstrip())
        if not isinstance(arguments, dict) or not (
            rest == len(text) or text.startswith(MISTRAL_TAG, rest)
        ):
            return calls, position
        calls.append(ToolCall(head.group(1), arguments, id=call_id(head.group(2), calls)))
        if rest == len(text):
            return calls, None
        position = rest + len(MISTRAL_TAG)


def _json_call(value: Any) -> ToolCall | None:
    """A decoded JSON value as a call of the JSON formats, or None. Unlike a tagged Hermes block,
    bare JSON may be an answer (JSON mode, a response_format beside tools): a call names its
    arguments, so an answer with a "name" field is no call."""
    if not isinstance(value, dict) or not ({"arguments", "parameters"} & value.keys()):
        return None
    return tool_call_from_json(value)


_CALL_OPENING = '{"name":'
# A JSON object's second key (as far as written) after a string "name".
_SECOND_KEY = re.compile(r'\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"((?:[^"\\]|\\.)*)')
_ARGUMENTS_KEYS = ("parameters", "arguments")


def _may_begin_a_call(body: str) -> bool:
    """Whether a Llama 3 reply's JSON (with no tag before it), cut short, may be a call: its
    first key is "name" and its second, where one has begun, may be "parameters" or
    "arguments", as calls are written; or it ends before its keys show. One that begins
    otherwise is an answer (a ``response_format``'s beside tools) or text."""
    opening = "".join(body[:64].split())[: len(_CALL_OPENING)]
    if not opening or not _CALL_OPENING.startswith(opening):
        return False
    second = _SECOND_KEY.match(body)
    return second is None or any(key.startswith(second.group(1)) for key in _ARGUMENTS_KEYS)


def _is_whole_json_answer(text: str) -> bool:
    """Whether ``text`` is one whole JSON value that is no call: an answer, not a call cut short."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return _json_call(value) is None


def _leading_json_calls(
    text: str, call_id: CallId, array: bool
) -> tuple[list[ToolCall], str | None]:
    """Of JSON calls cut short (an array of call objects when ``array``, else call objects
    separated by ";"): the calls complete before the cut, and the text of the one it is in."""
    decoder = json.JSONDecoder()
    text = text.strip()
    separator = "," if array else ";"
    position = 1 if array and text.startswith("[") else 0
    calls: list[ToolCall] = []
    while True:
        position = len(text) - len(text[position:].lstrip())
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return calls, text[position:]  # a call due here and cut (or not a call at all)
        call = _json_call(value)
        if call is None:
            return calls, text[position:]
        calls.append(ToolCall(call.name, call.arguments, id=call_id(value.get("id"), calls)))
        rest = text[end:].lstrip()
        if not rest.startswith(separator):
            return calls, (rest if rest.strip("]") else None)
        position = len(text) - len(rest) + 1


def _leading_v11_calls(text: str, call_id: CallId) -> tuple[list[ToolCall], str | None]:
    """Of Mistral v11+ calls cut short (after their first [TOOL_CALLS]): the calls complete
    before the cut, and the text of the one it is in."""
    calls, stop = _v11_calls(text, call_id)
    return calls, (None if stop is None else text[stop:].strip())


def detect_tool_call_format(
    chat_template: str | None,
    token_id: Callable[[str], int | None],
    special_token_ids: Collection[int] = (),
) -> ToolCallFormat:
    """The format a chat template shows tool calls in; ``token_id`` maps a token's text to its id.
    Hermes tags that are ``special_token_ids`` (Hermes 3 on Llama 3.1) are kept as tokens."""
    template = chat_template or ""
    if MISTRAL_TAG in template:
        args = token_id(MISTRAL_ARGS) if MISTRAL_ARGS in template else None
        return ToolCallFormat("mistral", token_id(MISTRAL_TAG), args)
    if LLAMA_TAG in template or ('"parameters"' in template and "<|start_header_id|>" in template):
        return ToolCallFormat("llama3_json", token_id(LLAMA_TAG))
    start, end = token_id(TOOL_CALL_START), token_id(TOOL_CALL_END)
    return ToolCallFormat(
        "hermes",
        start if start in special_token_ids else None,
        end_token_id=end if end in special_token_ids else None,
    )


class TailCallStreamParser:
    """Incremental ``ToolCallFormat.parse`` for formats whose calls end the reply (llama3_json,
    mistral): content streams until the calls begin, the calls are parsed at the end.

    Events: ``ContentDelta`` and, from ``finish``, ``ToolCallComplete``. Text that may still turn
    out to begin the calls (a partial tag, a leading "{") is held back until it is decided.
    """

    def __init__(self, format: ToolCallFormat) -> None:
        self._format = format
        self._text = ""
        self._emitted = ""
        self._num_calls = 0

    @property
    def num_calls(self) -> int:
        """Tool calls completed so far (all of them arrive with ``finish``)."""
        return self._num_calls

    def feed(self, delta: str) -> list[ToolCallEvent]:
        self._text += delta
        return self._emit(self._text[: self._safe_length()].strip())

    def finish(self) -> list[ToolCallEvent]:
        content, calls = self._format.parse(self._text)
        events = self._emit(content)
        for call in calls:
            events.append(ToolCallComplete(self._num_calls, call))
            self._num_calls += 1
        return events

    def _safe_length(self) -> int:
        """How much of the text is content whatever comes next."""
        text = self._text
        if self._format.name == "mistral":
            start = text.find(MISTRAL_TAG)
            return start if start >= 0 else len(text) - partial_tag_length(text, MISTRAL_TAG)
        head = text.lstrip()
        if not head or head.startswith(("{", LLAMA_TAG)) or LLAMA_TAG.startswith(head):
            return 0  # calls, or not yet known
        return len(text)

    def _emit(self, content: str) -> list[ToolCallEvent]:
        if len(content) <= len(self._emitted):
            return []
        new = content[len(self._emitted) :]
        self._emitted = content
        return [ContentDelta(new)]
