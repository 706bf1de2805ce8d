"""SamplingParams: the per-request decoding settings, validated and normalised at construction."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import Any

from brisklm.constrained.spec import (
    CONSTRAINT_TYPES,
    Constraint,
    JsonSchema,
    constraint_from_options,
)
from brisklm.safe_repr import safe_repr

MAX_LOGPROBS = 20
MAX_ABS_LOGIT_BIAS = 100.0
MAX_ABS_OPENAI_PENALTY = 2.0
# torch.Generator.manual_seed accepts exactly this range, and takes a seed mod 2**64: a negative
# seed s and s + 2**64 draw alike (-1 as 2**64 - 1).
MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1
MAX_N = 128  # completions a prompt may ask for (OpenAI's limit)


def _fail(name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"SamplingParams.{name}={safe_repr(value)} is invalid: must be {allowed}")


def _as_int(name: str, value: Any, allowed: str) -> int:
    # bool is an Integral too, but True as a token count is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise _fail(name, value, allowed)
    return int(value)


def _as_float(name: str, value: Any, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _fail(name, value, allowed)
    try:
        value = float(value)
    except OverflowError:  # an int or fraction past float's range
        raise _fail(name, value, allowed) from None
    if not math.isfinite(value):
        raise _fail(name, value, allowed)
    return value


def _as_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, value, "a bool")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """How to turn one request's logits into tokens, and when to stop.

    Construction validates every field and raises ``ValueError`` naming the field, the value and the
    allowed range. Inputs are normalised so the instance is immutable and hashable: ``stop`` becomes a
    tuple of str, ``stop_token_ids`` a tuple of int, and ``logit_bias`` a tuple of ``(token_id, bias)``
    pairs sorted by id (empty when there is none); :meth:`logit_bias_dict` gives it back as a dict.

    Semantics:
    - ``temperature`` 0 is greedy (argmax, no randomness); otherwise logits are divided by it.
    - ``top_k`` 0 and ``top_p`` 1 and ``min_p`` 0 disable those filters.
    - ``repetition_penalty`` follows transformers: over prompt and output tokens, positive logits are
      divided by it and negative ones multiplied. ``presence_penalty`` / ``frequency_penalty`` follow
      OpenAI: over output tokens, ``logit -= frequency * count + presence * (count > 0)``.
    - ``min_tokens``: eos and ``stop_token_ids`` cannot be sampled before that many output tokens,
      and a stop string counts only when it completes at or after the ``min_tokens``-th token
      (vLLM's rule); text before then that contains one is ordinary output.
    - ``reply_calls``: stop strings do not apply inside tool calls (OpenAI's rule): a stop string
      counts only where it ends before the reply's first call begins (calls in a thinking block
      do not count). ``LLM.chat``, the server and ChatBrisk set it when tools are offered.
    - ``logprobs`` None returns no logprobs; N >= 0 returns the chosen token's plus the top N.
    - ``prompt_logprobs`` None returns none for the prompt; N >= 0 returns each prompt token's
      logprob given the tokens before it (the first token's entry is None) plus the top N, from
      the raw model logits. Such a request computes its whole prompt: it reuses no cached prefix.
    - ``n``: completions of the prompt (``LLM.generate`` returns the first, with all of them in
      its ``choices``). Each is a request of its own (``per_choice``): with a ``seed``, choice i
      samples with seed + i, so each is reproducible alone. With prefix caching the native CPU
      pass computes the prompt's keys once for them all (a prompt of 16 tokens or more);
      elsewhere prefixes are reused in whole prefill chunks only.
    - ``thinking_token_budget`` (vLLM's name): a reasoning model's thinking block (``<think>``,
      opened by the prompt or by the reply) holds at most so many tokens; then the engine forces
      its closing tag (``"\\n</think>\\n\\n"``, as chat templates lay the block out) and the
      reply goes on to its answer or tool calls. A block the model closes itself is left alone,
      and a reply that opens none is not touched. Where the budget's last token ends inside a
      UTF-8 character, the block runs to the token that completes it (at most 8 more). Tokens of
      the block and the forced tag count against ``max_tokens``. A constraint must come after
      the thinking (``AfterThinking``, or the tools' and ``response_format``'s grammars, which
      ``LLM.chat`` builds so): one that takes the reply from its first token is refused after a
      block the prompt opened, and elsewhere leaves the budget unapplied (a block would be its
      own text; logged where it may write one). A chat reply whose template knows no thinking
      ignores the budget.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Normalised in __post_init__ to tuple[tuple[int, float], ...] sorted by token id.
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] | None = None
    seed: int | None = None
    stop: str | Sequence[str] | None = ()  # normalised to tuple[str, ...]
    stop_token_ids: int | Sequence[int] | None = ()  # normalised to tuple[int, ...]
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False  # stop strings only: a stop token's text never is
    # Constrained decoding: at most one of these. The output is guaranteed to match it (unless the
    # request ends early on max_tokens, reported as finish_reason "length").
    json_schema: Any = field(default=None, compare=False)  # dict, bool or pydantic model class
    json_object: bool = False  # JSON mode: any JSON object
    regex: str | None = None
    choice: Sequence[str] | None = None  # normalised to tuple[str, ...]
    grammar: str | None = None
    grammar_syntax: str = "lark"  # "lark" or "gbnf"
    # The resolved constraint (derived from the fields above, or given directly).
    constraint: Constraint | None = None
    n: int = 1  # completions of the prompt (before it: positional construction keeps its order)
    # How a chat reply with tools offered holds its calls (LLM.chat and the server set it): stop
    # strings apply only to the text before the reply's first tool call.
    reply_calls: Any = None  # brisklm.tool_formats.ReplyCalls
    # A reasoning model's thinking block: at most so many tokens, then its closing tag is forced.
    thinking_token_budget: int | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        max_tokens = _as_int("max_tokens", self.max_tokens, "an int >= 1")
        if max_tokens < 1:
            raise _fail("max_tokens", max_tokens, "an int >= 1")
        put("max_tokens", max_tokens)

        min_tokens = _as_int(
            "min_tokens", self.min_tokens, f"an int in [0, max_tokens={safe_repr(max_tokens)}]"
        )
        if not 0 <= min_tokens <= max_tokens:
            raise _fail(
                "min_tokens", min_tokens, f"an int in [0, max_tokens={safe_repr(max_tokens)}]"
            )
        put("min_tokens", min_tokens)

        temperature = _as_float("temperature", self.temperature, "a finite float >= 0 (0 = greedy)")
        if temperature < 0:
            raise _fail("temperature", temperature, "a finite float >= 0 (0 = greedy)")
        put("temperature", temperature)

        top_k = _as_int("top_k", self.top_k, "an int >= 0 (0 = disabled)")
        if top_k < 0:
            raise _fail("top_k", top_k, "an int >= 0 (0 = disabled)")
        put("top_k", top_k)

        top_p = _as_float("top_p", self.top_p, "a float in (0, 1] (1 = disabled)")
        if not 0.0 < top_p <= 1.0:
            raise _fail("top_p", top_p, "a float in (0, 1] (1 = disabled)")
        put("top_p", top_p)

        min_p = _as_float("min_p", self.min_p, "a float in [0, 1] (0 = disabled)")
        if not 0.0 <= min_p <= 1.0:
            raise _fail("min_p", min_p, "a float in [0, 1] (0 = disabled)")
        put("min_p", min_p)

        rep = _as_float(
            "repetition_penalty", self.repetition_penalty, "a finite float > 0 (1 = off)"
        )
        if rep <= 0:
            raise _fail("repetition_penalty", rep, "a finite float > 0 (1 = off)")
        put("repetition_penalty", rep)

        for name in ("presence_penalty", "frequency_penalty"):
            allowed = f"a float in [-{MAX_ABS_OPENAI_PENALTY}, {MAX_ABS_OPENAI_PENALTY}]"
            value = _as_float(name, getattr(self, name), allowed)
            if abs(value) > MAX_ABS_OPENAI_PENALTY:
                raise _fail(name, value, allowed)
            put(name, value)

        put("logit_bias", _normalise_logit_bias(self.logit_bias))

        _as_bool("json_object", self.json_object)
        from_fields = constraint_from_options(
            json_schema=self.json_schema,
            json_object=self.json_object,
            regex=self.regex,
            choice=self.choice,
            grammar=self.grammar,
            grammar_syntax=self.grammar_syntax,
        )
        # Both set and alike: a copy of params made from an option (dataclasses.replace passes
        # every field, the constraint resolved from the option too).
        if from_fields is not None and self.constraint not in (None, from_fields):
            raise ValueError(
                "pass either constraint= or one of json_schema/json_object/regex/choice/grammar "
                "(to change the constraint of a SamplingParams, use its with_changes())"
            )
        if self.choice is not None:
            put("choice", tuple(self.choice))
        if isinstance(self.json_schema, dict) and isinstance(from_fields, JsonSchema):
            # The constraint's copy: with_changes makes a copy's constraint from this field, and
            # later edits of the caller's dict must change neither.
            put("json_schema", from_fields.schema_copy())
        if from_fields is None and self.constraint is not None:
            if not isinstance(self.constraint, CONSTRAINT_TYPES):
                raise _fail(
                    "constraint",
                    self.constraint,
                    "None or a constraint object (JsonSchema, JsonObject, Regex, Choice, Grammar, "
                    "AfterThinking); "
                    "for options use json_schema=, json_object=, regex=, choice= or grammar=",
                )
        put("constraint", from_fields if from_fields is not None else self.constraint)
        if self.constraint is not None and min_tokens > 0:
            raise _fail(
                "min_tokens",
                min_tokens,
                "0 when the output is constrained (the grammar decides when it ends)",
            )

        if self.seed is not None:
            seed = _as_int("seed", self.seed, f"None or an int in [{MIN_SEED}, {MAX_SEED}]")
            if not MIN_SEED <= seed <= MAX_SEED:
                raise _fail("seed", seed, f"None or an int in [{MIN_SEED}, {MAX_SEED}]")
            put("seed", seed)

        put("stop", _normalise_stop(self.stop))
        put("stop_token_ids", _normalise_stop_token_ids(self.stop_token_ids))

        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                allowed = f"None or an int in [0, {MAX_LOGPROBS}]"
                count = _as_int(name, value, allowed)
                if not 0 <= count <= MAX_LOGPROBS:
                    raise _fail(name, count, allowed)
                put(name, count)

        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            _as_bool(name, getattr(self, name))

        n = _as_int("n", self.n, f"an int in [1, {MAX_N}]")
        if not 1 <= n <= MAX_N:
            raise _fail("n", n, f"an int in [1, {MAX_N}]")
        put("n", n)

        if self.thinking_token_budget is not None:
            allowed = "None or an int >= 0 (tokens of a thinking block)"
            budget = _as_int("thinking_token_budget", self.thinking_token_budget, allowed)
            if budget < 0:
                raise _fail("thinking_token_budget", budget, allowed)
            put("thinking_token_budget", budget)

        if self.reply_calls is not None:
            from brisklm.tool_formats import ReplyCalls  # (imports llguidance)

            if not isinstance(self.reply_calls, ReplyCalls):
                raise _fail(
                    "reply_calls",
                    self.reply_calls,
                    "None or a brisklm.tool_formats.ReplyCalls "
                    "(LLM.tool_call_format().decoding_options(...))",
                )

    def with_changes(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` applied, validated like a new instance. The constraint carries
        over (with the options it came from: ``grammar_syntax=`` alone re-reads the grammar),
        unless ``changes`` give one of their own (``constraint=``, or a constraint option set)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        replaced = "constraint" in changes or any(
            name in changes and changes[name] != unset
            for name, unset in _NO_CONSTRAINT_OPTIONS.items()
            if name != "grammar_syntax"
        )
        if replaced:
            values.update(_NO_CONSTRAINT_OPTIONS)
            values["constraint"] = None
        elif any(values[name] != unset for name, unset in _NO_CONSTRAINT_OPTIONS.items()):
            values["constraint"] = None  # made from the options: made from them again
        values.update(changes)
        if values["grammar"] is None and "grammar_syntax" not in changes:
            values["grammar_syntax"] = "lark"  # with_changes(grammar=None) on a GBNF grammar
        return SamplingParams(**values)

    def per_choice(self) -> list[SamplingParams]:
        """The params of each of the ``n`` completions, one request each (``n`` 1): with a seed,
        choice i draws with seed + i (wrapping past the largest seed), so the choices differ and
        each is reproducible alone; unseeded ones draw in turn from the default generator; greedy
        ones are alike."""
        if self.n == 1:
            return [self]
        one = self.with_changes(n=1)
        if self.seed is None:
            return [one] * self.n
        return [one.with_changes(seed=_wrapped_seed(self.seed + i)) for i in range(self.n)]

    @classmethod
    def greedy(cls, **kwargs: Any) -> SamplingParams:
        """Greedy decoding (temperature 0) with any other fields given as keywords."""
        return cls(temperature=0.0, **kwargs)

    @property
    def is_greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def is_seeded(self) -> bool:
        """True for a sampled request with a seed: its tokens must not depend on its batch."""
        return self.seed is not None and not self.is_greedy

    def picks_raw_argmax(self, num_output_tokens: int) -> bool:
        """Whether the next token, after ``num_output_tokens`` outputs, is the argmax of the raw
        logits: greedy, no logit bias or penalty, ``min_tokens`` reached (a grammar's mask is the
        caller's to rule out)."""
        return (
            self.temperature == 0.0
            and not self.logit_bias
            and not self.uses_penalties
            and num_output_tokens >= self.min_tokens
        )

    @property
    def uses_penalties(self) -> bool:
        """True when any of repetition / presence / frequency penalty is active."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    def logit_bias_dict(self) -> dict[int, float]:
        """The logit bias as a fresh ``{token_id: bias}`` dict (empty when there is none)."""
        return dict(self.logit_bias)

    def validate_for_vocab(self, vocab_size: int, eos_token_ids: Iterable[int] = ()) -> None:
        """Raise ``ValueError`` when a token id in ``logit_bias`` or ``stop_token_ids`` is outside
        ``[0, vocab_size)``, or when ``min_tokens`` leaves no token to sample (``stop_token_ids``
        and, unless ``ignore_eos``, ``eos_token_ids`` cover the vocabulary). Call when a request is
        admitted: the model's vocab is not known here."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} is invalid: must be an int >= 1")
        for token_id, _ in self.logit_bias:
            if token_id >= vocab_size:
                raise _fail("logit_bias", token_id, f"token ids in [0, vocab_size={vocab_size})")
        for token_id in self.stop_token_ids:
            if token_id >= vocab_size:
                raise _fail(
                    "stop_token_ids", token_id, f"token ids in [0, vocab_size={vocab_size})"
                )
        if self.min_tokens > 0:
            held_off = set(self.stop_token_ids)
            if not self.ignore_eos:
                held_off.update(t for t in eos_token_ids if 0 <= t < vocab_size)
            if len(held_off) >= vocab_size:
                raise _fail(
                    "min_tokens",
                    self.min_tokens,
                    f"0 when stop_token_ids{'' if self.ignore_eos else ' and the eos tokens'} "
                    f"cover all {vocab_size} tokens (none would be left to sample)",
                )


# The constraint options unset: what with_changes passes so a resolved constraint is not given twice.
_NO_CONSTRAINT_OPTIONS: dict[str, Any] = {
    "json_schema": None,
    "json_object": False,
    "regex": None,
    "choice": None,
    "grammar": None,
    "grammar_syntax": "lark",
}


def _wrapped_seed(seed: int) -> int:
    return seed - 2**64 if seed > MAX_SEED else seed


def _normalise_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    allowed = (
        f"None or a mapping of token ids >= 0 to finite floats in "
        f"[-{MAX_ABS_LOGIT_BIAS}, {MAX_ABS_LOGIT_BIAS}]"
    )
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.items()
    elif isinstance(value, (tuple, list)):
        items = value  # already pairs, e.g. a previously normalised value
    else:
        raise _fail("logit_bias", value, allowed)
    pairs: dict[int, float] = {}
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise _fail("logit_bias", value, allowed)
        raw_id, raw_bias = item
        # JSON object keys arrive as strings ("50256": -100), so accept decimal digit strings.
        if isinstance(raw_id, str) and raw_id.strip().isascii() and raw_id.strip().isdecimal():
            try:
                raw_id = int(raw_id)
            except ValueError:  # more digits than Python converts (4,300)
                raise _fail("logit_bias", f"<a key of {len(raw_id)} digits>", allowed) from None
        token_id = _as_int("logit_bias", raw_id, allowed)
        bias = _as_float("logit_bias", raw_bias, allowed)
        if token_id < 0 or abs(bias) > MAX_ABS_LOGIT_BIAS:
            raise _fail("logit_bias", {raw_id: raw_bias}, allowed)
        if token_id in pairs:
            raise _fail("logit_bias", value, allowed + " with each token id once")
        pairs[token_id] = bias
    return tuple(sorted(pairs.items()))


def _normalise_stop(value: Any) -> tuple[str, ...]:
    allowed = "None, a non-empty str or a sequence of non-empty str"
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (tuple, list)):
        raise _fail("stop", value, allowed)
    for s in value:
        if not isinstance(s, str) or not s:
            raise _fail("stop", value, allowed)
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate: no output text holds one
            raise _fail(
                "stop",
                value,
                f"{allowed}, valid Unicode ({s!r} has a lone surrogate at {error.start})",
            ) from None
    return tuple(dict.fromkeys(value))  # drop duplicates, keep order


def _normalise_stop_token_ids(value: Any) -> tuple[int, ...]:
    allowed = "None, an int >= 0 or a sequence of ints >= 0"
    if value is None:
        return ()
    if isinstance(value, Integral) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)):
        raise _fail("stop_token_ids", value, allowed)
    ids = tuple(_as_int("stop_token_ids", v, allowed) for v in value)
    if any(i < 0 for i in ids):
        raise _fail("stop_token_ids", value, allowed)
    return tuple(dict.fromkeys(ids))
