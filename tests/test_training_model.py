"""training/model.py computes what the exported checkpoint computes at inference: transformers'
LlamaForCausalLM with the same weights gives the same logits, and in a packed row each sample
sees only itself, from position 0."""

from __future__ import annotations

import pytest
import torch

from training.model import Shape, TrainLlama
from training.train import hf_config

pytest.importorskip("transformers")

SHAPE = Shape(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
)


def train_logits(model: TrainLlama, ids: torch.Tensor, pos: torch.Tensor, doc: torch.Tensor):
    with torch.no_grad():
        return model.lm_head(model.hidden(ids, pos, doc))


def test_training_model_matches_transformers_llama() -> None:
    import transformers

    torch.manual_seed(0)
    model = TrainLlama(SHAPE, init_std=0.3).eval()
    hf = transformers.LlamaForCausalLM(hf_config(SHAPE)).eval()
    hf.load_state_dict(model.state_dict(), strict=False)
    hf.tie_weights()
    ids = torch.randint(0, SHAPE.vocab_size, (2, 40))
    pos = torch.arange(40).expand_as(ids)
    ours = train_logits(model, ids, pos, torch.zeros_like(ids))
    with torch.no_grad():
        theirs = hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4 * theirs.abs().max().item()


def test_packed_samples_attend_only_to_themselves() -> None:
    torch.manual_seed(1)
    model = TrainLlama(SHAPE, init_std=0.3).eval()
    first = torch.randint(0, SHAPE.vocab_size, (1, 23))
    second = torch.randint(0, SHAPE.vocab_size, (1, 17))
    row = torch.cat([first, second], dim=1)
    pos = torch.cat([torch.arange(23), torch.arange(17)])[None]
    doc = torch.cat([torch.zeros(23), torch.ones(17)]).long()[None]
    packed = train_logits(model, row, pos, doc)
    for sample, span in ((first, slice(0, 23)), (second, slice(23, 40))):
        alone = train_logits(
            model, sample, torch.arange(sample.shape[1])[None], torch.zeros_like(sample)
        )
        assert (packed[:, span] - alone).abs().max().item() <= 1e-5 * alone.abs().max().item()
