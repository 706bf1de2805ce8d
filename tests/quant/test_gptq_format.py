"""GPTQ tensor format: packing bit layout, round trips, v1/v2 zeros, reference dequantize."""

from __future__ import annotations

import pytest
import torch

from brisklm.quant import (
    GPTQLinear,
    dequantize_gptq,
    pack_gptq,
    pack_int4,
    pack_qweight,
    pack_qzeros,
    qzeros_v1_to_v2,
    qzeros_v2_to_v1,
    unpack_int4,
    unpack_qweight,
    unpack_qzeros,
)
from brisklm.quant.gptq_format import check_gptq_tensors
from tests.quant.conftest import random_gptq


def test_bit_layout_matches_the_documented_format() -> None:
    # Input k = 8r + m sits at bits 4m..4m+3 of qweight row r.
    q = torch.arange(8).reshape(8, 1)  # k = 0..7, one output column
    assert pack_qweight(q).tolist() == [[0x76543210]]
    # Nibble 7 >= 8 makes the word negative as int32: 0xF0000000 | ...
    q = torch.tensor([0, 0, 0, 0, 0, 0, 0, 15]).reshape(8, 1)
    assert pack_qweight(q).item() == 0xF0000000 - (1 << 32)
    # qzeros: output n = 8c + m at bits 4m of column c.
    zeros = torch.arange(16).reshape(1, 16)
    assert pack_qzeros(zeros, checkpoint_format="gptq_v2").tolist() == [
        [0x76543210, 0xFEDCBA98 - (1 << 32)]
    ]
    # v1 stores zero - 1: true zeros 1..8 are nibbles 0..7.
    assert pack_qzeros(torch.arange(1, 9).reshape(1, 8), checkpoint_format="gptq").tolist() == [
        [0x76543210]
    ]


@pytest.mark.parametrize("shape", [(8, 1), (64, 24), (136, 8), (256, 40)])
def test_qweight_round_trip_all_nibble_values(shape: tuple[int, int]) -> None:
    num_in, num_out = shape
    gen = torch.Generator().manual_seed(num_in * num_out)
    q = torch.randint(0, 16, shape, generator=gen)
    # Every value 0..15 at every nibble position m (column 0 cycles through them).
    k = torch.arange(num_in)
    q[:, 0] = (k % 8 + k // 8) % 16
    packed = pack_qweight(q)
    assert packed.dtype == torch.int32 and packed.shape == (num_in // 8, num_out)
    assert torch.equal(unpack_qweight(packed), q.to(torch.int32))
    for m in range(8):
        assert torch.equal((packed >> (4 * m)) & 0xF, q[m::8].to(torch.int32))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_pack_int4_any_dim_round_trip(dim: int) -> None:
    values = torch.randint(0, 16, (16, 24, 8), generator=torch.Generator().manual_seed(3))
    assert torch.equal(unpack_int4(pack_int4(values, dim), dim), values.to(torch.int32))


def test_pack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_int4(torch.zeros(12, 4, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(torch.full((8, 1), 16), 0)
    with pytest.raises(ValueError, match="integer"):
        pack_int4(torch.zeros(8, 1), 0)
    with pytest.raises(ValueError, match="zero point of 0"):
        pack_qzeros(torch.zeros(1, 8, dtype=torch.int32), checkpoint_format="gptq")


def test_qzeros_round_trip_both_formats() -> None:
    gen = torch.Generator().manual_seed(1)
    zeros_v2 = torch.randint(0, 16, (5, 48), generator=gen)
    zeros_v1 = torch.randint(1, 16, (5, 48), generator=gen)  # v1 stores zero - 1: zeros >= 1
    assert torch.equal(
        unpack_qzeros(
            pack_qzeros(zeros_v2, checkpoint_format="gptq_v2"), checkpoint_format="gptq_v2"
        ),
        zeros_v2.int(),
    )
    packed_v1 = pack_qzeros(zeros_v1, checkpoint_format="gptq")
    assert torch.equal(unpack_int4(packed_v1, 1), (zeros_v1 - 1).int())  # what a v1 file holds
    assert torch.equal(unpack_qzeros(packed_v1, checkpoint_format="gptq"), zeros_v1.int())


def test_v1_v2_conversion_round_trip_and_meaning() -> None:
    gen = torch.Generator().manual_seed(2)
    words = torch.randint(-(2**31), 2**31, (7, 16), generator=gen, dtype=torch.int64).to(
        torch.int32
    )
    assert torch.equal(qzeros_v2_to_v1(qzeros_v1_to_v2(words)), words)
    assert torch.equal(qzeros_v1_to_v2(qzeros_v2_to_v1(words)), words)
    zeros = torch.randint(1, 16, (3, 32), generator=gen)  # storable in both formats
    v1 = pack_qzeros(zeros, checkpoint_format="gptq")
    v2 = pack_qzeros(zeros, checkpoint_format="gptq_v2")
    assert torch.equal(qzeros_v1_to_v2(v1), v2)
    assert torch.equal(qzeros_v2_to_v1(v2), v1)


def test_dequantize_matches_naive_loops(make_gptq) -> None:
    t = make_gptq(32, 16, 8 * 2, act_order=True, sym=False, seed=5)
    w = dequantize_gptq(*t, checkpoint_format="gptq")
    q = unpack_qweight(t.qweight)
    zeros = unpack_qzeros(t.qzeros, checkpoint_format="gptq")
    for n in range(16):
        for k in range(32):
            g = int(t.g_idx[k])
            expected = float(t.scales[g, n]) * (int(q[k, n]) - int(zeros[g, n]))
            assert w[n, k].item() == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_dequantize_v1_equals_v2_for_same_weights() -> None:
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (24, 64), generator=gen)
    zeros = torch.randint(1, 16, (2, 24), generator=gen)
    scales = torch.rand(2, 24, generator=gen).half()
    g_idx = torch.arange(64) // 32
    v1 = pack_gptq(q, zeros, scales, g_idx, checkpoint_format="gptq")
    v2 = pack_gptq(q, zeros, scales, g_idx, checkpoint_format="gptq_v2")
    w1 = dequantize_gptq(*v1, checkpoint_format="gptq")
    w2 = dequantize_gptq(*v2, checkpoint_format="gptq_v2")
    assert torch.equal(w1, w2)
    expected = scales.float()[g_idx].t() * (q - zeros[g_idx].t()).float()
    assert torch.allclose(w1, expected, rtol=0, atol=0)
    assert torch.equal(
        dequantize_gptq(v1.qweight, v1.qzeros, v1.scales, None), w1
    )  # g_idx None = k // 32


def test_check_gptq_tensors_errors(make_gptq) -> None:
    t = make_gptq(64, 16, 32)
    assert check_gptq_tensors(*t) == (64, 16, 2)
    with pytest.raises(ValueError, match="qweight"):
        check_gptq_tensors(t.qweight.float(), t.qzeros, t.scales, t.g_idx)
    with pytest.raises(ValueError, match="qzeros"):
        check_gptq_tensors(t.qweight, t.qzeros[:1], t.scales, t.g_idx)
    with pytest.raises(ValueError, match="g_idx values"):
        check_gptq_tensors(t.qweight, t.qzeros, t.scales, t.g_idx + 5)
    with pytest.raises(ValueError, match="g_idx must"):
        check_gptq_tensors(t.qweight, t.qzeros, t.scales, t.g_idx[:8])


def test_format_functions_work_on_meta() -> None:
    q = torch.empty(64, 16, dtype=torch.int64, device="meta")
    packed = pack_qweight(q)
    assert packed.device.type == "meta" and packed.shape == (8, 16)
    assert unpack_qweight(packed).shape == (64, 16)


def test_unstorable_v1_zero_is_warned_about_once(monkeypatch, caplog) -> None:
    import logging

    from brisklm.quant import gptq_format

    monkeypatch.setattr(gptq_format, "_warned_unstorable_zeros", False)
    fine = pack_qzeros(torch.randint(1, 16, (2, 8)), checkpoint_format="gptq")
    with caplog.at_level(logging.WARNING):
        unpack_qzeros(fine, checkpoint_format="gptq")
        unpack_qzeros(fine ^ 0xF, checkpoint_format="gptq_v2")  # v2 stores 0 itself: fine
    assert "zero point of 0" not in caplog.text
    # auto-gptq's packer writes zero 0 as the nibble 0xF (zero - 1 = -1).
    with caplog.at_level(logging.WARNING):
        unpack_qzeros(fine | 0xF, checkpoint_format="gptq")
        unpack_qzeros(fine | 0xF, checkpoint_format="gptq")
    assert caplog.text.count("zero point of 0") == 1


def test_without_g_idx_a_short_last_group_needs_the_group_size() -> None:
    # 96 inputs in groups of 64 hold two groups, as groups of 48 would: inferred, the groups were
    # 48 wide and the weights wrong, silently.
    t = random_gptq(96, 16, 64, sym=False)
    reference = dequantize_gptq(*t)
    kept = dequantize_gptq(t.qweight, t.qzeros, t.scales, None, group_size=64)
    torch.testing.assert_close(kept, reference, rtol=0, atol=0)
    layer = GPTQLinear.from_gptq_tensors(
        t.qweight, t.qzeros, t.scales, None, group_size=64, compute_dtype=torch.float32
    )
    x = torch.randn(3, 96)
    torch.testing.assert_close(layer(x), x @ reference.t(), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="group_size=32 makes 3 groups of in_features=96, but"):
        dequantize_gptq(t.qweight, t.qzeros, t.scales, None, group_size=32)
    odd = random_gptq(136, 16, 64, sym=False)  # 3 groups that cannot be equal: no guess
    with pytest.raises(ValueError, match="groups of in_features=136 are unequal: pass"):
        dequantize_gptq(odd.qweight, odd.qzeros, odd.scales, None)
