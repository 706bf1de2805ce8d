"""Fixtures for the GPTQ int4 tests: random GPTQ tensors in every supported variant."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from brisklm.quant import GPTQTensors, default_g_idx, pack_gptq

MakeGPTQ = Callable[..., GPTQTensors]


def random_gptq(
    in_features: int,
    out_features: int,
    group_size: int,
    *,
    act_order: bool = False,
    sym: bool = False,
    checkpoint_format: str = "gptq",
    seed: int = 0,
) -> GPTQTensors:
    """Random but valid GPTQ tensors. act_order: g_idx is a random permutation of k // group_size
    (equal-sized groups in scrambled column order, as GPTQ's act-order writes it). Asymmetric zeros
    cover 1..15 (v1 cannot store 0) and also 0 for gptq_v2."""
    gen = torch.Generator().manual_seed(seed)
    size = in_features if group_size == -1 else group_size
    num_groups = -(-in_features // size)
    q = torch.randint(0, 16, (out_features, in_features), generator=gen)
    if sym:
        zeros = torch.full((num_groups, out_features), 8)
    else:
        low = 0 if checkpoint_format == "gptq_v2" else 1
        zeros = torch.randint(low, 16, (num_groups, out_features), generator=gen)
    scales = (torch.rand(num_groups, out_features, generator=gen) * 0.05 + 0.002).half()
    g_idx = default_g_idx(in_features, size)
    if act_order:
        g_idx = g_idx[torch.randperm(in_features, generator=gen)]
    return pack_gptq(q, zeros, scales, g_idx, checkpoint_format=checkpoint_format)


@pytest.fixture
def make_gptq() -> MakeGPTQ:
    return random_gptq


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for modules of tiny models: their ops are too small to split, and on a
    loaded machine thread synchronisation makes GPTQ's column loop several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
