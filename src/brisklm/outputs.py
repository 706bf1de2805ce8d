"""What generation returns: whole outputs, stream chunks, logprobs and token usage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a step: ``token`` and ``token_bytes`` as in TokenLogprob."""

    token_id: int
    token: str
    logprob: float
    token_bytes: bytes = b""


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's logprob under the model, its rank, and the most likely alternatives.

    ``token`` is the token's text (" Paris", not the vocabulary's "ĠParis" or "▁Paris"; a special
    token's own text), ``token_bytes`` the bytes it stands for: a character split across tokens
    shows as U+FFFD in each ``token`` and decodes from their joined bytes, as OpenAI's ``bytes``.
    The vocabulary string is ``llm.tokenizer.id_to_token(token_id)``."""

    token_id: int
    token: str
    logprob: float
    rank: int
    top: tuple[TopLogprob, ...] = ()
    token_bytes: bytes = b""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # Of prompt_tokens, those whose keys and values an earlier request left in the cache (prefix
    # caching), so this request did not compute them: OpenAI's prompt_tokens_details.cached_tokens.
    cached_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def counts(self) -> dict[str, int]:
        """The counts as OpenAI's usage names them (prompt, completion and total tokens)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


def choices_usage(usages: Sequence[Usage], n: int) -> Usage:
    """The usage of a call's completions, ``n`` a prompt in order (as many as finished): each
    prompt counted once, as OpenAI counts it, with the cache hits its first choice had."""
    firsts = usages[::n] if len(usages) % n == 0 else usages
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in firsts),
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_prompt_tokens=sum(u.cached_prompt_tokens for u in firsts),
    )


@dataclass
class SpeculativeStats:
    """How speculation went for one request: proposals made and accepted, target steps taken.

    An accepted proposal that a stop (a stop string or token, ``max_tokens``) then dropped from
    the output is not counted as accepted, so a draft the target always agrees with can read
    under 1.0 (``num_accepted`` counts the proposals in the output)."""

    num_proposed: int = 0
    num_accepted: int = 0
    num_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    @property
    def mean_accepted_per_step(self) -> float:
        return self.num_accepted / self.num_steps if self.num_steps else 0.0


@dataclass
class StreamChunk:
    """One increment of a streamed request. The last chunk has ``finish_reason`` and ``usage`` set."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    usage: Usage | None = None
    # The request's first chunk, with SamplingParams.prompt_logprobs: the prompt's logprobs (as
    # GenerationOutput.prompt_logprobs).
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extend(self, later: StreamChunk) -> None:
        """Fold a later chunk of the same request into this one (several tokens in one step)."""
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        if later.logprobs:
            self.logprobs = (self.logprobs or []) + later.logprobs
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason
        self.usage = later.usage


def joined(
    first: StreamChunk | BaseException | None, then: StreamChunk | BaseException
) -> StreamChunk | BaseException:
    """One engine step's result for a request from two parts of the step (``first`` may be
    None): their chunks as one, or the error."""
    if first is None or isinstance(then, BaseException):
        return then
    if isinstance(first, BaseException):
        return first
    first.extend(then)
    return first


@dataclass
class GenerationOutput:
    """The complete result of one prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    usage: Usage
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    speculative: SpeculativeStats | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # With SamplingParams.prompt_logprobs: one entry per prompt token, its logprob given the
    # tokens before it and the top alternatives (the first token's entry is None).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # With SamplingParams.n > 1 (generate / agenerate): the prompt's other completions, in
    # order; see ``choices``.
    other_choices: list[GenerationOutput] = field(default_factory=list)

    @property
    def choices(self) -> list[GenerationOutput]:
        """The prompt's completions: this one, then ``other_choices`` (SamplingParams.n of
        them). Each has its own text, tokens, finish reason, logprobs and usage."""
        return [self, *self.other_choices]

    @property
    def cut_short(self) -> bool:
        """Whether max_tokens (or the context), a stop string or a stop token id ended it, not
        eos or its grammar's end."""
        return self.finish_reason == "length" or self.stop_reason is not None


@dataclass
class ChatOutput:
    """An assistant turn: its text, any tool calls parsed from it, and the underlying output.

    ``finish_reason`` is ``tool_calls`` when the turn ended after calling tools.
    """

    content: str
    tool_calls: list[Any]
    finish_reason: str
    output: GenerationOutput
    # With SamplingParams.n > 1: the other completions' turns, in order; see ``choices``.
    other_choices: list[ChatOutput] = field(default_factory=list)
    # A reasoning model's thinking (the <think> block that opened the reply, brisklm.reasoning);
    # None where the reply has none.
    reasoning: str | None = None
    # The text of a tool call the reply ended inside (max_tokens, a stop token), after its
    # format's opening tag: neither content nor one of tool_calls. None where none was cut.
    cut_call: str | None = None

    @property
    def choices(self) -> list[ChatOutput]:
        """The turns of the ``n`` completions (SamplingParams.n): this one, then
        ``other_choices``, each with its own content and tool calls."""
        return [self, *self.other_choices]

    @property
    def usage(self) -> Usage:
        return self.output.usage

    def message(self) -> dict[str, Any]:
        """The turn as a message to append to the history for the next ``chat`` call (tool
        calls in the OpenAI shape, which every family's template reads)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:  # (Qwen3's template shows it within a tool loop)
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [call.to_message_dict() for call in self.tool_calls]
        return message
