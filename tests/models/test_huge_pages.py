"""Tensors on transparent huge pages (brisklm.kernels.huge_pages): what they hold, where they live,
and that the native pass computes the same bits with its weights and cache there."""

from __future__ import annotations

import gc

import pytest
import torch

from brisklm.cache.contiguous import KVCache
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.kernels import huge_pages, native
from brisklm.loader import load_model
from tests.hf_models import build_hf_model, save_hf_model

HUGE = huge_pages.HUGE_PAGE
needs_huge_pages = pytest.mark.skipif(
    not huge_pages.available(), reason="this machine gives no transparent huge pages"
)


@needs_huge_pages
def test_a_large_tensor_starts_on_a_huge_page_and_its_whole_huge_pages_are_backed():
    tensor = huge_pages.empty((3, 1024, 1024), torch.float32)  # 12 MB: six huge pages
    assert tensor.shape == (3, 1024, 1024) and tensor.dtype == torch.float32
    assert tensor.is_contiguous() and tensor.data_ptr() % HUGE == 0
    tensor.fill_(1.5)  # pages are given when first touched
    assert huge_pages.backed_by_huge_pages(tensor) == 6 * HUGE


@needs_huge_pages
def test_a_tail_under_one_huge_page_stays_on_small_pages():
    tensor = huge_pages.zeros((1000, 1000), torch.float32)  # 4,000,000 bytes: one huge page
    assert tensor.abs().sum().item() == 0.0
    tensor.fill_(3.0)  # (zeros are not written: pages are given when first written)
    assert huge_pages.backed_by_huge_pages(tensor) == HUGE


def test_contents_live_as_long_as_any_view():
    tensor = huge_pages.empty((1024, 1024), torch.float32)
    tensor.copy_(torch.arange(1024 * 1024, dtype=torch.float32).view(1024, 1024))
    view = tensor[100:102]
    del tensor
    gc.collect()
    torch.empty(4 << 20, dtype=torch.uint8).fill_(7)  # memory freed now would be reused here
    assert view[1, 5].item() == 101 * 1024 + 5
    assert torch.equal(view[0], torch.arange(100 * 1024, 101 * 1024, dtype=torch.float32))


def test_small_tensors_and_the_switch_take_torchs_memory(monkeypatch):
    small = huge_pages.empty((100, 100), torch.float32)
    assert small.shape == (100, 100) and huge_pages.backed_by_huge_pages(small) == 0
    monkeypatch.setenv(huge_pages.ENV_SWITCH, "0")
    assert not huge_pages.available()
    large = huge_pages.zeros((2, 1024, 1024), torch.float32)
    assert large.abs().sum().item() == 0.0
    large.fill_(1.0)
    assert huge_pages.backed_by_huge_pages(large) == 0


def test_a_kernel_set_to_never_is_not_asked(monkeypatch, tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "_SETTING", setting)
    huge_pages._kernel_offers_them.cache_clear()
    try:
        assert not huge_pages.available()
        tensor = huge_pages.empty((2, 1024, 1024), torch.float32).fill_(2.0)
        assert huge_pages.backed_by_huge_pages(tensor) == 0
        assert tensor.sum().item() == 2.0 * 2 * 1024 * 1024
    finally:
        monkeypatch.undo()
        huge_pages._kernel_offers_them.cache_clear()


def test_packing_gives_the_panel_layout_on_huge_pages():
    weight = torch.randn(1000, 700)  # 32 panels of 700 x 32 floats: 2.9 MB
    packed = native.pack(weight)
    assert packed.shape == (32, 700, 32) and packed.is_contiguous()
    padded = torch.cat([weight, torch.zeros(24, 700)])
    assert torch.equal(packed, padded.view(32, 32, 700).transpose(1, 2))
    assert torch.equal(native.unpack(packed, 1000), weight)
    if huge_pages.available():
        assert huge_pages.backed_by_huge_pages(packed) == HUGE


@needs_huge_pages
def test_a_large_cpu_kv_cache_is_zeros_on_huge_pages_taken_where_written():
    """The cache's memory is not written at load (a large model's cache took seconds): it reads
    as zeros, and a huge page is taken where a sequence first writes."""
    cache = KVCache(2, 2, 1024, 4, 64, torch.float32, "cpu")  # 4 MB each for keys and values
    for tensor in (cache.keys, cache.values):
        assert huge_pages.backed_by_huge_pages(tensor) == 0
        assert tensor.shape == (2, 2, 4, 1024, 64) and tensor.abs().sum().item() == 0.0
    cache.keys[1, 1, 3, 1023, 63] = 1.0  # the last (layer, slot): the second huge page
    assert huge_pages.backed_by_huge_pages(cache.keys) == HUGE
    assert cache.keys.abs().sum().item() == 1.0 and cache.values.abs().sum().item() == 0.0
    cache.values.fill_(2.0)
    assert huge_pages.backed_by_huge_pages(cache.values) == 2 * HUGE


@pytest.mark.skipif(not native.available(), reason="native kernels do not build here")
def test_the_native_pass_gives_the_same_bits_with_and_without_huge_pages(tmp_path, monkeypatch):
    # Products of 2,048 x 512 and 512 x 1,024 floats: large enough for huge pages.
    directory = save_hf_model(
        build_hf_model(
            "llama",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
        ),
        tmp_path,
    )
    prompt = torch.randint(3, 150, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    logits = []
    for switch in ("1", "0"):
        monkeypatch.setenv(huge_pages.ENV_SWITCH, switch)
        model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
        runner = ModelRunner(model, 2, 64)
        assert runner.native is not None
        gate_up = model.model.layers[0].mlp.gate_up_proj.weight
        on_huge = huge_pages.backed_by_huge_pages(gate_up)
        assert on_huge == (2 * HUGE if switch == "1" and huge_pages.available() else 0)
        with torch.inference_mode():
            first = runner.forward(ForwardBatch([0, 1], [0, 0], [prompt, prompt[:7]], [1, 1]))
            step = runner.forward(ForwardBatch([0, 1], [40, 7], [[9], [11, 12]], [1, 2]))
        logits.append((first, step))
    assert torch.equal(logits[0][0], logits[1][0]) and torch.equal(logits[0][1], logits[1][1])
