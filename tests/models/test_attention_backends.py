"""Attention backends against the plain-torch reference, and the backend choice with its fallbacks."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from brisklm.attention import AttentionMetadata, ReferenceAttention, SdpaAttention, select_backend

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, MAX_LEN, NUM_SLOTS = 4, 2, 16, 40, 5

CASES = {
    # name: (slots, start positions, query lengths)
    "prefill one row": ([0], [0], [9]),
    "decode uniform": ([0, 1, 2], [7, 7, 7], [1, 1, 1]),
    "decode ragged lengths": ([3, 0, 4], [5, 11, 2], [1, 1, 1]),
    "ragged prefill": ([1, 2, 0], [0, 0, 0], [6, 2, 9]),
    "extend at offsets (speculative verify)": ([4, 1], [10, 3], [5, 2]),
    "mixed prefill and decode": ([2, 3], [0, 20], [8, 1]),
}


def run(backend, slots, starts, lens, window, seed=0, device="cpu", stepwise=None):
    generator = torch.Generator().manual_seed(seed)
    shape = (NUM_SLOTS, NUM_KV_HEADS, MAX_LEN, HEAD_DIM)
    # Prior cache contents are random: every row attends to keys written before this pass.
    # Drawn on the CPU whatever the device, so that every device gets the same numbers.
    shapes = [shape, shape, (sum(lens), NUM_HEADS, HEAD_DIM)] + 2 * [
        (sum(lens), NUM_KV_HEADS, HEAD_DIM)
    ]
    k_cache, v_cache, q, k, v = (torch.randn(s, generator=generator).to(device) for s in shapes)
    meta = AttentionMetadata.build(slots, starts, lens, device, stepwise=stepwise)
    out = backend.forward(q, k, v, k_cache, v_cache, meta, window)
    return out, k_cache, v_cache


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sdpa_matches_reference(case, window):
    slots, starts, lens = CASES[case]
    expected, k_ref, v_ref = run(ReferenceAttention(), slots, starts, lens, window)
    got, k_sdpa, v_sdpa = run(SdpaAttention(), slots, starts, lens, window)
    assert got.shape == (sum(lens), NUM_HEADS * HEAD_DIM)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(k_sdpa, k_ref) and torch.equal(v_sdpa, v_ref)  # identical cache writes


@pytest.mark.parametrize("backend", [ReferenceAttention(), SdpaAttention()], ids=["ref", "sdpa"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("case", ["ragged prefill", "extend at offsets (speculative verify)"])
def test_row_invariant_rows_come_out_with_the_bits_of_each_row_alone(backend, case, window):
    """A batch holding a seeded request: each row as alone. The reference backend attended over
    keys padded to the longest row (~2e-6 apart from alone; found by an audit)."""
    slots, starts, lens = CASES[case]
    generator = torch.Generator().manual_seed(5)
    shape = (NUM_SLOTS, NUM_KV_HEADS, MAX_LEN, HEAD_DIM)
    cache = [torch.randn(shape, generator=generator) for _ in range(2)]
    n = sum(lens)
    q = torch.randn(n, NUM_HEADS, HEAD_DIM, generator=generator) * 4
    k, v = (torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    meta = AttentionMetadata.build(slots, starts, lens, "cpu", row_invariant=True)
    got = backend.forward(q, k, v, *(c.clone() for c in cache), meta, window)
    first = 0
    for slot, start, length in zip(slots, starts, lens):
        part = slice(first, first + length)
        alone = AttentionMetadata.build([slot], [start], [length], "cpu", row_invariant=True)
        expected = backend.forward(
            q[part], k[part], v[part], *(c.clone() for c in cache), alone, window
        )
        assert torch.equal(got[part], expected), (slot, start, length)
        first += length


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("row_invariant", [False, True])
def test_stepwise_rows_attend_as_their_decode_steps(window, row_invariant):
    """A verification row's queries come out with the bits of one-token decode steps at their
    positions (the masked k+1-query call rounds differently); the other rows as alone."""
    slots, starts, lens = [4, 1, 2], [10, 3, 0], [5, 1, 6]
    generator = torch.Generator().manual_seed(3)
    shape = (NUM_SLOTS, NUM_KV_HEADS, MAX_LEN, HEAD_DIM)
    cache = [torch.randn(shape, generator=generator) for _ in range(2)]
    n = sum(lens)
    q = torch.randn(n, NUM_HEADS, HEAD_DIM, generator=generator)
    k, v = (torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    sdpa = SdpaAttention()
    k_cache, v_cache = (c.clone() for c in cache)
    meta = AttentionMetadata.build(
        slots, starts, lens, "cpu", row_invariant, stepwise=[True, True, False]
    )
    assert meta.stepwise == (True, False, False)  # a one-token row is a decode step already
    got = sdpa.forward(q, k, v, k_cache, v_cache, meta, window)
    masked = sdpa.forward(
        q,
        k,
        v,
        *(c.clone() for c in cache),
        AttentionMetadata.build(slots, starts, lens, "cpu"),
        window,
    )
    # Decode steps one after another on a fresh cache, then the other rows alone.
    k_steps, v_steps = (c.clone() for c in cache)
    steps = []
    for t in range(5):
        one = AttentionMetadata.build([4], [10 + t], [1], "cpu")
        steps.append(
            sdpa.forward(q[t : t + 1], k[t : t + 1], v[t : t + 1], k_steps, v_steps, one, window)
        )
    for slot, start, length, first in ((1, 3, 1, 5), (2, 0, 6, 6)):
        alone = AttentionMetadata.build([slot], [start], [length], "cpu")
        part = slice(first, first + length)
        steps.append(sdpa.forward(q[part], k[part], v[part], k_steps, v_steps, alone, window))
    assert torch.equal(got, torch.cat(steps))
    assert torch.equal(k_cache, k_steps) and torch.equal(v_cache, v_steps)
    torch.testing.assert_close(got, masked, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one entry per row"):
        AttentionMetadata.build(slots, starts, lens, "cpu", stepwise=[True])


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa", "xformers"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_backends_match_the_reference(case, window, name):
    """On a CUDA device in float32, SDPA and xformers against the reference run on the CPU."""
    backend = select_backend(name, torch.device("cuda"))
    if backend.name != name:
        pytest.skip(f"{name} does not run on this machine (SDPA was chosen instead)")
    slots, starts, lens = CASES[case]
    expected, k_ref, v_ref = run(ReferenceAttention(), slots, starts, lens, window)
    got, k_cuda, v_cuda = run(backend, slots, starts, lens, window, device="cuda")
    assert got.device.type == "cuda" and got.shape == (sum(lens), NUM_HEADS * HEAD_DIM)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(k_cuda.cpu(), k_ref) and torch.equal(v_cuda.cpu(), v_ref)


def test_reference_is_plain_softmax_attention():
    """The reference itself, against attention written out by hand for one ragged case."""
    slots, starts, lens = CASES["extend at offsets (speculative verify)"]
    out, k_cache, v_cache = run(ReferenceAttention(), slots, starts, lens, None)
    generator = torch.Generator().manual_seed(0)
    shape = (NUM_SLOTS, NUM_KV_HEADS, MAX_LEN, HEAD_DIM)
    torch.randn(shape, generator=generator)
    torch.randn(shape, generator=generator)
    q = torch.randn(sum(lens), NUM_HEADS, HEAD_DIM, generator=generator)
    token = 0
    for slot, start, length in zip(slots, starts, lens):
        for t in range(length):
            position = start + t
            for head in range(NUM_HEADS):
                kv_head = head // (NUM_HEADS // NUM_KV_HEADS)
                keys = k_cache[slot, kv_head, : position + 1]
                values = v_cache[slot, kv_head, : position + 1]
                weights = torch.softmax(keys @ q[token, head] / HEAD_DIM**0.5, dim=0)
                expected = weights @ values
                got = out[token, head * HEAD_DIM : (head + 1) * HEAD_DIM]
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            token += 1


def test_backend_choice_and_fallback(caplog):
    cpu = torch.device("cpu")
    assert isinstance(select_backend("auto", cpu), SdpaAttention)
    assert isinstance(select_backend("reference", cpu), ReferenceAttention)
    with caplog.at_level(logging.WARNING, logger="brisklm.attention"):
        backend = select_backend("xformers", cpu)
    assert isinstance(backend, SdpaAttention)
    assert "xformers attention unavailable, using SDPA" in caplog.text and "CUDA" in caplog.text
    with pytest.raises(ValueError, match="auto, sdpa, xformers, reference"):
        select_backend("flash", cpu)


class FakeXformersOps:
    """xformers' memory_efficient_attention written out in torch, for the CPU: the grouped 5-D call
    the backend makes, (B, M, G, H, D) queries, (B, S, G, H, D) keys and values, a (B, G, H, M, S)
    additive bias. ``refuse`` names dtypes it has no operator for; ``ignore_bias`` makes it wrong."""

    def __init__(self, refuse=(), ignore_bias=False):
        self.refuse, self.ignore_bias, self.calls = refuse, ignore_bias, []

    def memory_efficient_attention(self, q, k, v, attn_bias):
        self.calls.append((q.dtype, tuple(q.shape)))
        if q.dtype in self.refuse:
            raise NotImplementedError(
                f"No operator found for `memory_efficient_attention_forward` ({q.dtype})"
            )
        assert q.dim() == k.dim() == v.dim() == 5 and attn_bias.dim() == 5
        scores = torch.einsum("bmghd,bsghd->bghms", q.float(), k.float()) / q.shape[-1] ** 0.5
        if not self.ignore_bias:
            scores = scores + attn_bias.float()
        out = torch.einsum("bghms,bsghd->bmghd", scores.softmax(-1), v.float())
        return out.to(q.dtype)


@pytest.fixture
def fake_xformers(monkeypatch):
    import sys
    import types

    from brisklm.attention.xformers import probe_xformers

    def install(**kwargs):
        ops = FakeXformersOps(**kwargs)
        package = types.ModuleType("xformers")
        package.ops = ops
        monkeypatch.setitem(sys.modules, "xformers", package)
        monkeypatch.setitem(sys.modules, "xformers.ops", ops)
        probe_xformers.cache_clear()
        return ops

    yield install
    probe_xformers.cache_clear()


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_xformers_layout_and_bias_match_the_reference(case, window, fake_xformers):
    """The backend's grouped layout, ragged rows and padded bias, through the attention xformers
    computes (written out in torch), against the reference: CI's only run of xformers.py."""
    from brisklm.attention.xformers import XformersAttention

    fake_xformers()
    slots, starts, lens = CASES[case]
    expected, k_ref, v_ref = run(ReferenceAttention(), slots, starts, lens, window)
    got, k_x, v_x = run(XformersAttention(), slots, starts, lens, window)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(k_x, k_ref) and torch.equal(v_x, v_ref)


def test_the_xformers_probe_makes_the_models_call(fake_xformers):
    """An xformers without an operator for the model's dtype (bfloat16 before Ampere) or head layout
    fails the probe, whatever a float16 call of another shape does; a wrong result fails it too."""
    from brisklm.attention.xformers import probe_xformers

    cpu = torch.device("cpu")
    ops = fake_xformers(refuse=(torch.bfloat16,))
    assert probe_xformers(cpu, torch.float16) is None
    reason = probe_xformers(cpu, torch.bfloat16, 8, 2, 128)
    assert "NotImplementedError" in reason and "No operator found" in reason
    assert (
        torch.bfloat16,
        (2, 9, 2, 4, 128),
    ) in ops.calls  # 8 heads over 2 kv heads, head size 128
    fake_xformers(ignore_bias=True)
    assert "differs from SDPA" in probe_xformers(cpu, torch.float32)


def test_the_runner_probes_xformers_with_its_models_layout(tmp_path, monkeypatch):
    from brisklm.attention import SdpaAttention
    from brisklm.engine import model_runner
    from brisklm.loader import load_model
    from tests.tiny import make_tiny_checkpoint

    seen = {}

    def spy(name, device, **layout):
        seen.update(layout, name=name)
        return SdpaAttention()

    monkeypatch.setattr(model_runner, "select_backend", spy)
    model = load_model(
        make_tiny_checkpoint(tmp_path), device="cpu", dtype=torch.bfloat16, show_progress=False
    )
    model_runner.ModelRunner(model, num_slots=1, max_seq_len=32, attention_backend="xformers")
    config = model.config
    assert seen == {
        "name": "xformers",
        "dtype": model.activation_dtype,  # what attention computes in
        "num_heads": config.num_attention_heads,
        "num_kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
    }


@pytest.mark.parametrize(
    ("dtype", "masked", "device_type", "repeated"),
    [
        (torch.float32, True, "cpu", False),  # CPU: enable_gqa, as it was
        (torch.float32, False, "cpu", False),
        (torch.bfloat16, False, "cuda", False),  # flash attention takes grouped heads
        (torch.bfloat16, True, "cuda", True),  # masked: the math kernel would take enable_gqa
        (torch.float32, False, "cuda", True),  # float32: no fused kernel groups heads
    ],
)
def test_sdpa_repeats_kv_heads_where_cuda_would_fall_back_to_its_math_kernel(
    dtype, masked, device_type, repeated
):
    from brisklm.attention.sdpa import kv_heads_for_sdpa

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 5, 16, generator=generator).to(dtype)
    k = torch.randn(2, 2, 7, 16, generator=generator).to(dtype)
    v = torch.randn(2, 2, 7, 16, generator=generator).to(dtype)
    mask = torch.rand(2, 1, 5, 7, generator=generator) > 0.3 if masked else None
    if mask is not None:
        mask[..., 0] = True  # every query sees a key
    keys, values, gqa = kv_heads_for_sdpa(k, v, 8, masked, device_type)
    assert gqa is not repeated and keys.shape[1] == (8 if repeated else 2)
    got = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, expected)
    # One KV head a query head: nothing to group.
    keys, values, gqa = kv_heads_for_sdpa(q, q, 8, masked, device_type)
    assert keys is q and values is q and not gqa
