"""Constraint kinds (JSON Schema, JSON mode, regex, choice, grammar) and their llguidance grammar text."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llguidance import LLMatcher

from brisklm.constrained.errors import ConstraintError
from brisklm.constrained.gbnf import gbnf_to_lark
from brisklm.constrained.json_schema import json_schema_to_llguidance
from brisklm.constrained.lark_json import enforce_json_embeds
from brisklm.constrained.thinking import thinking_rules


def lark_literal(text: str) -> str:
    """`text` as a Lark string literal (JSON string syntax is valid Lark string-literal syntax,
    escapes included)."""
    return json.dumps(text)


GrammarSyntax = Literal["lark", "gbnf"]
GRAMMAR_SYNTAXES: tuple[str, ...] = ("lark", "gbnf")


def _schema_dict(schema: Any) -> dict[str, Any] | bool:
    """A JSON Schema given as a dict, a boolean schema, or a pydantic model class."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if not isinstance(schema, (dict, bool)):
        hint = ""
        if isinstance(schema, CONSTRAINT_TYPES):
            hint = f" (pass a {type(schema).__name__} as constraint=)"
        raise ConstraintError(
            "json_schema must be a dict, a boolean or a pydantic model class, "
            f"got {type(schema).__name__}{hint}"
        )
    return schema


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(text: str, what: str) -> None:
    """ConstraintError for a lone surrogate (no UTF-8 text holds one; it failed deep inside)."""
    found = _SURROGATE.search(text)
    if found is not None:
        raise ConstraintError(
            f"{what} holds a lone surrogate (U+{ord(found.group()):04X}) at index {found.start()}: "
            "no UTF-8 text has one (a pair of them read from JSON or UTF-16 is one character; "
            "decode it first)"
        )


def _check_strings(value: Any, what: str, path: str) -> None:
    """``_check_text`` on every key and string of a JSON value, naming where it is."""
    if isinstance(value, str):
        _check_text(value, f"{what} at {path}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{what}'s key {key!r} at {path}")
            _check_strings(item, what, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_strings(item, what, f"{path}/{index}")


@dataclass(frozen=True, eq=False)
class JsonSchema:
    """Output must be a JSON instance valid under `schema` (draft 2020-12).

    `schema` may also be a pydantic model class; its `model_json_schema()` is used. The schema is
    copied, so later edits of the caller's dict do not change this constraint.

    `strict` (the default) generates objects with their declared properties only: an object schema
    with `properties` and no `additionalProperties` is treated as closed (an object combined with
    others, by `allOf` or `properties` beside `anyOf`/`oneOf`/`$ref`, is closed to the keys any
    part declares, and the parts stay open). Every output is still valid under the original
    schema; `strict=False` lets the grammar produce any valid instance.
    """

    schema: dict[str, Any] | bool
    strict: bool = True
    _text: str = field(init=False, repr=False)

    if TYPE_CHECKING:  # what it takes, for type checkers: ``schema`` holds the dict made of it

        def __init__(
            self, schema: dict[str, Any] | bool | type[Any], strict: bool = True
        ) -> None: ...

    def __post_init__(self) -> None:
        if not isinstance(self.strict, bool):  # ("no" was strict, 0 open)
            raise ConstraintError(f"JsonSchema's strict must be True or False, got {self.strict!r}")
        schema = _schema_dict(self.schema)
        try:
            # Not sort_keys: llguidance emits properties in schema order and resolves applicators
            # left to right, so key order changes the grammar and must be part of the cache key.
            text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except RecursionError:
            raise ConstraintError(
                "json_schema is nested too deeply to serialise (Python's recursion limit)"
            ) from None
        except (TypeError, ValueError) as e:
            raise ConstraintError(f"json_schema is not JSON-serialisable: {e}") from e
        if _SURROGATE.search(text):
            _check_strings(json.loads(text), "json_schema", "#")
        object.__setattr__(self, "schema", json.loads(text))
        object.__setattr__(self, "_text", text)

    def schema_copy(self) -> dict[str, Any] | bool:
        """A new copy of the schema (read back from its JSON text: no recursion in Python, so a
        schema as deep as the constraint holds copies too)."""
        return json.loads(self._text)

    @classmethod
    def from_pydantic(cls, model: type[Any], strict: bool = True) -> JsonSchema:
        """The schema of a pydantic model class (`model.model_json_schema()`)."""
        schema = getattr(model, "model_json_schema", None)  # (an instance's too)
        return cls(schema() if callable(schema) else model, strict)

    @property
    def key(self) -> tuple[str, ...]:
        """Stable hashable cache key."""
        return ("json_schema", "strict" if self.strict else "open", self._text)

    def to_llguidance(self) -> str:
        """llguidance grammar text (compact JSON; see `json_schema.py` for the policy)."""
        return json_schema_to_llguidance(self.schema, self.strict)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonSchema) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


@dataclass(frozen=True)
class JsonObject:
    """JSON mode: output must be a JSON object (any keys, any values)."""

    @property
    def key(self) -> tuple[str, ...]:
        """Stable hashable cache key."""
        return ("json_object",)

    def to_llguidance(self) -> str:
        """llguidance grammar text."""
        return json_schema_to_llguidance({"type": "object"})


@dataclass(frozen=True)
class Regex:
    """Output must fully match `pattern` (Rust `regex` syntax, implicitly anchored at both ends)."""

    pattern: str

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise ConstraintError(f"regex must be a str, got {type(self.pattern).__name__}")
        _check_text(self.pattern, "regex")

    @property
    def key(self) -> tuple[str, ...]:
        """Stable hashable cache key."""
        return ("regex", self.pattern)

    def to_llguidance(self) -> str:
        """llguidance grammar text."""
        return LLMatcher.grammar_from_regex(self.pattern)


@dataclass(frozen=True)
class Choice:
    """Output must be exactly one of `options`."""

    # Any sequence of strings (a list, as SamplingParams' choice takes); kept as a tuple.
    options: Sequence[str]

    def __post_init__(self) -> None:
        options = self.options
        if isinstance(options, str) or not isinstance(options, Sequence):
            raise ConstraintError("choice must be a sequence of strings")
        options = tuple(options)
        if not options:
            raise ConstraintError("choice needs at least one option")
        bad = [o for o in options if not isinstance(o, str)]
        if bad:
            raise ConstraintError(f"choice options must be strings, got {bad[0]!r}")
        for index, option in enumerate(options):
            _check_text(option, f"choice option {index}")
        object.__setattr__(self, "options", options)

    @property
    def key(self) -> tuple[str, ...]:
        """Stable hashable cache key."""
        return ("choice", *self.options)

    def to_llguidance(self) -> str:
        """llguidance grammar text."""
        lark = "start: " + " | ".join(lark_literal(o) for o in self.options)
        return LLMatcher.grammar_from_lark(lark)


@dataclass(frozen=True)
class Grammar:
    """Output must match a context-free grammar written in Lark (llguidance dialect) or GBNF.

    GBNF (llama.cpp) grammars keep llama.cpp's character-level semantics: every rule becomes a
    Lark rule and every string a run of one-character strings, so no greedy lexeme can swallow
    text a later rule or string needs.
    """

    text: str
    syntax: GrammarSyntax = "lark"

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise ConstraintError(f"grammar must be a str, got {type(self.text).__name__}")
        _check_text(self.text, "grammar")
        if self.syntax not in GRAMMAR_SYNTAXES:
            raise ConstraintError(
                f"grammar_syntax must be one of {', '.join(GRAMMAR_SYNTAXES)}, got {self.syntax!r}"
            )

    @property
    def key(self) -> tuple[str, ...]:
        """Stable hashable cache key."""
        return ("grammar", self.syntax, self.text)

    @property
    def llguidance_options(self) -> dict[str, Any]:
        """The options of a Lark grammar's ``%llguidance {...}`` line (none for GBNF, or where
        they do not parse: the grammar then fails to compile)."""
        found = _LLGUIDANCE_OPTIONS.search(self.text) if self.syntax == "lark" else None
        if found is None:
            return {}
        try:
            options, _ = json.JSONDecoder().raw_decode(self.text, found.end())
        except ValueError:
            return {}
        return options if isinstance(options, dict) else {}

    def to_llguidance(self) -> str:
        """llguidance grammar text; a GBNF syntax error raises ConstraintError with line and column.

        A Lark grammar's ``%json`` embeds are enforced as ``json_schema`` constraints are
        (``enforce_json_embeds``), in the whitespace their own options ask for."""
        lark = gbnf_to_lark(self.text) if self.syntax == "gbnf" else enforce_json_embeds(self.text)
        return LLMatcher.grammar_from_lark(lark)


_LLGUIDANCE_OPTIONS = re.compile(r"^[ \t]*%llguidance\b[ \t]*", re.MULTILINE)
_OUTPUT_TYPES = (JsonSchema, JsonObject, Regex, Choice, Grammar)


@dataclass(frozen=True)
class AfterThinking:
    """A reasoning model's thinking block, then output under ``constraint``: free text to the
    first ``</think>`` and up to two newlines (``brisklm.constrained.thinking``), where
    ``opened``, the prompt has opened the block (the reply begins inside it and closes it),
    else the reply may open one or go straight to ``constraint``'s output. A chat reply takes a
    caller's constraint so (``LLM.chat_decoding``), as vLLM applies guided decoding after the
    reasoning."""

    constraint: JsonSchema | JsonObject | Regex | Choice | Grammar
    opened: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.constraint, _OUTPUT_TYPES):
            raise ConstraintError(
                "AfterThinking's constraint must be a JsonSchema, JsonObject, Regex, Choice or "
                f"Grammar, got {type(self.constraint).__name__}"
            )
        if not isinstance(self.opened, bool):
            raise ConstraintError(f"opened must be a bool, got {type(self.opened).__name__}")

    @property
    def key(self) -> tuple[str, ...]:
        """Stable hashable cache key."""
        return ("after_thinking", "opened" if self.opened else "may_open", *self.constraint.key)

    def to_llguidance(self) -> str:
        """llguidance grammar text: a Lark grammar of the block whose ``reply`` refers to the
        constraint's own grammar (``@reply``), so that it applies as it would alone."""
        inner = self.constraint.to_llguidance()
        if inner.lstrip().startswith("{"):  # a TopLevelGrammar's JSON (regex, JSON schema)
            grammars = json.loads(inner)["grammars"]
        else:  # Lark text (choice, grammar)
            grammars = [{"lark_grammar": inner}]
        # (a reference by index would shift; none of ours have more than one)
        assert len(grammars) == 1, "a constraint of several grammars"
        lark = "\n".join([*thinking_rules(self.opened), "reply: @reply"]) + "\n"
        return json.dumps({"grammars": [{"lark_grammar": lark}, {**grammars[0], "name": "reply"}]})


Constraint = JsonSchema | JsonObject | Regex | Choice | Grammar | AfterThinking
CONSTRAINT_TYPES = (*_OUTPUT_TYPES, AfterThinking)


def constraint_from_options(
    json_schema: dict[str, Any] | bool | type | None = None,
    json_object: bool = False,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | None = None,
    grammar_syntax: str = "lark",
) -> Constraint | None:
    """The single constraint the options ask for, or None; raises ValueError if more than one is set."""
    if grammar_syntax not in GRAMMAR_SYNTAXES:
        raise ValueError(
            f"grammar_syntax must be one of {', '.join(GRAMMAR_SYNTAXES)}, got {grammar_syntax!r}"
        )
    if grammar is None and grammar_syntax != "lark":
        raise ValueError(
            f"grammar_syntax={grammar_syntax!r} without grammar: grammar_syntax names the syntax "
            "of the grammar= text, so pass grammar= with it"
        )
    chosen = {
        "json_schema": json_schema is not None,
        "json_object": bool(json_object),
        "regex": regex is not None,
        "choice": choice is not None,
        "grammar": grammar is not None,
    }
    names = [name for name, is_set in chosen.items() if is_set]
    if len(names) > 1:
        raise ValueError(f"at most one constraint may be set, got {', '.join(names)}")
    if json_schema is not None:
        return JsonSchema(json_schema)
    if json_object:
        return JsonObject()
    if regex is not None:
        return Regex(regex)
    if choice is not None:
        if isinstance(choice, str) or not isinstance(choice, list | tuple):
            # A str would become one option per character, a set an arbitrary order.
            raise ConstraintError(
                f"choice must be a list or tuple of strings, got {type(choice).__name__}"
            )
        return Choice(tuple(choice))
    if grammar is not None:
        return Grammar(grammar, grammar_syntax)  # type: ignore[arg-type]
    return None
