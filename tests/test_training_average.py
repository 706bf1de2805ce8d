"""training/average.py: the mean of checkpoints, tensor by tensor, in each tensor's dtype; the
other files come from the first; checkpoints that do not match are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from training.average import average_checkpoints


def checkpoint(path: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    path.mkdir()
    save_file(tensors, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config or {"hidden_size": 4}))
    (path / "tokenizer.json").write_text(f'{{"from": "{path.name}"}}')
    return path


def test_average_is_the_mean_in_each_tensors_dtype(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    w = [torch.randn(3, 4, generator=g) for _ in range(3)]
    dirs = [
        checkpoint(tmp_path / f"c{i}", {"w": w[i].to(torch.bfloat16), "b": w[i][0].clone()})
        for i in range(3)
    ]
    average_checkpoints(dirs, tmp_path / "out")
    got = load_file(tmp_path / "out" / "model.safetensors")
    mean_bf16 = sum(x.to(torch.bfloat16).float() for x in w) / 3
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], mean_bf16.to(torch.bfloat16))
    assert got["b"].dtype == torch.float32
    torch.testing.assert_close(got["b"], sum(x[0] for x in w) / 3)
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"from": "c0"}'


def test_mismatched_checkpoints_are_refused_by_name(tmp_path: Path) -> None:
    a = checkpoint(tmp_path / "a", {"w": torch.zeros(2, 2)})
    cases = {
        "other tensors": checkpoint(tmp_path / "names", {"v": torch.zeros(2, 2)}),
        "w is torch.float32 \\(2, 3\\)": checkpoint(tmp_path / "shape", {"w": torch.zeros(2, 3)}),
        "config.json differs": checkpoint(
            tmp_path / "config", {"w": torch.zeros(2, 2)}, {"hidden_size": 8}
        ),
    }
    for message, other in cases.items():
        with pytest.raises(ValueError, match=message):
            average_checkpoints([a, other], tmp_path / "out")
    with pytest.raises(ValueError, match="at least two"):
        average_checkpoints([a], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_checkpoints_written_by_other_transformers_versions_average(tmp_path: Path) -> None:
    a = checkpoint(tmp_path / "a", {"w": torch.zeros(2)}, {"transformers_version": "5.24.0"})
    b = checkpoint(tmp_path / "b", {"w": torch.ones(2)}, {"transformers_version": "5.25.0"})
    average_checkpoints([a, b], tmp_path / "out")
    assert torch.equal(
        load_file(tmp_path / "out" / "model.safetensors")["w"], torch.full((2,), 0.5)
    )
