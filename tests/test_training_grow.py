"""training/train.py's ``grow``: a shallower model of the same width put in a deeper one's first
layers computes exactly what it computed alone, and a shape that does not fit is refused by name."""

from __future__ import annotations

import pytest
import torch

from training.model import Shape, TrainLlama
from training.train import grow, shape_for


def small(layers: int) -> Shape:
    return Shape(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    )


def logits(model: TrainLlama, ids: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    doc = torch.zeros_like(ids)
    with torch.no_grad():
        return model.lm_head(model.hidden(ids, pos, doc))


def test_a_grown_model_computes_what_the_shallower_one_did() -> None:
    torch.manual_seed(0)
    seed = TrainLlama(small(2), init_std=0.3)
    deep = TrainLlama(small(5), init_std=0.3)
    ids = torch.randint(0, 64, (2, 12))
    assert not torch.allclose(logits(seed, ids), logits(deep, ids), atol=1e-3)
    grow(deep, seed.state_dict(), seed_layers=2)
    torch.testing.assert_close(logits(deep, ids), logits(seed, ids), rtol=0, atol=1e-5)
    # The new layers are not frozen copies: their inputs keep their random init, so training moves
    # them once the zeroed output projections do.
    new = deep.model.layers[2]
    assert new.self_attn.q_proj.weight.abs().sum() > 0
    assert (
        new.self_attn.o_proj.weight.abs().sum() == 0 and new.mlp.down_proj.weight.abs().sum() == 0
    )


def test_a_seed_of_another_width_is_refused_by_tensor_name() -> None:
    seed = TrainLlama(small(2))
    wide = TrainLlama(Shape(64, 48, 4, 4, 2, vocab_size=64))
    with pytest.raises(ValueError, match=r"--grow-from: model\.embed_tokens\.weight \(64, 32\)"):
        grow(wide, seed.state_dict(), seed_layers=2)


def test_layers_replaces_only_the_presets_depth() -> None:
    base, deeper = shape_for("target", 4096), shape_for("target", 4096, layers=12)
    assert deeper.num_hidden_layers == 12 and base.num_hidden_layers == 8
    assert {**vars(deeper), "num_hidden_layers": 8} == vars(base)
