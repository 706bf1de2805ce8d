"""oneDNN-packed CPU weights against plain F.linear, and the fallback when packing is unavailable."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

from brisklm.models import packed_weights
from brisklm.models.layers import Linear

TOLERANCES = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def needs_packing(dtype: torch.dtype) -> None:
    if not packed_weights.packing_supported(dtype):
        pytest.skip(f"oneDNN weight packing is not available for {dtype} on this machine")


@pytest.fixture
def fresh_probe():
    packed_weights.packing_supported.cache_clear()
    yield
    packed_weights.packing_supported.cache_clear()


@pytest.mark.parametrize("dtype", sorted(TOLERANCES, key=str))
@pytest.mark.parametrize("shape", [(1, 96), (8, 96), (2, 5, 96), (0, 96), (300, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(dtype, shape, bias):
    needs_packing(dtype)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 96, generator=gen).to(dtype)
    b = torch.randn(200, generator=gen).to(dtype) if bias else None
    x = torch.randn(*shape, generator=gen).to(dtype)
    packed = packed_weights.pack(weight)
    assert packed.shape == weight.shape and packed.dtype == dtype
    got = packed_weights.packed_linear(x, packed, b)
    expected = F.linear(x, weight, b)
    assert got.shape == expected.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCES[dtype], rtol=1e-2)
    assert torch.equal(packed_weights.unpack(packed), weight)


def test_non_contiguous_input():
    needs_packing(torch.float32)
    weight = torch.randn(64, 48)
    x = torch.randn(4, 96)[:, ::2]
    got = packed_weights.packed_linear(x, packed_weights.pack(weight), None)
    torch.testing.assert_close(got, F.linear(x, weight), atol=2e-5, rtol=1e-4)


def test_linear_layer_packs_once_and_keeps_its_values():
    needs_packing(torch.float32)
    layer = Linear(96, [64, 32], bias=True, min_pack_bytes=0)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    dense = layer.weight.detach().clone()
    x = torch.randn(3, 96)
    before = layer(x)
    layer.finalize()
    assert layer.is_packed and layer.weight.is_mkldnn
    layer.finalize()  # idempotent: a second call leaves the packed weight alone
    assert torch.equal(layer.dense_weight(), dense)
    torch.testing.assert_close(layer(x), before, atol=2e-5, rtol=1e-4)


def test_packed_layer_deep_copies():
    needs_packing(torch.float32)
    layer = Linear(96, [64], bias=True, min_pack_bytes=0)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    layer.finalize()
    clone = copy.deepcopy(layer)
    assert clone.is_packed and clone.weight is not layer.weight and clone.bias is not layer.bias
    x = torch.randn(2, 96)
    assert torch.equal(clone(x), layer(x))
    assert torch.equal(clone.dense_weight(), layer.dense_weight())


def test_strided_layers_are_not_packed():
    layer = Linear(96, [64], bias=False, pack_on_cpu=False)
    torch.nn.init.normal_(layer.weight)
    dense = layer.weight.detach().clone()
    layer.finalize()
    assert not layer.is_packed
    assert layer.weight.stride() == (1, 64)  # column-major, values unchanged
    assert torch.equal(layer.weight, dense)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unpacked_half_precision_weights_keep_the_row_layout(dtype, monkeypatch):
    # Column-major F.linear is ~100x slower in float16 and 2x slower in bfloat16 on x86 CPUs.
    monkeypatch.setattr(packed_weights, "packing_supported", lambda dtype: False)
    layer = Linear(96, [64], bias=False).to(dtype)
    layer.finalize()
    assert not layer.is_packed and layer.weight.is_contiguous()


def test_small_float32_weights_stay_column_major(monkeypatch):
    needs_packing(torch.float32)
    size = 64 * 96 * 4
    monkeypatch.setattr(packed_weights, "MIN_FLOAT32_BYTES", size)
    small, exact = Linear(96, [63], bias=False), Linear(96, [64], bias=False)
    for layer in (small, exact):
        torch.nn.init.normal_(layer.weight)
        layer.finalize()
    assert not small.is_packed and small.weight.stride() == (1, 63)
    assert exact.is_packed
    forced = Linear(96, [63], bias=False, min_pack_bytes=0)
    forced.finalize()
    assert forced.is_packed


def test_default_threshold_packs_every_float32_and_bfloat16_weight():
    # Every weight is packed: the packed product is batch-invariant, MKL's is not.
    assert packed_weights.MIN_FLOAT32_BYTES == 0
    assert packed_weights.worth_packing(torch.empty(16, 16))
    assert packed_weights.worth_packing(torch.empty(16, 16, dtype=torch.bfloat16))
    assert not packed_weights.worth_packing(torch.empty(255, 1024), min_bytes=1 << 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_product_rows_do_not_depend_on_the_row_count(dtype):
    # What makes a seeded request's tokens independent of its batch (with per-row attention).
    needs_packing(dtype)
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(320, 192, generator=generator).to(dtype)
    packed = packed_weights.pack(weight)
    x = torch.randn(16, 192, generator=generator).to(dtype)
    alone = packed_weights.packed_linear(x[:1], packed, None)
    for rows in (2, 3, 4, 8, 16):
        assert torch.equal(packed_weights.packed_linear(x[:rows], packed, None)[:1], alone)


def test_float16_is_never_packed():
    # oneDNN packs float16 only on CPUs with avx512_fp16; we keep it on the strided path everywhere.
    assert not packed_weights.packing_supported(torch.float16)


def test_probe_falls_back_when_packing_raises(monkeypatch, fresh_probe, caplog):
    def broken(weight):
        raise RuntimeError("no kernel for this CPU")

    monkeypatch.setattr(packed_weights, "pack", broken)
    with caplog.at_level(logging.INFO, logger=packed_weights.__name__):
        assert not packed_weights.packing_supported(torch.float32)
    assert "no kernel for this CPU" in caplog.text
    layer = Linear(32, [16], bias=False, min_pack_bytes=0)
    torch.nn.init.normal_(layer.weight)
    layer.finalize()
    assert not layer.is_packed and layer.weight.stride() == (1, 16)


def test_probe_rejects_wrong_results(monkeypatch, fresh_probe, caplog):
    if not packed_weights._ops_available():
        pytest.skip("oneDNN linear ops are not in this torch build")
    monkeypatch.setattr(
        packed_weights, "packed_linear", lambda x, packed, bias: torch.zeros(x.shape[0], 48)
    )
    with caplog.at_level(logging.WARNING, logger=packed_weights.__name__):
        assert not packed_weights.packing_supported(torch.float32)
    assert "disagrees" in caplog.text
