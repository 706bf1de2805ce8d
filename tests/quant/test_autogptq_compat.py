"""Independent format check: auto-gptq's own torch QuantLinear reads our tensors as we do, and packs as we do.

auto-gptq (pip install --no-deps auto-gptq==0.7.1) is code we did not write. Importing the package
pulls in accelerate/peft/datasets, so we load only its module auto_gptq/nn_modules/qlinear/qlinear_cuda.py
(imports: torch, numpy, transformers); without a GPU its forward is the pure-torch path
(scales[g_idx] * (q - zeros[g_idx]) with zeros = nibble + 1, the v1 convention).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType

import pytest
import torch

from brisklm.quant import GPTQ, dequantize_gptq, pack_gptq


def load_autogptq_qlinear() -> ModuleType:
    spec = importlib.util.find_spec("auto_gptq")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("auto-gptq not installed (pip install --no-deps auto-gptq==0.7.1)")
    path = Path(spec.submodule_search_locations[0]) / "nn_modules" / "qlinear" / "qlinear_cuda.py"
    module_spec = importlib.util.spec_from_file_location("_autogptq_qlinear_cuda", path)
    module = importlib.util.module_from_spec(module_spec)
    # It logs a warning that its CUDA extension is missing: expected, we want the torch path.
    logging.getLogger("_autogptq_qlinear_cuda").setLevel(logging.ERROR)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quant_linear_cls() -> type:
    return load_autogptq_qlinear().QuantLinear


def autogptq_weight(cls: type, tensors, group_size: int) -> torch.Tensor:
    """The weight [N, K] auto-gptq's QuantLinear computes with, read out by multiplying the identity."""
    num_in, num_out = tensors.qweight.shape[0] * 8, tensors.qweight.shape[1]
    layer = cls(4, group_size, num_in, num_out, bias=False, weight_dtype=torch.float32)
    layer.qweight = tensors.qweight.clone()
    layer.qzeros = tensors.qzeros.clone()
    layer.scales = tensors.scales.float()  # fp16 values, exact in fp32: the product stays exact
    layer.g_idx = tensors.g_idx.clone()
    with torch.no_grad():
        return layer(torch.eye(num_in)).t()


@pytest.mark.parametrize(
    ("group_size", "act_order", "sym"),
    [(32, True, False), (128, False, False), (64, True, True), (-1, False, False)],
)
def test_autogptq_reads_our_tensors(
    make_gptq, quant_linear_cls, group_size: int, act_order: bool, sym: bool
) -> None:
    t = make_gptq(256, 64, group_size, act_order=act_order, sym=sym, seed=group_size + act_order)
    theirs = autogptq_weight(quant_linear_cls, t, group_size)
    assert torch.equal(theirs, dequantize_gptq(*t, checkpoint_format="gptq"))


@pytest.mark.parametrize("act_order", [False, True])
def test_autogptq_packs_like_us(quant_linear_cls, act_order: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    num_in, num_out, group_size = 128, 32, 32
    q = torch.randint(0, 16, (num_out, num_in), generator=gen)
    zeros = torch.randint(1, 16, (num_in // group_size, num_out), generator=gen)  # v1-storable
    scales = (torch.rand(num_in // group_size, num_out, generator=gen) * 0.1 + 0.01).half()
    g_idx = (torch.arange(num_in) // group_size).int()
    if act_order:
        g_idx = g_idx[torch.randperm(num_in, generator=gen)]
    ours = pack_gptq(q, zeros, scales, g_idx, checkpoint_format="gptq")
    # auto-gptq's pack() takes the float weight and [N, G] scales/zeros, and rounds back to q.
    linear = torch.nn.Linear(num_in, num_out, bias=False)
    linear.weight.data = dequantize_gptq(*ours)
    layer = quant_linear_cls(4, group_size, num_in, num_out, bias=False, weight_dtype=torch.float32)
    layer.pack(linear, scales.float().t(), zeros.float().t(), g_idx=g_idx)
    assert torch.equal(layer.qweight, ours.qweight)
    assert torch.equal(layer.qzeros, ours.qzeros)


def test_autogptq_reads_our_quantizer_output(quant_linear_cls) -> None:
    gen = torch.Generator().manual_seed(8)
    weight = torch.randn(64, 256, generator=gen) * 0.05
    gptq = GPTQ(weight)
    gptq.add_batch(torch.randn(512, 256, generator=gen) * torch.rand(256, generator=gen) * 3)
    for sym in (True, False):
        result = gptq.quantize(group_size=64, sym=sym, act_order=True)
        theirs = autogptq_weight(quant_linear_cls, result.tensors, 64)
        assert torch.equal(theirs, result.dequantized)
