"""GrammarCompiler: constraint -> validated CompiledGrammar for one tokenizer, LRU-cached."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llguidance import LLExecutor, LLMatcher

from brisklm.constrained.errors import LARK_POSITION, ConstraintError, first_paragraph, lark_error
from brisklm.constrained.json_schema import schema_path_of, states_keyword
from brisklm.constrained.spec import (
    CONSTRAINT_TYPES,
    AfterThinking,
    Constraint,
    Grammar,
    JsonObject,
    JsonSchema,
    Regex,
)
from brisklm.constrained.tokenizer_bridge import (
    TokenizerLike,
    llg_tokenizer_for,
    usable_eos_token_ids,
)

if TYPE_CHECKING:
    from brisklm.constrained.matcher import GrammarMatcher

_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*?)\]")
_REMOTE_REF = re.compile(r"Resource '([^']*)' is not present in a registry")
# The regex-syntax caret line under the pattern ("    a(" / "     ^") gives the column.
_REGEX_CARET = re.compile(r"regex parse error:\n {4}(?P<pattern>.*)\n {4}(?P<caret> *)\^")

# llguidance's error when computing forced tokens runs past its item limit.
_ENDLESS_FORCED = "ff_tokens"


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A validated grammar bound to one tokenizer; `matcher()` makes per-request state cheaply."""

    constraint: Constraint
    grammar: str  # llguidance grammar text
    vocab_size: int  # tokenizer vocabulary; bitmasks have ceil(vocab_size / 32) int32 words
    eos_token_ids: tuple[int, ...]
    warnings: tuple[str, ...]
    _prototype: LLMatcher = field(repr=False)
    _executor: LLExecutor = field(repr=False)

    @property
    def bitmask_width(self) -> int:
        """int32 words per bitmask row."""
        return (self.vocab_size + 31) // 32

    def matcher(self) -> GrammarMatcher:
        """A fresh per-request matcher at the start of the grammar."""
        from brisklm.constrained.matcher import GrammarMatcher

        return GrammarMatcher(self)


# Formats llguidance enforces (date, time, date-time and hostname through brisklm's exact patterns).
ENFORCED_FORMATS = (
    "date",
    "time",
    "date-time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uuid",
)
# What to do instead, for keywords Pydantic writes.
_KEYWORD_HINTS = {"uniqueItems": " (Pydantic writes it for a set field: type the field as a list)"}


def _json_schema_error(message: str, schema: Any = None) -> ConstraintError:
    """llguidance's refusal of a JSON schema in our words; with ``schema``, the place named."""
    unimplemented = _UNIMPLEMENTED.search(message)
    if unimplemented:
        keywords = [k.strip() for k in unimplemented.group(1).replace('"', "").split(",")]
        where = schema_path_of(schema, lambda node: any(states_keyword(node, k) for k in keywords))
        hints = "".join(_KEYWORD_HINTS.get(k, "") for k in keywords)
        return ConstraintError(
            f"JSON schema keyword(s) cannot be enforced: {', '.join(keywords)}"
            f"{f' (at {where})' if where else ''}{hints}"
        )
    if message.startswith("oneOf constraints are not supported"):
        return ConstraintError(
            "JSON schema keyword oneOf cannot be enforced: its branches are not provably disjoint"
        )
    if message.startswith("Unknown format"):
        fmt = message.removeprefix("Unknown format:").strip()
        where = schema_path_of(schema, lambda node: node.get("format") == fmt)
        return ConstraintError(
            f"JSON schema format {fmt!r}{f' at {where}' if where else ''} cannot be enforced; "
            f"the formats enforced are {', '.join(ENFORCED_FORMATS)} (leave the format out, or "
            "give a pattern)"
        )
    remote = _REMOTE_REF.search(message)
    if remote and "does not fetch" in message:
        return ConstraintError(
            f"the JSON schema's $ref {remote.group(1)!r} is not in the schema, and brisklm does "
            "not fetch schemas: put the schema it names in $defs and refer to it as "
            "'#/$defs/NAME'"
        )
    if message.startswith("Value for 'multipleOf' has too many digits"):
        digits = message.rsplit(":", 1)[-1].strip().lstrip("0")
        found: list[float] = []

        def too_long(node: dict[str, Any]) -> bool:  # the multipleOf of these digits
            value = node.get("multipleOf")
            if isinstance(value, int | float) and _digits(value) == digits:
                found.append(value)
            return bool(found)

        where = schema_path_of(schema, too_long)
        return ConstraintError(
            f"multipleOf{f' {found[0]!r}' if found else ''}"
            f"{f' at {where}' if where else ''} has more significant digits than llguidance "
            "handles; use a value of fewer digits"
        )
    if message.startswith("regex parse error:"):
        # "regex parse error:\n    PATTERN\n    ^^^\nerror: REASON": the CLI shows one line. Not
        # the pattern or a column: llguidance quotes its rewriting (\d as [0-9]).
        return ConstraintError(
            f"invalid or unsupported JSON schema: a pattern cannot be read as a regex: "
            f"{_regex_reason(message)}"
        )
    return ConstraintError(f"invalid or unsupported JSON schema: {message}")


def _digits(value: float) -> str:
    """A number's significant digits as llguidance quotes them (no sign, point or leading 0)."""
    return re.sub(r"\D", "", repr(value).split("e")[0]).lstrip("0")


def _regex_reason(message: str, start: int = 0) -> str:
    """The reason line ("error: ...") of a regex parse error at or after ``start``."""
    reasons = [ln for ln in message[start:].splitlines() if ln.startswith("error:")]
    return reasons[0].removeprefix("error:").strip() if reasons else message


def check_json_schema(schema: Any, strict: bool = True) -> None:
    """ConstraintError unless ``json_schema=schema`` (a dict, bool or pydantic class) can be
    enforced, as a request would find; needs no tokenizer, so a schema can be checked where it is
    given (LangChain's with_structured_output) rather than at the first call."""
    constraint = JsonSchema(schema, strict=strict)
    check_json_schema_grammar(constraint.to_llguidance(), constraint.schema)


def check_json_schema_grammar(grammar: str, schema: Any = None) -> None:
    """ConstraintError, worded as for a JSON schema, when llguidance cannot enforce a grammar
    made from one (``LLMatcher.grammar_from_json_schema``); needs no tokenizer, so a schema is
    checked where it is given (a tool's parameters) rather than when a request compiles it."""
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise _json_schema_error(first_paragraph(error), schema)


def _constraint_name(constraint: Constraint) -> str:
    if isinstance(constraint, AfterThinking):
        constraint = constraint.constraint
    if isinstance(constraint, (JsonSchema, JsonObject)):
        return "JSON schema"
    if isinstance(constraint, Regex):
        return "regex"
    if isinstance(constraint, Grammar):
        return "Lark grammar" if constraint.syntax == "lark" else "GBNF grammar"
    return "choice"


def vocabulary_note(usable_tokens: int | None, vocab_size: int) -> str:
    """For a constraint that matches nothing, or stops, with a model whose embedding is smaller
    than its tokenizer: text only the ids past the embedding spell cannot be generated."""
    if usable_tokens is None or usable_tokens >= vocab_size:
        return ""
    return (
        f"; or its text needs tokens past the model's vocabulary (the embedding has "
        f"{usable_tokens} of the tokenizer's {vocab_size} ids)"
    )


def _check_first_step(constraint: Constraint, prototype: LLMatcher, note: str = "") -> None:
    """Compute the first token mask once (on a copy), so a constraint that can never produce
    output fails here, before any request is queued, instead of mid-generation: an empty language
    (a regex nothing matches, a rule with no base case) or a grammar past llguidance's limits."""
    probe = prototype.deep_copy()
    forced = probe.compute_ff_tokens()  # what the engine asks first (forced tokens), then the mask
    if forced and not probe.is_error():
        # A rule that only refers to itself through text (`start: "a" start`) forces that text
        # without end, and a long fixed repetition forces more than llguidance's item limit: it
        # returns that limit's worth of tokens, and the next step fails. Both fail at submit.
        probe.consume_tokens(forced)
        probe.compute_ff_tokens()
        if probe.is_error() and _ENDLESS_FORCED in probe.get_error():
            raise ConstraintError(
                f"the {_constraint_name(constraint)} cannot be enforced: it forces "
                f"{len(forced)} tokens and more before its output may end, past llguidance's "
                'limits (a rule that only refers to itself, like start: "a" start, never ends)'
            )
    probe.compute_bitmask()
    error = first_paragraph(probe.get_error()) if probe.is_error() else None
    if error == "NoExtensionBias" or (
        error is None and probe.is_stopped() and not probe.is_accepting()
    ):
        raise ConstraintError(
            f"the {_constraint_name(constraint)} matches no output at all (its language is "
            f"empty): check for a rule that only refers to itself or a pattern nothing matches"
            f"{note}"
        )
    if error is not None:
        raise ConstraintError(
            f"the {_constraint_name(constraint)} cannot be enforced: llguidance stopped with "
            f"{error!r}; a grammar or regex this large or ambiguous exceeds its limits "
            "(simplify it, e.g. avoid very long repetitions or single-byte lexemes)"
        )


def _compile_error(constraint: Constraint, message: str) -> ConstraintError:
    message = first_paragraph(message)
    if isinstance(constraint, AfterThinking):  # (its own constraint compiled first: unexpected)
        return ConstraintError(f"the thinking block's grammar failed to compile: {message}")
    if isinstance(constraint, JsonSchema):
        return _json_schema_error(message, constraint.schema)
    if isinstance(constraint, JsonObject):
        return _json_schema_error(message)
    if isinstance(constraint, Regex):
        caret = _REGEX_CARET.search(message)
        if caret:
            column = len(caret.group("caret")) + 1
            error = _regex_reason(message, caret.end())
            return ConstraintError(
                f"invalid regex at line 1, column {column}: {error}", line=1, column=column
            )
        # Other errors are located in the grammar that wraps the pattern (`start: /.../`), not in
        # the pattern: drop that position and the wrapper's source lines.
        first_line = LARK_POSITION.sub("", message.splitlines()[0] if message else message)
        return ConstraintError(f"invalid regex: {first_line}")
    if isinstance(constraint, Grammar):
        what = (
            "invalid Lark grammar"
            if constraint.syntax == "lark"
            else ("invalid grammar (in the Lark translation of the GBNF grammar)")
        )
        return lark_error(message, what)
    return ConstraintError(f"invalid choice: {message}")


DEFAULT_GRAMMAR_CACHE_SIZE = 256  # compiled grammars kept (GrammarCompiler, the engine's option)


class GrammarCompiler:
    """Compiles constraints for one tokenizer; one compiler per tokenizer, shared by all requests.

    `compile` is thread-safe. Compiled grammars are kept in an LRU cache of `max_cache_size`
    entries keyed by the constraint's key, so the same schema compiles once. `usable_tokens`: the
    model's share of the vocabulary when its embedding is smaller than the tokenizer (see
    `llg_tokenizer_for`); grammars then neither allow nor force the ids past it.
    """

    def __init__(
        self,
        tokenizer: TokenizerLike,
        *,
        max_cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE,
        num_threads: int | None = None,
        usable_tokens: int | None = None,
    ) -> None:
        if max_cache_size < 1:
            raise ValueError(f"max_cache_size must be >= 1, got {max_cache_size}")
        self.tokenizer = tokenizer
        self.usable_tokens = usable_tokens
        self.llg_tokenizer = llg_tokenizer_for(tokenizer, usable_tokens)
        self.vocab_size: int = self.llg_tokenizer.vocab_size
        self.eos_token_ids: tuple[int, ...] = usable_eos_token_ids(tokenizer, usable_tokens)
        self.max_cache_size = max_cache_size
        # Thread pool for fill_bitmasks; None = llguidance's default (80% of CPUs, at most 32).
        self._executor = LLExecutor(num_threads)
        self._cache: OrderedDict[tuple[str, ...], CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def num_cached(self) -> int:
        """Number of compiled grammars in the cache."""
        return len(self._cache)

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar for `constraint`; raises ConstraintError if it cannot be enforced."""
        if not isinstance(constraint, CONSTRAINT_TYPES):
            raise TypeError(f"not a constraint: {type(constraint).__name__}")
        key = constraint.key
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        compiled = self._compile(constraint)  # outside the lock: can take 100s of ms, drops the GIL
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:  # another thread won the race; keep one object per key
                return cached
            self._cache[key] = compiled
            while len(self._cache) > self.max_cache_size:
                self._cache.popitem(last=False)
        return compiled

    def forget(self, constraint: Constraint) -> None:
        """Drop ``constraint``'s compiled grammar from the cache, so that it compiles afresh: a
        matcher that failed inside llguidance (a panic) can leave the state its copies share
        poisoned, and every later matcher of that grammar would fail at once."""
        with self._lock:
            self._cache.pop(constraint.key, None)

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        if isinstance(constraint, AfterThinking):
            # Its own constraint first: its errors are named as they are alone, and its first
            # step checked. It stays cached (LLM.chat_decoding asks for it too), so a wrapped
            # constraint takes two of the cache's entries.
            self.compile(constraint.constraint)
        grammar = constraint.to_llguidance()
        # Building the matcher validates the grammar against this tokenizer; it never raises.
        prototype = LLMatcher(self.llg_tokenizer, grammar, log_level=0)
        if prototype.is_error():
            raise _compile_error(constraint, prototype.get_error())
        _check_first_step(
            constraint, prototype, vocabulary_note(self.usable_tokens, self.vocab_size)
        )
        return CompiledGrammar(
            constraint=constraint,
            grammar=grammar,
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_token_ids,
            warnings=tuple(prototype.get_grammar_warnings()),
            _prototype=prototype,
            _executor=self._executor,
        )
