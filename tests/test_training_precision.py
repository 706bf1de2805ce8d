"""train.py --precision: bfloat16 only where the device multiplies it natively (an AVX2 CPU emulates
bfloat16 matmuls, 46x slower than float32 on the Zen 3 this was measured on)."""

from __future__ import annotations

import pytest
import torch

from training.train import resolve_precision


@pytest.mark.parametrize("native", [True, False])
def test_auto_takes_bfloat16_only_where_onednn_computes_it(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    assert resolve_precision("auto") == ("bfloat16" if native else "float32")
    # An explicit choice is kept either way (to reproduce a run made on the other kind of CPU).
    assert resolve_precision("bfloat16") == "bfloat16"
    assert resolve_precision("float32") == "float32"


@pytest.mark.parametrize("bf16", [True, False])
def test_auto_precision_on_a_gpu_follows_its_bfloat16_support(
    monkeypatch: pytest.MonkeyPatch, bf16: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    expected = "bfloat16" if bf16 else "float32"
    assert resolve_precision("auto", torch.device("cuda")) == expected
    assert resolve_precision("float32", torch.device("cuda")) == "float32"
