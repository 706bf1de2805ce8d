"""The native kernels' attention on its own (brisk_test_attention: the forward pass's attention
phase) against a float64 reference over the same cache elements: every cache type, head sizes for
each of its paths, grouped heads (one, several and more units per group), sliding windows, and a
batch of rows of 1, 6 and 40 tokens at other slots and positions."""

from __future__ import annotations

import ctypes

import pytest
import torch

from brisklm.kernels import native
from tests.models.conftest import BUILDS, NO_SHUFFLEVECTOR

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")

MAX_SEQ_LEN = 300
# (head_dim, query heads, KV heads): 4-key scores (20, 36: not a multiple of 8), 64-float blocks of
# values (64), a block and a remainder (72), two blocks and a remainder (136); a bfloat16 cache
# read in pairs of 16 (AVX2: 64, 160) and of 32 elements (AVX-512: 64; 160, over two blocks of
# MAX_REG_DIM columns); one query head per KV head, two, three, and 18 (more than a unit's 16
# queries).
SHAPES = [(20, 4, 4), (36, 6, 2), (64, 6, 2), (72, 18, 1), (136, 2, 1), (160, 4, 2)]
# (slot, first position, tokens) of the rows of the batch.
ROWS = [(2, 150, 6), (0, 40, 1), (1, 100, 40), (3, 0, 2)]
SLOTS = [slot for slot, _, n in ROWS for _ in range(n)]
POSITIONS = [start + i for _, start, n in ROWS for i in range(n)]


def reference(queries, keys, values, positions, slots, window, scale):
    """(tokens, heads, d) float64 attention of each token's heads over its slot's cache."""
    tokens, heads, d = queries.shape
    group = heads // keys.shape[1]
    out = torch.empty(tokens, heads, d, dtype=torch.float64)
    for t in range(tokens):
        p = positions[t]
        lo = max(0, p - window + 1) if window > 0 else 0
        k = keys[slots[t], :, lo : p + 1].double().repeat_interleave(group, 0)  # (heads, keys, d)
        v = values[slots[t], :, lo : p + 1].double().repeat_interleave(group, 0)
        weights = torch.softmax((k @ queries[t].double().unsqueeze(-1)).squeeze(-1) * scale, -1)
        out[t] = (weights.unsqueeze(-1) * v).sum(1)
    return out


def attend(lib, keys, values, qkv, heads, window, threads) -> torch.Tensor:
    """(tokens, heads * d) attention of ROWS' tokens through ``lib``'s brisk_test_attention."""
    kv_heads, d = keys.shape[1], keys.shape[-1]
    tokens = len(SLOTS)
    attn = torch.full((tokens, heads * d), float("nan"))
    scratch = torch.empty(threads, native.attention_space(MAX_SEQ_LEN, d))
    slots_t, positions_t = torch.tensor(SLOTS), torch.tensor(POSITIONS)
    window_t = torch.tensor([window], dtype=torch.int32)
    k_table = (ctypes.c_void_p * 1)(keys.data_ptr())
    v_table = (ctypes.c_void_p * 1)(values.data_ptr())
    args = native.ForwardArgs()
    args.n_tokens, args.n_heads, args.n_kv_heads, args.head_dim = tokens, heads, kv_heads, d
    args.n_threads, args.max_seq_len, args.scale = threads, MAX_SEQ_LEN, d**-0.5
    args.slots, args.positions = slots_t.data_ptr(), positions_t.data_ptr()
    args.qkv, args.attn, args.scores = qkv.data_ptr(), attn.data_ptr(), scratch.data_ptr()
    args.k_cache, args.v_cache = ctypes.addressof(k_table), ctypes.addressof(v_table)
    args.window, args.cache_type = window_t.data_ptr(), native.WEIGHT_TYPES[keys.dtype]
    lib.brisk_test_attention.argtypes = [ctypes.POINTER(native.ForwardArgs)]
    assert lib.brisk_test_attention(ctypes.byref(args)) == 0
    return attn


def inputs(shape, cache_dtype):
    d, heads, kv_heads = shape
    generator = torch.Generator().manual_seed(d * 7 + heads)
    cache_shape = (4, kv_heads, MAX_SEQ_LEN, d)
    keys = (torch.randn(cache_shape, generator=generator) * 2).to(cache_dtype)
    values = torch.randn(cache_shape, generator=generator).to(cache_dtype)
    qkv = torch.randn(len(SLOTS), (heads + 2 * kv_heads) * d, generator=generator)
    return keys, values, qkv


@pytest.mark.parametrize("build", [*sorted(BUILDS), NO_SHUFFLEVECTOR])
@pytest.mark.parametrize(
    "cache_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=lambda t: str(t)[6:]
)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s[0]}-{s[1]}q-{s[2]}kv")
@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_attention_matches_a_float64_reference(request, build, cache_dtype, shape, window, threads):
    lib = request.getfixturevalue("native_build")(build)
    d, heads, _ = shape
    keys, values, qkv = inputs(shape, cache_dtype)
    attn = attend(lib, keys, values, qkv, heads, window, threads)
    queries = qkv[:, : heads * d].view(len(SLOTS), heads, d)
    expected = reference(queries, keys, values, POSITIONS, SLOTS, window, d**-0.5)
    # float32 sums over up to 190 keys of values ~1: ~1e-6; a wrong key, weight or order of
    # outputs moves them by O(0.1), a slightly wrong scale of some outputs by 1e-4 and more.
    torch.testing.assert_close(
        attn.view(len(SLOTS), heads, d).double(), expected, atol=2e-5, rtol=0
    )


@pytest.mark.parametrize("build", [*sorted(BUILDS), NO_SHUFFLEVECTOR])
@pytest.mark.parametrize("shape", [(64, 6, 2), (72, 18, 1)], ids=lambda s: f"d{s[0]}-{s[1]}q")
def test_attention_bits_do_not_depend_on_the_threads_or_the_units(request, build, shape):
    """1-3 threads, and 64: for the 6/2 heads more threads than units (24), so that every query
    is a unit of its own; the 18 heads on one KV head split between units (98)."""
    lib = request.getfixturevalue("native_build")(build)
    keys, values, qkv = inputs(shape, torch.bfloat16)
    one = attend(lib, keys, values, qkv, shape[1], 37, 1)
    for threads in (2, 3, 64):
        assert torch.equal(attend(lib, keys, values, qkv, shape[1], 37, threads), one), threads


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_the_scratch_size_is_the_kernels(request, build):
    lib = request.getfixturevalue("native_build")(build)
    for max_seq_len, d in [(1, 2), (300, 64), (131072, 136)]:
        assert lib.brisk_attention_floats(max_seq_len, d) == native.attention_space(max_seq_len, d)
