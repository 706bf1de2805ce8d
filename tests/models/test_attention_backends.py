"""Attention backends against the plain-torch reference, and the backend choice with its fallbacks."""

from __future__ import annotations

import logging

import pytest
import torch

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


def run(backend, slots, starts, lens, window, seed=0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    shape = (NUM_SLOTS, NUM_KV_HEADS, MAX_LEN, HEAD_DIM)
    # Prior cache contents are random: every row attends to keys written before this pass.
    # Drawn on the CPU whatever the device, so that every device gets the same numbers.
    shapes = [shape, shape, (sum(lens), NUM_HEADS, HEAD_DIM)] + 2 * [
        (sum(lens), NUM_KV_HEADS, HEAD_DIM)
    ]
    k_cache, v_cache, q, k, v = (torch.randn(s, generator=generator).to(device) for s in shapes)
    meta = AttentionMetadata.build(slots, starts, lens, device)
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
