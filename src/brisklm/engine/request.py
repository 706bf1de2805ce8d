"""One generation request's state: tokens so far, streaming text, stop rules, finish reason."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from brisklm.outputs import (
    FinishReason,
    GenerationOutput,
    SpeculativeStats,
    StreamChunk,
    TokenLogprob,
    Usage,
)
from brisklm.sampling import SamplingParams, StopStringMatcher

if TYPE_CHECKING:
    from brisklm.engine.thinking_budget import ThinkingBudget
    from brisklm.speculative.draft_length import DraftLength
    from brisklm.tokenizer import IncrementalDetokenizer


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A prompt being completed. The engine thread alone mutates it once it is submitted."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    max_seq_len: int
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None = None
    # Speculative decoding draws the draft's samples from a separate generator.
    draft_generator: torch.Generator | None = None
    # Per-request grammar matcher (brisklm.constrained.GrammarMatcher) when the output is constrained.
    matcher: Any = None
    # Where params.thinking_token_budget bounds a thinking block the reply may hold: its count.
    thinking: ThinkingBudget | None = None
    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None
    # Tokens (prompt + output) whose keys/values are in the KV cache.
    num_cached: int = 0
    # Prompt tokens whose keys/values a previous request left in the slot (prefix caching).
    num_cached_prompt_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens the grammar forces next, which it has accepted but the output has not (a request
    # with logprobs: the next pass feeds them, and their logprobs come from its logits; see
    # LLMEngine.defer_forced), with each one's grammar mask ((n, words) int32) and its
    # grammar_role when the grammar took it.
    pending_forced: list[int] = field(default_factory=list)
    pending_masks: torch.Tensor | None = None
    pending_roles: list[tuple[bool, bool]] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    # With params.prompt_logprobs: entry i is prompt token i's logprob given the tokens before it
    # (entry 0 None), as far as the prompt has been computed (LLMEngine.take_prompt_logprobs).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    speculative: SpeculativeStats | None = None
    # Where the request stands in the Speculator's draft length schedule (it sets this).
    draft_length: DraftLength | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    # Set when the request is handed to an engine (EngineLoop.submit): a request runs once.
    submitted: bool = field(default=False, repr=False)
    # Set from any thread by a stream's abort() (brisklm.request_stream), also before the request
    # reaches the engine, which then ends it as it takes it (EngineLoop._drain_inbox).
    abort_requested: bool = field(default=False, repr=False)
    stop_matcher: StopStringMatcher = field(init=False)

    def __post_init__(self) -> None:
        calls = self.params.reply_calls
        self.stop_matcher = StopStringMatcher(
            self.params.stop,
            self.params.include_stop_str_in_output,
            None if calls is None else calls.calls_start(),
        )
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def uncached_token_ids(self) -> list[int]:
        """Tokens the next forward pass must feed: the prompt at first, then the newest output(s)
        and the pending forced tokens."""
        num_prompt = len(self.prompt_token_ids)
        if self.num_cached < num_prompt:
            return self.prompt_token_ids[self.num_cached :] + self.output_token_ids
        return self.output_token_ids[self.num_cached - num_prompt :] + self.pending_forced

    @property
    def thinking_forced_token(self) -> int | None:
        """The token the request's thinking budget forces next (None: none, or no budget)."""
        return None if self.thinking is None else self.thinking.forced_token

    @property
    def thinking_free_tokens(self) -> int | None:
        """How many tokens the request may take before its thinking budget must read them (None:
        no bound; 0 while it forces the closing tag): ``ThinkingBudget.free_tokens``."""
        return None if self.thinking is None else self.thinking.free_tokens

    @property
    def is_prefilling(self) -> bool:
        """Part of the prompt is not in the cache yet."""
        return self.num_cached < len(self.prompt_token_ids)

    def next_prompt_chunk(self, chunk_size: int) -> int:
        """Prompt tokens the next pass feeds: up to the next multiple of ``chunk_size`` (counted
        from the prompt's start) or the prompt's end."""
        end = (self.num_cached // chunk_size + 1) * chunk_size
        return min(end, len(self.prompt_token_ids)) - self.num_cached

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def max_new_tokens(self) -> int:
        """Tokens this request may still generate: max_tokens, capped by the context window."""
        by_params = self.params.max_tokens - len(self.output_token_ids)
        by_context = self.max_seq_len - self.num_tokens
        return max(0, min(by_params, by_context))

    def append_token(
        self,
        token_id: int,
        logprob: TokenLogprob | None = None,
        grammar_role: tuple[bool, bool] | None = None,
    ) -> StreamChunk:
        """Record one generated token, apply the stop rules, return what a stream should emit.
        ``grammar_role``: the token's ``grammar_role`` when the grammar took it, if the grammar
        has taken more tokens since (pending forced tokens).

        A token the request's grammar has just accepted as its end (EOS, or an EOS the grammar
        names that nothing can follow) ends the output and adds no text, even where
        ``ignore_eos`` or ``min_tokens`` would let an EOS through as text (a grammar's end is not
        the model's EOS to ignore). An EOS the grammar names with more to follow (``"ok"
        <|im_end|> "more"``) is text of the output, as where ``ignore_eos`` lets an EOS through.
        """
        ends_grammar, grammar_content = grammar_role or self.grammar_role(token_id)
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        self.output_token_ids.append(token_id)
        if self.thinking is not None:
            self.thinking.take(token_id)
        if self.logprobs is None:  # (a batch computes them for every row once one asks)
            logprob = None
        if logprob is not None:
            self.logprobs.append(logprob)
        text = ""
        enough = len(self.output_token_ids) >= self.params.min_tokens
        if token_id in self.params.stop_token_ids and enough:
            self._finish("stop", token_id)
        elif ends_grammar or (token_id in self.eos_token_ids and enough and not grammar_content):
            self._finish("stop", None)
        else:
            text = self.stop_matcher.append(self._token_text(token_id, enough), can_stop=enough)
            if self.stop_matcher.stopped:
                self._finish("stop", self.stop_matcher.stop_str)
            elif self.max_new_tokens == 0:
                self._finish("length", None)
        if self.is_finished and not self.stop_matcher.stopped:
            text += self._release_withheld()
        return StreamChunk(
            request_id=self.request_id,
            text=text,
            token_ids=[token_id],
            logprobs=[logprob] if logprob is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            usage=self.usage if self.is_finished else None,
            # (the first chunk carries the prompt's, complete once a token is sampled)
            prompt_logprobs=self.prompt_logprobs if len(self.output_token_ids) == 1 else None,
        )

    def grammar_role(self, token_id: int) -> tuple[bool, bool]:
        """(the grammar's end, grammar content) for a token the request's grammar has just
        accepted: see ``append_token``."""
        matcher = self.matcher
        if matcher is None or matcher.error is not None:
            return False, False
        if matcher.is_terminated():
            return True, False
        if token_id in self.eos_token_ids:
            return matcher.is_stopped(), not matcher.is_stopped()
        return False, False

    def _token_text(self, token_id: int, enough: bool) -> str:
        """The text ``token_id`` adds for the stop rules. A run of byte pieces (``<0x0A>``) is held
        by the detokenizer until a later token ends it; a stop string its text completes is
        judged at the token that completed it, as a stream of characters would judge it: the run
        ends there when stopping is allowed, and short of ``min_tokens`` that text can end no stop
        string when it arrives."""
        delta = self.detokenizer.add(token_id)
        char = self.detokenizer.byte_run_char
        if char and self.stop_matcher.may_end_with(char):
            held = self.detokenizer.held_byte_run_text()
            if held and self.stop_matcher.would_stop(delta + held):
                if enough:
                    delta += self.detokenizer.flush()
                else:
                    end = len(self.stop_matcher.text) + len(delta) + len(held)
                    self.stop_matcher.no_stop_ending_before(end)
        return delta

    def finish_with_grammar(self) -> StreamChunk:
        """End the request because its grammar is complete; releases any withheld text."""
        self._finish("stop", None)
        text = self._release_withheld()
        return StreamChunk(self.request_id, text, [], finish_reason="stop", usage=self.usage)

    def _release_withheld(self) -> str:
        """At the end: emit what the detokenizer held back (incomplete bytes) and the stop matcher
        withheld (a possible stop-string prefix), unless that text completes a stop string."""
        enough = len(self.output_token_ids) >= self.params.min_tokens
        text = self.stop_matcher.append(self.detokenizer.flush(), can_stop=enough)
        if self.stop_matcher.stopped:
            self._finish("stop", self.stop_matcher.stop_str)
            return text
        return text + self.stop_matcher.flush()

    def abort(self, reason: FinishReason = "abort", release_text: bool = True) -> StreamChunk:
        """End the request with the text so far: what was withheld (a possible start of a stop
        string, incomplete bytes) goes out in this last chunk, as the output's text has it
        (``release_text`` False: dropped, where an unexpected error may have left the request's
        state broken; its caller gets the error, not the text)."""
        text = "" if self.is_finished or not release_text else self._release_withheld()
        self._finish(reason, None)
        return StreamChunk(self.request_id, text, [], finish_reason=reason, usage=self.usage)

    def _finish(self, reason: FinishReason, stop_reason: str | int | None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=len(self.output_token_ids),
            cached_prompt_tokens=self.num_cached_prompt_tokens,
        )

    @property
    def text(self) -> str:
        return self.stop_matcher.text

    def to_output(self) -> GenerationOutput:
        assert self.finish_reason is not None, "request is not finished"
        metrics: dict[str, float] = {}
        if self.first_token_time is not None:
            metrics["time_to_first_token_s"] = self.first_token_time - self.arrival_time
        return GenerationOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            text=self.text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            usage=self.usage,
            stop_reason=self.stop_reason,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            speculative=self.speculative,
            metrics=metrics,
        )
