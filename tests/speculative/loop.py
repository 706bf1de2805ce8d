"""A reference speculative decoding loop over the package's pieces, and plain decoding to compare.

It is what the engine integration does, minus streaming and stop strings: propose, verify all
proposals in one target pass on top of the KV cache, rejection-sample, roll back, repeat."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.models.llama import LlamaForCausalLM
from brisklm.sampling import SamplingMetadata, SamplingParams, make_generator, sample
from brisklm.speculative import (
    DraftRow,
    Proposer,
    batch_proposals,
    make_draft_generator,
    rejection_sample,
    target_probs,
    verification_counts,
)


@dataclass
class SeqState:
    slot: int
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    target_generator: torch.Generator | None = None
    draft_generator: torch.Generator | None = None
    num_cached: int = 0  # tokens with keys/values in the target cache
    done: bool = False

    @property
    def context(self) -> list[int]:
        return self.prompt + self.output

    def emit(self, token: int, eos_token_ids: Sequence[int]) -> None:
        self.output.append(token)
        if len(self.output) >= self.max_new_tokens:
            self.done = True
        elif token in eos_token_ids and not self.params.ignore_eos:
            self.done = True


@dataclass
class Stats:
    num_steps: int = 0
    num_proposed: int = 0
    num_accepted: int = 0
    accepted_per_step: list[list[int]] = field(default_factory=list)


def _mask_padding(logits: torch.Tensor, num_real_tokens: int) -> torch.Tensor:
    if logits.shape[1] > num_real_tokens:
        logits[:, num_real_tokens:] = float("-inf")
    return logits


@torch.inference_mode()
def plain_generate(
    model: LlamaForCausalLM,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    max_new_tokens: int,
    num_real_tokens: int,
    eos_token_ids: Sequence[int] = (),
    max_seq_len: int = 256,
) -> list[list[int]]:
    """Token-by-token decoding with the target alone (as the engine does without speculation)."""
    runner = ModelRunner(model, len(prompts), max_seq_len)
    seqs = [
        SeqState(i, list(p), sp, max_new_tokens, target_generator=make_generator(sp, "cpu"))
        for i, (p, sp) in enumerate(zip(prompts, params))
    ]
    while True:
        active = [s for s in seqs if not s.done]
        if not active:
            return [s.output for s in seqs]
        feeds = [s.context[s.num_cached :] for s in active]
        logits = runner.forward(
            ForwardBatch(
                [s.slot for s in active], [s.num_cached for s in active], feeds, [1] * len(active)
            )
        )
        _mask_padding(logits, num_real_tokens)
        md = SamplingMetadata.build(
            [s.params for s in active],
            [s.prompt for s in active],
            [s.output for s in active],
            [s.target_generator for s in active],
            logits.shape[1],
            logits.device,
            eos_token_ids,
        )
        tokens = sample(logits, md).tolist()
        for s, token in zip(active, tokens):
            s.num_cached = len(s.context)
            s.emit(token, eos_token_ids)


@torch.inference_mode()
def speculative_generate(
    model: LlamaForCausalLM,
    proposer: Proposer,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    max_new_tokens: int,
    num_real_tokens: int,
    eos_token_ids: Sequence[int] = (),
    max_seq_len: int = 256,
    num_speculative_tokens: Sequence[int] | None = None,
) -> tuple[list[list[int]], Stats]:
    """Speculative decoding of a batch: every row accepts its own number of tokens per step."""
    runner = ModelRunner(model, len(prompts), max_seq_len)
    ks = num_speculative_tokens or [proposer.num_speculative_tokens] * len(prompts)
    seqs = [
        SeqState(
            i,
            list(p),
            sp,
            max_new_tokens,
            target_generator=make_generator(sp, "cpu"),
            draft_generator=make_draft_generator(sp, "cpu"),
        )
        for i, (p, sp) in enumerate(zip(prompts, params))
    ]
    stats = Stats()
    vocab_size = model.config.vocab_size
    while True:
        active = [s for s in seqs if not s.done]
        if not active:
            return [s.output for s in seqs], stats
        rows = [
            DraftRow(
                s.slot,
                s.prompt,
                list(s.output),
                # Emitting n + 1 tokens per step: never propose past max_tokens or the cache.
                max_draft_tokens=min(
                    ks[s.slot], s.max_new_tokens - len(s.output) - 1, max_seq_len - len(s.context)
                ),
                params=s.params,
                generator=s.draft_generator,
            )
            for s in active
        ]
        proposals = proposer.propose(rows)
        logits = runner.forward(
            ForwardBatch(
                [s.slot for s in active],
                [s.num_cached for s in active],
                [s.context[s.num_cached :] + p.token_ids for s, p in zip(active, proposals)],
                verification_counts(proposals),
            )
        )
        _mask_padding(logits, num_real_tokens)
        probs = target_probs(logits, rows, proposals, eos_token_ids)
        batch = batch_proposals(proposals, vocab_size, logits.device)
        out, num_accepted = rejection_sample(
            probs,
            batch.token_ids,
            batch.num_draft,
            batch.probs,
            [s.params.is_greedy for s in active],
            [s.target_generator for s in active],
        )
        out_list, accepted = out.tolist(), num_accepted.tolist()
        stats.num_steps += 1
        stats.accepted_per_step.append(accepted)
        for s, proposal, row_out, n in zip(active, proposals, out_list, accepted):
            stats.num_proposed += len(proposal)
            stats.num_accepted += n
            s.num_cached = len(s.context) + n  # the accepted proposals' keys/values are valid
            proposer.rollback(s.slot, len(proposal) - n)
            for token in row_out[: n + 1]:
                s.emit(token, eos_token_ids)
                if s.done:
                    proposer.release(s.slot)
                    break
