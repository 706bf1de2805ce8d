"""The engine: scheduler -> model runner -> sampler -> request updates, one step at a time."""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from brisklm.attention import ATTENTION_BACKENDS
from brisklm.cache.contiguous import KVCache, available_memory, cache_size_text, format_bytes
from brisklm.cache.prefix_cache import PrefixCache
from brisklm.checks import check_bool, check_int
from brisklm.constrained.compiler import DEFAULT_GRAMMAR_CACHE_SIZE, vocabulary_note
from brisklm.constrained.errors import ConstraintError
from brisklm.engine.model_runner import ForwardBatch, ModelRunner, decode_rows_stepwise
from brisklm.engine.request import Request
from brisklm.engine.scheduler import ScheduledBatch, Scheduler
from brisklm.engine.speculation import Speculator
from brisklm.engine.stats import EngineStats
from brisklm.engine.step_draws import StepDraws
from brisklm.engine.structured import StructuredOutputs
from brisklm.kernels.native import MAX_TOKENS
from brisklm.models.llama import LlamaForCausalLM
from brisklm.models.native_forward import LogitAdjustments
from brisklm.outputs import StreamChunk, TokenLogprob, TopLogprob, joined
from brisklm.sampling import MAX_LOGPROBS, SamplingMetadata, compute_logprobs, sample
from brisklm.sampling.categorical import NO_TOKEN
from brisklm.sampling.sampler import greedy_tokens
from brisklm.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

StepResult = tuple[Request, "StreamChunk | BaseException"]


def own_exception(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for one of the several requests it fails, caused by ``exc``.

    Each caller raises what it is handed in its own thread; one instance raised in several threads
    collects every thread's frames in its traceback."""
    try:
        copy = type(exc)(*exc.args)
    except Exception:  # an exception class whose constructor wants other arguments
        copy = RuntimeError(str(exc))
    copy.__cause__ = exc
    return copy


# Prompt tokens a request feeds per pass when EngineConfig.prefill_chunk_size is None. On CPU,
# the native pass's most tokens per row (brisklm.models.native_forward.MAX_QUERY_LEN): chunks of
# 512 prefilled the 125M benchmark model's 1,024-4,000-token prompts as fast as one pass of
# torch's ops (0.98-1.10x), and a request decoding beside a 2,048-token prompt waited at most ~1 s
# for a token instead of ~3.5 s; chunks of 256 halve that wait (bench/chunked_prefill.py,
# docs/benchmarks.md). On CUDA, a pass of 2,048 tokens keeps the GPU busy.
DEFAULT_PREFILL_CHUNK = {"cpu": 512, "cuda": 2048}

# How long the decode steps one native call runs (EngineConfig.max_decode_steps) may take, by the
# last step's time: a request that arrives meanwhile waits for them, and a stream gets their
# tokens at once. The bundled model's ~0.5 ms steps run 8 a call, a 125M model's ~7 ms 2, a 7B
# model's one.
DECODE_STEPS_SECONDS = 0.02
# Prompt logprobs are computed this many logits rows at a time (each a float32 copy of a row).
PROMPT_LOGPROB_ROWS = 256
# The most bytes of logits a call of decode steps keeps for its rows' logprobs (a float32 row of
# the vocabulary per row and step): 64 MB is 8 steps of 16 rows at a 128k vocabulary.
STEP_LOGITS_BYTES = 64 << 20


@dataclass(frozen=True)
class EngineConfig:
    """Capacity and kernel choices of an engine. ``max_seq_len`` None = the model's, capped at 4096.

    ``prefill_chunk_size``: the most prompt tokens one request feeds per forward pass (None: 512
    on CPU, 2048 on CUDA); longer prompts enter the cache over several passes, each of which also
    carries every decoding request's next token. ``max_prefill_tokens``: the most prompt tokens
    of all requests together per pass (at least one chunk always runs). ``cuda_graphs``: on CUDA,
    replay plain decode passes from CUDA graphs (``brisklm.engine.decode_graphs``); no effect on
    CPU. ``prefix_caching``: a finished request's keys and values stay in its slot, and a request
    whose prompt starts with the same tokens takes that slot and computes only the rest
    (``brisklm.cache.prefix_cache``): any shared prefix through the native CPU pass, else whole
    prompt chunks a pass computed for their request alone, so that the output is the same as
    without it; off for dynamic NTK rope past the trained context, whose keys depend on the
    sequence's length. ``grammar_cache_size``: compiled grammars (JSON schemas, regexes, choices,
    grammars, tool lists) kept for reuse, least recently used dropped first; each holds its
    grammar's automaton, from a few KB to ~1 MB for a large tool list over a 128k vocabulary.
    ``max_decode_steps``: on the native CPU pass, a batch that decodes greedy or sampled with
    temperature, top-k, top-p and min-p, after a logit bias and penalties, with or without
    logprobs (no grammar or pending ``min_tokens``), runs up to this many one-token steps in one
    call of the kernels, as many as take about ``DECODE_STEPS_SECONDS`` (and keep at most
    ``STEP_LOGITS_BYTES`` of logits for logprobs), and the engine's Python runs once for them; a
    sampled row's uniforms are drawn ahead as its steps would draw them (``step_draws``), so a seed
    gives the same tokens, and logprobs are computed from each step's logits as a call a step
    computes them; tokens computed past a request's end are dropped. 1: a call a step.
    ``prefix_cache_slots``: KV cache slots beyond ``max_batch_size`` that only keep finished
    requests' prefixes, so that up to ``max_batch_size + prefix_cache_slots`` conversations keep
    their history's keys while at most ``max_batch_size`` requests run (each slot is a sequence of
    ``max_seq_len`` positions of memory); needs ``prefix_caching``.
    """

    max_batch_size: int = 8
    max_seq_len: int | None = None
    max_prefill_tokens: int = 8192
    attention_backend: str = "auto"
    prefill_chunk_size: int | None = None
    cuda_graphs: bool = True
    prefix_caching: bool = True
    grammar_cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE
    max_decode_steps: int = 8
    prefix_cache_slots: int = 0

    def __post_init__(self) -> None:
        check_int("max_batch_size", self.max_batch_size, 1)
        if self.max_seq_len is not None:
            check_int("max_seq_len", self.max_seq_len, 2, " or None (the model's)")
        check_int("max_prefill_tokens", self.max_prefill_tokens, 1)
        if self.prefill_chunk_size is not None:
            check_int("prefill_chunk_size", self.prefill_chunk_size, 1, " or None (by device)")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got "
                f"{self.attention_backend!r}"
            )
        check_bool("cuda_graphs", self.cuda_graphs)
        check_bool("prefix_caching", self.prefix_caching)
        check_int("grammar_cache_size", self.grammar_cache_size, 1)
        check_int("max_decode_steps", self.max_decode_steps, 1)
        check_int("prefix_cache_slots", self.prefix_cache_slots, 0)
        if self.prefix_cache_slots and not self.prefix_caching:
            raise ValueError(
                f"prefix_cache_slots={self.prefix_cache_slots} needs prefix_caching=True: the "
                "extra slots only keep finished requests' prefixes"
            )

    def resolved_max_seq_len(self, model_max: int) -> int:
        return self.max_seq_len if self.max_seq_len is not None else min(model_max, 4096)

    def resolved_prefill_chunk_size(self, device: torch.device) -> int:
        if self.prefill_chunk_size is not None:
            return self.prefill_chunk_size
        return DEFAULT_PREFILL_CHUNK.get(device.type, DEFAULT_PREFILL_CHUNK["cuda"])


def reuses_prefixes(config: EngineConfig, model: LlamaForCausalLM) -> bool:
    """Whether an engine for ``model`` keeps prefixes: prefix caching on, and no dynamic NTK rope
    past the trained context (whose keys depend on a sequence's length)."""
    max_seq_len = config.resolved_max_seq_len(model.config.max_position_embeddings)
    return config.prefix_caching and not model.rotary.rotates_by_length(max_seq_len)


def num_cache_slots(config: EngineConfig, model: LlamaForCausalLM) -> int:
    """The sequences an engine's KV cache for ``model`` holds: ``max_batch_size``, and the
    ``prefix_cache_slots`` where it reuses prefixes."""
    extra = config.prefix_cache_slots if reuses_prefixes(config, model) else 0
    return config.max_batch_size + extra


def kv_cache_bytes_per_token(model: LlamaForCausalLM) -> int:
    """The bytes one position of one sequence takes in ``model``'s KV cache."""
    config = model.config
    return KVCache.bytes_per_token(
        config.num_hidden_layers, config.num_key_value_heads, config.head_dim, model.cache_dtype
    )


def check_kv_cache_fits(
    model: LlamaForCausalLM, engine: EngineConfig, draft: LlamaForCausalLM | None = None
) -> None:
    """A ValueError, before anything is allocated, when the KV cache an engine with ``engine``'s
    settings makes for ``model`` (``num_cache_slots`` sequences of its ``max_seq_len`` tokens,
    and the ``draft`` model's beside it) is larger than the memory free on the model's device
    (the allocator's own error only says how many bytes it was asked for; on Linux a CPU cache
    that the allocator grants but the machine cannot hold brings the out-of-memory killer).

    The memory free now is the measure: another engine's CPU cache in this process, whose pages
    are taken as its sequences write them (a slot's whole memory at its first token, on huge
    pages), counts only for the slots its sequences have used so far."""
    config = model.config
    max_batch_size = engine.max_batch_size
    max_seq_len = engine.resolved_max_seq_len(config.max_position_embeddings)
    num_slots = num_cache_slots(engine, model)
    prefix_cache_slots = num_slots - max_batch_size
    device = next(model.parameters()).device
    free = available_memory(device)
    per_token = kv_cache_bytes_per_token(model)
    if draft is not None:
        per_token += kv_cache_bytes_per_token(draft)
    needed = per_token * num_slots * max_seq_len
    if free is None or needed <= free:
        return
    memory = format_bytes(free)
    where = (
        f"the {memory} of RAM and swap free now"
        if device.type == "cpu"
        else f"the {memory} free on {device}"
    )
    size = cache_size_text(per_token, num_slots * max_seq_len, model.cache_dtype)
    caches = "KV caches (the model's and its draft's)" if draft is not None else "a KV cache"
    extra = f" and prefix_cache_slots={prefix_cache_slots}" if prefix_cache_slots else ""
    # What would fit: a shorter context for as many sequences, or fewer sequences of this one
    # (a max_seq_len under 2, or under 256 where fewer sequences fit, helps nobody).
    longest = free // (per_token * num_slots)
    sequences = free // (per_token * max_seq_len)
    ways = []
    if longest >= 256 or (longest >= 2 and sequences < 1):
        ways.append(f"max_seq_len can be at most {longest} here")
    if sequences >= 1:
        slots = "max_batch_size + prefix_cache_slots" if prefix_cache_slots else "max_batch_size"
        ways.append(f"{slots} at most {sequences} at this max_seq_len")
    advice = " or ".join(ways) if ways else "the memory free is too little for any KV cache"
    raise ValueError(
        f"max_seq_len={max_seq_len} with max_batch_size={max_batch_size}{extra} needs {caches} "
        f"of {size}, more than {where}: {advice}; the model's max_position_embeddings is "
        f"{config.max_position_embeddings} (the default max_seq_len, up to 4096; past it output "
        "usually degrades)"
    )


class LLMEngine:
    """Runs requests to completion in steps. Not thread-safe: one thread (the EngineLoop) drives it.

    With a ``speculator``, decode steps verify proposed tokens instead of sampling one at a time.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        config: EngineConfig,
        speculator: Speculator | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.max_seq_len = config.resolved_max_seq_len(model.config.max_position_embeddings)
        # Dynamic NTK past the trained context rotates keys by a sequence's length: no reuse.
        reuses = reuses_prefixes(config, model)
        if config.prefix_cache_slots and not reuses:
            logger.warning(
                "prefix_cache_slots=%d unused: dynamic NTK rope past the model's trained context "
                "reuses no prefix",
                config.prefix_cache_slots,
            )
        check_kv_cache_fits(model, config)
        self.runner = ModelRunner(
            model,
            num_cache_slots(config, model),
            self.max_seq_len,
            config.attention_backend,
            cuda_graphs=config.cuda_graphs,
            max_batch_size=config.max_batch_size,
        )
        # Warned once the cache is allocated: an error that follows is then the only line.
        if self.max_seq_len > model.config.max_position_embeddings:
            logger.warning(
                "max_seq_len=%d is past the model's max_position_embeddings=%d: positions beyond "
                "what it was trained on usually degrade its output",
                self.max_seq_len,
                model.config.max_position_embeddings,
            )
        self.device = self.runner.device
        self.prefill_chunk_size = config.resolved_prefill_chunk_size(self.device)
        if model.rotary.rotates_by_length(self.max_seq_len):
            # Dynamic NTK scales a pass's rotations by its longest position: the keys of a prompt
            # fed in chunks would be rotated otherwise than in one pass (and than transformers).
            if self.prefill_chunk_size < self.max_seq_len:
                logger.info(
                    "dynamic NTK rope past max_position_embeddings=%d: prompts are prefilled "
                    "whole, not in chunks of %d",
                    model.config.max_position_embeddings,
                    self.prefill_chunk_size,
                )
            self.prefill_chunk_size = self.max_seq_len
        self.prefix_cache = (
            PrefixCache(
                1
                if self.runner.computes_rows_alike(self.prefill_chunk_size)
                else self.prefill_chunk_size
            )
            if reuses
            else None
        )
        self.stats = EngineStats()
        self.scheduler = Scheduler(
            self.runner.kv_cache.num_slots,
            config.max_prefill_tokens,
            self.prefill_chunk_size,
            prefix_cache=self.prefix_cache,
            claim_slot=self._claim_slot if self.prefix_cache is not None else None,
            copyable=self._copyable_prefix if self.prefix_cache is not None else None,
            max_running=config.max_batch_size,
        )
        # Model vocabularies are often padded past the tokenizer's; those ids are not tokens.
        self.num_real_tokens = min(tokenizer.vocab_size, model.config.vocab_size)
        # An eos the model cannot emit (a tokenizer larger than the embedding) masks nothing.
        self.eos_token_ids = tuple(t for t in tokenizer.eos_token_ids if t < self.num_real_tokens)
        for token_id in sorted(set(tokenizer.eos_token_ids) - set(self.eos_token_ids)):
            logger.warning(
                "eos token id %d is past the model's vocabulary of %d: the model cannot end a "
                "reply with it",
                token_id,
                self.num_real_tokens,
            )
        self.structured = StructuredOutputs(
            tokenizer,
            config.max_batch_size,
            usable_tokens=self.num_real_tokens,
            cache_size=config.grammar_cache_size,
            device=self.device,
        )
        self.speculator = speculator
        if speculator is not None and self.prefix_cache is not None:
            speculator.enable_prefix_reuse(self.prefill_chunk_size)
        # The last sampled batch's metadata, while nothing in it depends on the outputs.
        self._kept_metadata: tuple[tuple, SamplingMetadata] | None = None
        # Seconds of the last decode step of one-token rows (see decode_steps).
        self._decode_step_seconds: float | None = None
        self._vocab_size = model.config.vocab_size
        # Calls of decode steps with logprobs keep each step's logits here (grown as needed).
        self._step_logits = torch.empty(0, dtype=torch.float32)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def add_request(self, request: Request) -> None:
        self.scheduler.add(request)

    def abort_request(self, request_id: str) -> StepResult | None:
        request = self.scheduler.find(request_id)
        if request is None:
            return None
        chunk = request.abort()
        self.release(request)
        return request, chunk

    def _claim_slot(self, slot: int, length: int, source: int | None, prompt: list[int]) -> None:
        """A new request takes ``slot`` reusing ``length`` tokens' keys (see Scheduler)."""
        self.runner.keep_slot_prefix(slot, length, source)
        if self.speculator is not None:
            running = [r for r in self.scheduler.running if source is not None and r.slot == source]
            tokens = running[0].prompt_token_ids if running else None
            self.speculator.claim(slot, prompt, source, tokens)

    def _copyable_prefix(self, request: Request) -> int:
        """How many leading positions of a running request's slot another request may copy: its
        prompt's, as far as computed and as a request computing them would compute them."""
        assert request.slot is not None and self.prefix_cache is not None
        computed = min(request.num_cached, request.num_prompt_tokens)
        any_offset = self.prefix_cache.granularity == 1
        return self.runner.positions_computed_alike(request.slot, computed, any_offset)

    def release(self, request: Request) -> None:
        """A finished request leaves its cache slot (and the proposer's state for it)."""
        self.stats.record(request)
        slot = request.slot
        retained = self._retained_tokens(request)
        if self.speculator is not None:
            if retained:
                self.speculator.retain(request, retained)
            else:
                self.speculator.release(request)
        self.scheduler.finish(request)
        if slot is None:
            return
        # The engine thread's own next step is the first to take the slot again.
        if retained:
            self.prefix_cache.retain(  # type: ignore[union-attr]
                slot, retained, request.num_prompt_tokens
            )
            self.runner.keep_slot_prefix(slot, len(retained))
        else:
            if self.prefix_cache is not None:
                self.prefix_cache.forget(slot)
            self.runner.clear_slot(slot)

    def _retained_tokens(self, request: Request) -> list[int]:
        """The tokens whose keys and values a finished request leaves for prefix caching."""
        slot = request.slot
        if slot is None or self.prefix_cache is None or request.finish_reason == "error":
            return []
        # Keys and values of the tokens fed so far stay for a request that starts alike; where
        # a pass computes tokens alike only in the same prompt chunks, only the prompt's (the
        # output's came from decode steps, rounded otherwise than a prompt chunk would).
        any_offset = self.prefix_cache.granularity == 1
        fed = self.runner.positions_computed_alike(slot, request.num_cached, any_offset)
        if not any_offset:  # whole prompt chunks, recomputed as they were
            fed = min(fed, request.num_prompt_tokens)
        return (request.prompt_token_ids + request.output_token_ids)[:fed]

    def step(self) -> list[StepResult]:
        """Run one forward pass: each decoding request's next token (with a speculator, the
        verification of its proposals) and the next chunk of each prompt being fed.

        Under inference mode: the engine thread enters it once for its life, and a step skips the
        context manager then (entering and leaving it were ~14 Python calls a step, after a pass
        that had streamed the weights through the caches)."""
        if torch.is_inference_mode_enabled():
            return self._step()
        with torch.inference_mode():
            return self._step()

    def _step(self) -> list[StepResult]:
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        before = [(r.num_cached, len(r.output_token_ids)) for r in batch.requests]
        try:
            results = self._run(batch)
        except Exception as exc:  # a failed step must not take other requests down with it
            unchanged = before == [(r.num_cached, len(r.output_token_ids)) for r in batch.requests]
            parts = batch.apart()
            if unchanged and len(parts) > 1:
                # Nothing was recorded: run the decoding rows and each prompt's chunk apart, so
                # that only the part that fails (a prompt too large for memory, say) fails.
                logger.warning("a pass with prompt chunks failed; running its parts apart")
                results = [result for part in parts for result in self._run_or_fail(part)]
            else:
                results = self._fail(batch.requests, exc)
        for request, _ in results:
            if request.is_finished:
                self.release(request)
        return results

    def _run(self, batch: ScheduledBatch) -> list[StepResult]:
        if self.speculator is None:
            return self.plain_step(batch.requests, batch.prefill_lens)
        return self.speculator.step(self, batch.requests, batch.prefill_lens)

    def _run_or_fail(self, batch: ScheduledBatch) -> list[StepResult]:
        try:
            return self._run(batch)
        except Exception as exc:
            return self._fail(batch.requests, exc)

    @staticmethod
    def _fail(requests: list[Request], exc: Exception) -> list[StepResult]:
        logger.error("engine step failed; failing its %d requests", len(requests), exc_info=exc)
        results: list[StepResult] = []
        for request in requests:
            request.abort("error")
            results.append((request, own_exception(exc)))
        return results

    def plain_step(
        self,
        requests: list[Request],
        prefill_lens: list[int] | None = None,
        max_steps: int | None = None,
    ) -> list[StepResult]:
        """One forward pass without speculation: ``prefill_lens[i]`` prompt tokens of request i
        (0: it decodes; None: every request decodes). A token is sampled for each request whose
        prompt is then all in the cache; the others only fill the cache. Where every request
        decodes, one call may run several steps (``decode_steps``; ``max_steps``: at most so
        many, None: as the config allows)."""
        if prefill_lens is None:
            prefill_lens = [0] * len(requests)
        feeds = [self.feed(r, n) for r, n in zip(requests, prefill_lens)]
        num_logits = [int(self.samples_after(r, n)) for r, n in zip(requests, prefill_lens)]
        sampled = [r for r, n in zip(requests, num_logits) if n]
        # A decoding request's pending forced tokens: a row of logits each, for their logprobs.
        num_logits = [n * (1 + len(r.pending_forced)) for r, n in zip(requests, num_logits)]
        # A prompt chunk of a request with prompt logprobs: a row before those for each token.
        extra = [self.prompt_logprob_rows(r, n) for r, n in zip(requests, prefill_lens)]
        num_logits = [n + e for n, e in zip(num_logits, extra)]
        row_invariant = any(r.params.is_seeded for r in requests)
        forward = ForwardBatch(
            slots=[r.slot for r in requests],  # type: ignore[misc]
            start_positions=[r.num_cached for r in requests],
            token_ids=feeds,
            num_logits=num_logits,
            row_invariant=row_invariant,
            # a decoding row of several tokens: a run of grammar-forced tokens
            stepwise=decode_rows_stepwise([n == 0 for n in prefill_lens], row_invariant),
        )
        one_token_rows = not any(prefill_lens) and all(len(feed) == 1 for feed in feeds)
        steps = self.decode_steps(requests, max_steps) if one_token_rows else 1
        start = time.perf_counter()
        if steps > 1:
            drawn, adjustments = self._step_sampling(requests, steps)
            step_logits = self._step_logits_space(requests, steps)
            chosen = self.runner.run_steps(
                forward,
                self.num_real_tokens,
                steps,
                drawn.sampling if drawn else None,
                adjustments,
                step_logits,
            )
            if drawn is not None and (chosen is None or len(chosen) < steps):
                # Declined (dynamic NTK past the trained context), or a row had nothing to draw:
                # the generators as after the steps that ran.
                drawn.rewind(len(chosen) if chosen else 0)
            if chosen:  # (none: a row had nothing to draw at once; its pass below says so)
                results = self._take_steps(requests, chosen, step_logits)
                self._decode_step_seconds = (time.perf_counter() - start) / len(chosen)
                return results
        pending_masks = self.structured.start_masks(sampled)
        try:
            maybe_logits, greedy = self.forward_pass(forward, sampled, requests, extra)
        except BaseException:
            self.structured.settle(pending_masks)
            raise
        for request, feed in zip(requests, feeds):
            request.num_cached += len(feed)
        if greedy is not None:  # the kernels found the tokens: the logits need not be read
            if one_token_rows:
                self._decode_step_seconds = time.perf_counter() - start
            return [(r, self.update_request(r, t, None)) for r, t in zip(sampled, greedy)]
        if not sampled:
            return []
        logits = maybe_logits
        assert logits is not None
        self.mask_padding(logits)
        logits, appended = self.take_pending_forced(
            sampled, logits, [1] * len(sampled), pending_masks
        )
        if not appended:
            results = self.sample_and_update(sampled, logits)
            if one_token_rows:
                self._decode_step_seconds = time.perf_counter() - start
            return results
        # Requests that their pending tokens finished (or failed) sample nothing more.
        going = [i for i, r in enumerate(sampled) if not r.is_finished]
        rows = torch.tensor(going, dtype=torch.int64, device=logits.device)
        now = dict(self.sample_and_update([sampled[i] for i in going], logits[rows]))
        return [(r, joined(appended.get(r), now[r]) if r in now else appended[r]) for r in sampled]

    def decode_steps(self, requests: list[Request], max_steps: int | None = None) -> int:
        """How many one-token steps the next call runs for ``requests``, each decoding one token
        (see ``EngineConfig.max_decode_steps``): more than 1 only where every one takes its token as
        the native steps choose it (``_takes_native_steps``), the last such step's time is known,
        and no request waits for a slot; at most what the longest of them may still generate, what
        every row's cache slot has room for, what every thinking budget leaves, and ``max_steps``.
        With a speculator only as many as it says (``max_steps``: the steps its schedules pause
        every row for, the draft catching up on their tokens when it next proposes;
        ``max_decode_steps`` for rows decoding without it)."""
        limit = self.config.max_decode_steps
        if max_steps is not None:
            limit = min(limit, max_steps)
        elif self.speculator is not None:
            return 1
        seconds = self._decode_step_seconds
        if limit <= 1 or seconds is None or self.scheduler.waiting:
            return 1
        if self.runner.native is None or not all(self._takes_native_steps(r) for r in requests):
            return 1
        for request in requests:  # (no step past a thinking budget's count)
            free = request.thinking_free_tokens  # (0: forcing, which took no native steps above)
            if free:
                limit = min(limit, free)
        if any(r.params.logprobs is not None for r in requests):
            limit = min(limit, STEP_LOGITS_BYTES // (4 * self._vocab_size * len(requests)))
        return max(
            1,
            min(
                limit,
                int(DECODE_STEPS_SECONDS / max(seconds, 1e-9)),
                max(r.max_new_tokens for r in requests),
                min(self.max_seq_len - r.num_cached for r in requests),
                MAX_TOKENS // len(requests),  # the kernels' tokens a call
            ),
        )

    @staticmethod
    def _takes_native_steps(request: Request) -> bool:
        """The request's next token comes from its logits as the native pass's steps choose it:
        greedy, or sampled with temperature, top-k, top-p and min-p, after a logit bias and
        repetition, presence and frequency penalties (no pending ``min_tokens``, no grammar, no
        thinking budget's closing tag to force); its logprobs, if it asks for them, from each
        step's logits. (A thinking budget bounds the steps a call runs: ``decode_steps``.)"""
        return (
            len(request.output_token_ids) >= request.params.min_tokens
            and request.matcher is None
            and request.thinking_forced_token is None
        )

    def _step_sampling(
        self, requests: list[Request], steps: int
    ) -> tuple[StepDraws | None, LogitAdjustments | None]:
        """How ``steps`` native steps of ``requests`` choose their tokens: the sampled rows'
        draws (None: every row is greedy), each sampled row's uniforms drawn ahead as as many
        sampled steps would draw them (a seeded row from its own generator, the others from the
        default one, step by step); and the rows' logit bias and penalties (None: none)."""
        if all(r.params.picks_raw_argmax(len(r.output_token_ids)) for r in requests):
            return None, None
        greedy = all(r.params.is_greedy for r in requests)
        md = self._metadata(requests, self._vocab_size, torch.device("cpu"))
        drawn = None if greedy else StepDraws.draw(md, steps, len(requests))
        return drawn, LogitAdjustments.of(md)

    @classmethod
    def _takes_raw_argmax(cls, request: Request) -> bool:
        """The request's next token is the raw logits' argmax, found by the kernels, and nothing
        else reads the logits: greedy with no bias or penalty (``SamplingParams.picks_raw_argmax``),
        no logprobs, and taking its token as the native steps do (``_takes_native_steps``: no
        grammar)."""
        params = request.params
        return (
            params.picks_raw_argmax(len(request.output_token_ids))
            and params.logprobs is None
            and cls._takes_native_steps(request)
        )

    def _step_logits_space(self, requests: list[Request], steps: int) -> torch.Tensor | None:
        """Room for a call of ``steps`` decode steps' logits (steps, rows, vocab), where a row
        asks for logprobs (None: none does)."""
        if all(r.params.logprobs is None for r in requests):
            return None
        shape = (steps, len(requests), self._vocab_size)
        if self._step_logits.numel() < math.prod(shape):
            self._step_logits = torch.empty(math.prod(shape), dtype=torch.float32)
        return self._step_logits[: math.prod(shape)].view(shape)

    def _take_steps(
        self,
        requests: list[Request],
        chosen: list[list[int]],
        step_logits: torch.Tensor | None = None,
    ) -> list[StepResult]:
        """Append each request's tokens of a call of decode steps (``chosen[step][row]``) until
        it finishes; the rest are dropped. The cache holds each kept token's keys but the last's,
        as after as many one-token steps. With ``step_logits`` (a row of logits for each row and
        step), each token's logprob, as a call a step computes it from the same logits."""
        logprobs: dict[int, TokenLogprob] = {}  # by step * rows + row
        if step_logits is not None:  # (each row's values are its own: only those asking)
            asking = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
            at = [step * len(requests) + i for step in range(len(chosen)) for i in asking]
            rows = step_logits[: len(chosen)].view(-1, step_logits.shape[-1])[torch.tensor(at)]
            self.mask_padding(rows)
            ids = torch.tensor([chosen[step][i] for step in range(len(chosen)) for i in asking])
            entries = self.token_logprobs([requests[i] for i in asking] * len(chosen), rows, ids)
            logprobs = dict(zip(at, entries, strict=True))
        results: list[StepResult] = []
        for row, request in enumerate(requests):
            result: StreamChunk | BaseException | None = None
            taken = 0
            for step, tokens in enumerate(chosen):
                taken += 1
                logprob = logprobs.get(step * len(requests) + row)
                result = joined(result, self.update_request(request, tokens[row], logprob))
                if request.is_finished or isinstance(result, BaseException):
                    break
            request.num_cached += taken
            assert result is not None
            results.append((request, result))
        return results

    def forward_pass(
        self,
        forward: ForwardBatch,
        sampled: list[Request],
        rows: list[Request],
        extra: list[int],
    ) -> tuple[torch.Tensor | None, list[int] | None]:
        """Run ``forward`` (``rows``: the request of each of its rows), whose logits rows past
        each row's ``extra`` prompt-logprob rows (``prompt_logprob_rows``, recorded here by
        ``take_prompt_logprobs``) belong to ``sampled``: ``(those logits, None)``, or, when every
        one of them takes the raw logits' argmax (greedy, no bias, penalty, grammar or logprobs,
        ``min_tokens`` met), no row has prompt logprobs and the kernels find it, ``(None,
        tokens)``: the logits are then not read (``ModelRunner.forward_greedy``)."""
        if any(extra):
            logits = self.runner.forward(forward)
            return self.take_prompt_logprobs(rows, extra, forward.num_logits, logits), None
        if sampled and all(self._takes_raw_argmax(r) for r in sampled):
            return self.runner.forward_greedy(forward, self.num_real_tokens)
        return self.runner.forward(forward), None

    @staticmethod
    def feed(request: Request, prefill_len: int) -> list[int]:
        """What a request feeds this pass: ``prefill_len`` prompt tokens, or (0) its uncached
        tokens (the last token sampled)."""
        if prefill_len:
            return request.prompt_token_ids[request.num_cached : request.num_cached + prefill_len]
        return request.uncached_token_ids

    @staticmethod
    def prompt_logprob_rows(request: Request, prefill_len: int) -> int:
        """The logits rows a prompt chunk of ``prefill_len`` tokens adds for the request's prompt
        logprobs: one for each of its tokens that a prompt token follows (0 without
        ``prompt_logprobs``, and for a decoding row)."""
        if not prefill_len or request.params.prompt_logprobs is None:
            return 0
        return prefill_len - int(request.num_cached + prefill_len == request.num_prompt_tokens)

    def take_prompt_logprobs(
        self,
        requests: list[Request],
        extra: list[int],
        num_logits: list[int],
        logits: torch.Tensor | None,
    ) -> torch.Tensor:
        """Record the prompt logprobs of a pass's rows: request i's ``num_logits[i]`` logits rows
        begin with ``extra[i]`` rows at its prompt chunk's tokens (``prompt_logprob_rows``), whose
        next tokens' logprobs it keeps; returns the other rows, in order. Run before the requests'
        ``num_cached`` moves past the chunk (and again, a failed step's rerun records the same)."""
        assert logits is not None
        kept: list[int] = []
        offset = 0
        for request, rows, count in zip(requests, extra, num_logits, strict=True):
            if rows:
                self._record_prompt_logprobs(request, logits[offset : offset + rows])
            kept.extend(range(offset + rows, offset + count))
            offset += count
        return logits.index_select(0, torch.tensor(kept, dtype=torch.int64, device=logits.device))

    def _record_prompt_logprobs(self, request: Request, logits: torch.Tensor) -> None:
        """Prompt tokens ``num_cached + 1`` on: their logprobs under ``logits`` (a row at each
        token before them), with the request's top ``prompt_logprobs`` alternatives."""
        start = request.num_cached
        targets = request.prompt_token_ids[start + 1 : start + 1 + logits.shape[0]]
        wanted = request.params.prompt_logprobs or 0
        entries: list[TokenLogprob | None] = []
        for first in range(0, len(targets), PROMPT_LOGPROB_ROWS):  # bounded float32 copies
            rows = logits[first : first + PROMPT_LOGPROB_ROWS]
            self.mask_padding(rows)
            tokens = torch.tensor(targets[first : first + rows.shape[0]], device=rows.device)
            entries += self.token_logprobs([request] * len(tokens), rows, tokens, wanted)
        recorded = request.prompt_logprobs
        assert recorded is not None
        del recorded[start + 1 :]  # (a failed step's rerun records them again)
        recorded.extend(entries)

    @staticmethod
    def samples_after(request: Request, prefill_len: int) -> bool:
        """Whether a request samples a token after feeding ``prefill_len`` prompt tokens (0: it
        decodes): a prompt chunk samples only when it completes the prompt."""
        return not prefill_len or request.num_cached + prefill_len == request.num_prompt_tokens

    def sample_and_update(self, requests: list[Request], logits: torch.Tensor) -> list[StepResult]:
        """Sample one token per request from its row of ``logits`` (padding and grammar masks
        already applied) and append it."""
        forced = [self.structured.forced_next(r) for r in requests]
        free = [row for row, token in enumerate(forced) if token is None]
        if len(free) == len(requests):
            tokens = self._sample(requests, logits)
        else:  # forced rows draw nothing, as forced tokens appended without logprobs do
            tokens = torch.tensor([-1 if t is None else t for t in forced], device=logits.device)
            if free:
                rows = torch.tensor(free, device=logits.device)
                tokens[rows] = self._sample([requests[row] for row in free], logits[rows])
        logprobs = None
        if any(r.params.logprobs is not None for r in requests):
            logprobs = self.token_logprobs(requests, logits, tokens)
        results: list[StepResult] = []
        for row, (request, token) in enumerate(zip(requests, tokens.tolist())):
            results.append(
                (request, self.update_request(request, token, logprobs[row] if logprobs else None))
            )
        return results

    def _sample(self, requests: list[Request], logits: torch.Tensor) -> torch.Tensor:
        if all(r.params.picks_raw_argmax(len(r.output_token_ids)) for r in requests):
            # What sample() does for such rows, without building its metadata: after a forward
            # pass that streamed the weights through the caches, the build's Python ran ~70 us
            # against ~5 us warm (the 125M benchmark model's step, a 2-vCPU Xeon).
            return greedy_tokens(logits)
        # logits untouched (logprobs)
        return sample(logits, self._metadata(requests, logits.shape[1], logits.device))

    def _metadata(
        self, requests: list[Request], vocab_size: int, device: torch.device
    ) -> SamplingMetadata:
        """The sampling metadata of ``requests``: the last step's when the batch is the same and
        nothing in it depends on the outputs (no penalties; ``min_tokens`` reached, which stays
        so). Building it took ~50 us a step of one row, a twentieth of a sampled step of the
        bundled model."""
        key = (tuple(requests), vocab_size, device)
        if self._kept_metadata is not None and self._kept_metadata[0] == key:
            return self._kept_metadata[1]
        metadata = SamplingMetadata.build(
            [r.params for r in requests],
            [r.prompt_token_ids for r in requests],
            [r.output_token_ids for r in requests],
            [r.generator for r in requests],
            vocab_size=vocab_size,
            device=device,
            eos_token_ids=self.eos_token_ids,
        )
        constant = metadata.no_penalties and metadata.no_min_tokens
        self._kept_metadata = (key, metadata) if constant else None
        return metadata

    def mask_padding(self, logits: torch.Tensor) -> None:
        if logits.shape[1] > self.num_real_tokens:
            logits[:, self.num_real_tokens :] = float("-inf")

    def update_request(
        self,
        request: Request,
        token_id: int,
        logprob: TokenLogprob | None,
        allow_forced: bool = True,
    ) -> StreamChunk | BaseException:
        """Append a chosen token, advance the request's grammar, and append tokens it forces. An
        unexpected error in doing so (a bug in a stop rule or the detokenizer, say) fails this
        request alone: the tokens of the rows beside it are chosen, and theirs to append (it
        failed every request of the step)."""
        try:
            return self._update_request(request, token_id, logprob, allow_forced)
        except Exception as exc:
            logger.error(
                "request %s failed taking token %d; stopping it",
                request.request_id,
                token_id,
                exc_info=exc,
            )
            request.abort("error", release_text=False)
            return exc

    def _update_request(
        self,
        request: Request,
        token_id: int,
        logprob: TokenLogprob | None,
        allow_forced: bool,
    ) -> StreamChunk | BaseException:
        if token_id == NO_TOKEN:
            return self._nothing_to_sample(request)
        matcher = request.matcher
        if matcher is not None and not matcher.accept_token(token_id):
            return self._constraint_failed(request, token_id)
        chunk = request.append_token(token_id, logprob)
        forced = (
            self.structured.forced_tokens(request)
            if allow_forced and not request.is_finished
            else []
        )
        # The next pass feeds this token and the forced ones as one row: past the trained context,
        # dynamic NTK would rotate that row by its last position, unlike one-token steps. Those
        # forced tokens are taken one a step (``forced_next``), as proposals are cut (speculation).
        rotary = self.model.rotary
        while forced and rotary.rotates_by_length(request.num_tokens + len(forced)):
            forced.pop()
        if forced and (free := request.thinking_free_tokens) is not None:
            del forced[free:]  # (a thinking budget reads each token)
        if forced and request.params.logprobs is not None:
            self.defer_forced(request, forced)
        else:
            for token in forced:
                assert matcher is not None  # only a grammar forces tokens
                if not matcher.accept_token(token):
                    break
                chunk.extend(request.append_token(token))
                if request.is_finished:
                    break
        return self._grammar_end(request, chunk)

    def _grammar_end(self, request: Request, chunk: StreamChunk) -> StreamChunk | BaseException:
        """After a request's grammar advanced: end the request where the grammar is complete
        (once its pending forced tokens are in the output), fail it where the grammar failed."""
        matcher = request.matcher
        if matcher is not None and not request.is_finished and matcher.is_stopped():
            if matcher.error is not None:  # stopped by a failure (computing forced tokens)
                return self._constraint_failed(request, None)
            # The grammar is complete (it accepted EOS, or nothing can follow): so is the output.
            if not request.pending_forced:
                chunk.extend(request.finish_with_grammar())
        return chunk

    @staticmethod
    def defer_forced(request: Request, forced: list[int]) -> None:
        """Let the grammar of a request with logprobs take its ``forced`` tokens now, and the
        output in the next pass, which feeds them (as a request without logprobs feeds the
        forced tokens it appended) and computes their logprobs under the masks kept here. So
        the request takes the same passes, proposals and random draws whether or not it reports
        logprobs, and a run of forced tokens costs one pass, not one each."""
        from brisklm.constrained import allocate_token_bitmask

        matcher = request.matcher
        forced = forced[: request.max_new_tokens]  # (more would not fit the output)
        masks = allocate_token_bitmask(len(forced), matcher.compiled.vocab_size)
        roles: list[tuple[bool, bool]] = []
        for row, token in enumerate(forced):
            matcher.fill_bitmask(masks, row)
            if not matcher.accept_token(token):
                break
            # (an EOS the grammar names is its end, or text with more to follow: known now)
            roles.append(request.grammar_role(token))
            if roles[-1][0]:
                break
        request.pending_forced = forced[: len(roles)]
        request.pending_masks = masks[: len(roles)]
        request.pending_roles = roles

    def take_pending_forced(
        self,
        requests: list[Request],
        logits: torch.Tensor,
        counts: list[int],
        masks: Future[tuple[torch.Tensor, list[int]]] | None,
    ) -> tuple[torch.Tensor, dict[Request, StreamChunk | BaseException]]:
        """Append the pending forced tokens of ``requests`` with their logprobs. ``logits`` holds,
        for request i, a row for each of its pending tokens, then ``counts[i]`` rows (then any
        rows of other requests): returns those other rows with the grammar ``masks`` (a job of
        ``StructuredOutputs.start_masks``) applied, and the chunk of each request that had
        pending tokens (an error where its grammar failed)."""
        if not any(r.pending_forced for r in requests):
            self.structured.apply(masks, logits)
            return logits, {}
        from brisklm.constrained import apply_token_bitmask_

        pending_rows: list[int] = []
        other_rows: list[int] = []
        offset = 0
        for request, count in zip(requests, counts, strict=True):
            num_pending = len(request.pending_forced)
            pending_rows += range(offset, offset + num_pending)
            other_rows += range(offset + num_pending, offset + num_pending + count)
            offset += num_pending + count
        other_rows += range(offset, logits.shape[0])
        device = logits.device
        pending_logits = logits.index_select(0, torch.tensor(pending_rows, device=device))
        other_logits = logits.index_select(0, torch.tensor(other_rows, device=device))
        # (the mask job reads the matchers, which appending the tokens below reads too)
        self.structured.apply(masks, other_logits)
        owners = [r for r in requests for _ in r.pending_forced]
        kept = torch.cat([r.pending_masks for r in requests if r.pending_forced])  # type: ignore[misc]
        apply_token_bitmask_(pending_logits, kept.to(device))
        tokens = torch.tensor([t for r in requests for t in r.pending_forced], device=device)
        entries = self.token_logprobs(owners, pending_logits, tokens)
        chunks: dict[Request, StreamChunk | BaseException] = {}
        start = 0
        for request in requests:
            taken, roles = request.pending_forced, request.pending_roles
            request.pending_forced, request.pending_masks, request.pending_roles = [], None, []
            if taken:
                chunks[request] = self._append_pending(request, taken, roles, entries[start:])
                start += len(taken)
        return other_logits, chunks

    def _append_pending(
        self,
        request: Request,
        tokens: list[int],
        roles: list[tuple[bool, bool]],
        entries: list[TokenLogprob],
    ) -> StreamChunk | BaseException:
        chunk = None
        for token, role, entry in zip(tokens, roles, entries):
            added = request.append_token(token, entry, grammar_role=role)
            if chunk is None:
                chunk = added
            else:
                chunk.extend(added)
            if request.is_finished:
                break
        assert chunk is not None
        return self._grammar_end(request, chunk)

    def _nothing_to_sample(self, request: Request) -> BaseException:
        """End a request whose distribution had no token to draw (``NO_TOKEN``): the error for
        its caller; the other rows of its batch go on."""
        matcher = request.matcher
        if matcher is not None and matcher.error is not None:
            return self._constraint_failed(request, None)
        request.abort("error")
        masked = ", or its constraint allowed no token" if matcher is not None else ""
        return RuntimeError(
            f"request {request.request_id}: no token to sample after "
            f"{len(request.output_token_ids)} output tokens: the model's logits hold NaN or "
            f"+inf there{masked}; the request was stopped, and other requests are unaffected"
        )

    def _constraint_failed(self, request: Request, token_id: int | None) -> BaseException:
        """End a request whose grammar matcher failed, or rejected ``token_id``: the error for
        its caller."""
        request.abort("error")
        # A compiled grammar's copies share llguidance state that a failure (a panic) can leave
        # broken: the next request with this constraint compiles it afresh.
        self.structured.forget(request.params.constraint)
        matcher = request.matcher
        error = matcher.error if matcher is not None else None
        if error is None:
            return RuntimeError(
                f"request {request.request_id}: the grammar rejected token {token_id} "
                "(no error reported)"
            )
        where = f"request {request.request_id}: the constraint could not be enforced past "
        where += f"{len(request.output_token_ids)} tokens"
        if error.startswith("panic:"):
            return ConstraintError(
                f"{where}: llguidance failed internally on this grammar ({error}); the request "
                "was stopped, and other requests are unaffected"
            )
        if "NoExtensionBias" in error:  # no token continues the output: a dead end in its grammar
            return ConstraintError(
                f"{where}: llguidance stopped with {error!r}: no token continues the output "
                "(the grammar llguidance built for the constraint has a dead end there, as it "
                "does for some multipleOf ranges"
                f"{vocabulary_note(self.num_real_tokens, self.tokenizer.vocab_size)}); the "
                "request was stopped, and other requests are unaffected"
            )
        return ConstraintError(  # llguidance gave up: a limit, not a sampling bug
            f"{where}: llguidance stopped with {error!r}; a grammar or regex this large or "
            "ambiguous exceeds its limits (simplify it, e.g. avoid very long repetitions or "
            "single-byte lexemes)"
        )

    def token_logprobs(
        self,
        requests: list[Request],
        logits: torch.Tensor,
        tokens: torch.Tensor,
        num_alternatives: int | None = None,
    ) -> list[TokenLogprob]:
        """Row i's chosen token's logprob under ``logits[i]`` with the request's top-N alternatives
        (N: its ``logprobs``, or ``num_alternatives`` for every row): those of logprob -inf left
        out (a grammar's masked tokens, a padded vocabulary's: no JSON writes -inf), so fewer
        than N where fewer tokens are possible."""
        counts = [
            (r.params.logprobs or 0) if num_alternatives is None else num_alternatives
            for r in requests
        ]
        # The top MAX_LOGPROBS whatever the rows ask, each row cut to its own: topk orders tied
        # values otherwise for another k, so a row's alternatives would depend on its neighbours'
        # (a call a step's batch against a call of steps'; a greedy row beside one asking for 20).
        num_top = MAX_LOGPROBS if max(counts, default=0) > 0 else 0
        # A NO_TOKEN row's entry (against token 0) is never used: its request fails.
        tokens = tokens.clamp_min(0)
        values = compute_logprobs(logits, tokens, num_top)
        chosen = values.chosen.tolist()
        ranks = values.rank.tolist()
        top_ids = values.top_ids.tolist()
        top_logprobs = values.top_logprobs.tolist()
        token_ids = tokens.tolist()  # (one read: a row's int() on a device tensor syncs each)
        table = self.tokenizer.token_bytes()
        out = []
        for row, (token_id, wanted) in enumerate(zip(token_ids, counts, strict=True)):
            top = tuple(
                TopLogprob(tid, _token_text(table, tid), lp, table[tid])
                for tid, lp in zip(top_ids[row][:wanted], top_logprobs[row][:wanted])
                if lp != -math.inf
            )
            out.append(
                TokenLogprob(
                    token_id,
                    _token_text(table, token_id),
                    chosen[row],
                    ranks[row],
                    top,
                    table[token_id],
                )
            )
        return out


def _token_text(table: list[bytes], token_id: int) -> str:
    """A token's text for its logprob entry: its bytes as UTF-8, a partial character as U+FFFD."""
    return table[token_id].decode("utf-8", "replace")
