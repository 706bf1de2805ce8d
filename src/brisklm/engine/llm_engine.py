"""The engine: scheduler -> model runner -> sampler -> request updates, one step at a time."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.engine.request import Request
from brisklm.engine.scheduler import ScheduledBatch, Scheduler
from brisklm.models.llama import LlamaForCausalLM
from brisklm.outputs import StreamChunk, TokenLogprob, TopLogprob
from brisklm.sampling import SamplingMetadata, compute_logprobs, sample
from brisklm.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

StepResult = tuple[Request, "StreamChunk | BaseException"]


@dataclass(frozen=True)
class EngineConfig:
    """Capacity and kernel choices of an engine. ``max_seq_len`` None = the model's, capped at 4096."""

    max_batch_size: int = 8
    max_seq_len: int | None = None
    max_prefill_tokens: int = 8192
    attention_backend: str = "auto"

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")

    def resolved_max_seq_len(self, model_max: int) -> int:
        return self.max_seq_len if self.max_seq_len is not None else min(model_max, 4096)


class LLMEngine:
    """Runs requests to completion in steps. Not thread-safe: one thread (the EngineLoop) drives it."""

    def __init__(self, model: LlamaForCausalLM, tokenizer: Tokenizer, config: EngineConfig) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.max_seq_len = config.resolved_max_seq_len(model.config.max_position_embeddings)
        self.runner = ModelRunner(
            model, config.max_batch_size, self.max_seq_len, config.attention_backend
        )
        self.scheduler = Scheduler(config.max_batch_size, config.max_prefill_tokens)
        self.device = self.runner.device
        # Model vocabularies are often padded past the tokenizer's; those ids are not tokens.
        self.num_real_tokens = min(tokenizer.vocab_size, model.config.vocab_size)
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)

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
        self.scheduler.finish(request)
        return request, chunk

    @torch.inference_mode()
    def step(self) -> list[StepResult]:
        """Run one forward pass and sample one token for each scheduled request."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        requests = batch.requests
        try:
            logits = self.runner.forward(self._forward_batch(batch))
            token_ids, logprobs = self._sample(requests, logits)
        except Exception as exc:  # a failed step must not take other requests down with it
            logger.exception("engine step failed; failing its %d requests", len(requests))
            results: list[StepResult] = []
            for request in requests:
                request.abort("error")
                self.scheduler.finish(request)
                results.append((request, exc))
            return results
        results = []
        for row, request in enumerate(requests):
            chunk = request.append_token(token_ids[row], logprobs[row] if logprobs else None)
            if request.is_finished:
                self.scheduler.finish(request)
            results.append((request, chunk))
        return results

    @staticmethod
    def _forward_batch(batch: ScheduledBatch) -> ForwardBatch:
        requests = batch.requests
        slots = [r.slot for r in requests]
        assert all(s is not None for s in slots)
        if batch.is_prefill:
            return ForwardBatch(
                slots=slots,  # type: ignore[arg-type]
                start_positions=[0] * len(requests),
                token_ids=[r.prompt_token_ids for r in requests],
                num_logits=[1] * len(requests),
            )
        return ForwardBatch(
            slots=slots,  # type: ignore[arg-type]
            start_positions=[r.num_tokens - 1 for r in requests],
            token_ids=[[r.last_token_id] for r in requests],
            num_logits=[1] * len(requests),
        )

    def _sample(
        self, requests: list[Request], logits: torch.Tensor
    ) -> tuple[list[int], list[TokenLogprob] | None]:
        if logits.shape[1] > self.num_real_tokens:
            logits[:, self.num_real_tokens :] = float("-inf")
        metadata = SamplingMetadata.build(
            [r.params for r in requests],
            [r.prompt_token_ids for r in requests],
            [r.output_token_ids for r in requests],
            [r.generator for r in requests],
            vocab_size=logits.shape[1],
            device=logits.device,
            eos_token_ids=self.eos_token_ids,
        )
        tokens = sample(logits, metadata)  # leaves logits untouched: logprobs see the model's own
        token_list = tokens.tolist()
        if metadata.max_num_logprobs is None:
            return token_list, None
        return token_list, self._logprobs(requests, logits, tokens, metadata.max_num_logprobs)

    def _logprobs(
        self, requests: list[Request], logits: torch.Tensor, tokens: torch.Tensor, num_top: int
    ) -> list[TokenLogprob]:
        values = compute_logprobs(logits, tokens, num_top)
        chosen = values.chosen.tolist()
        ranks = values.rank.tolist()
        top_ids = values.top_ids.tolist()
        top_logprobs = values.top_logprobs.tolist()
        out = []
        for row, request in enumerate(requests):
            wanted = request.params.logprobs or 0
            token_id = int(tokens[row])
            top = tuple(
                TopLogprob(tid, self.tokenizer.id_to_token(tid), lp)
                for tid, lp in zip(top_ids[row][:wanted], top_logprobs[row][:wanted])
            )
            out.append(
                TokenLogprob(
                    token_id, self.tokenizer.id_to_token(token_id), chosen[row], ranks[row], top
                )
            )
        return out
