"""GPTQLinear: every kernel against the dequantize-then-matmul reference."""

from __future__ import annotations

import logging

import pytest
import torch

from brisklm.quant import GPTQLinear, GPTQTensors, kernel_layout, unpack_qweight, unpack_qzeros
from brisklm.quant.triton_int4 import triton_available

# Tolerances.
# compute_dtype float32: the CPU kernel computes w = (q - 8) * s + (8 - z) * s in fp32 and accumulates
#   in fp32 (the reference: (q - z) * s, fp32). Only summation order and the two-term dequant differ:
#   a few fp32 ulps of sum |x| |w|, so 1e-5 of that bound (fp32 eps is 1.2e-7; K <= 256 terms).
# bf16 (the default on CPU; also bf16 activations): x, scale and zero_f = (8 - z) * s are each
#   rounded once to bf16 (unit roundoff 2^-9) and the output once more, so to first order
#   |y - ref| <= 2^-9 * (3 * |x| @ A^T + |y|), with A = (|q - 8| + |8 - z|) * s the kernel's two
#   dequant terms. We allow 2^-7 * (|x| @ A^T + |y|), which covers that with room; measured worst
#   case is about a quarter of it.
FP32_REL = 1e-5
BF16_REL = 2.0**-7


def kernel_error_bound(
    t: GPTQTensors, x: torch.Tensor, ref: torch.Tensor, fmt: str
) -> torch.Tensor:
    q = unpack_qweight(t.qweight).float()  # (K, N)
    zeros = unpack_qzeros(t.qzeros, checkpoint_format=fmt).float()
    groups = t.g_idx.long()
    scales = t.scales.float()[groups]  # (K, N)
    magnitude = ((q - 8).abs() + (8 - zeros[groups]).abs()) * scales
    return (
        x.reshape(-1, x.shape[-1]).float().abs() @ magnitude
        + ref.reshape(-1, ref.shape[-1]).float().abs()
    )


def check_against_reference(
    layer: GPTQLinear, t: GPTQTensors, x: torch.Tensor, rel: float, fmt: str = "gptq"
) -> None:
    y = layer(x)
    ref = layer.forward_reference(x.float())
    assert y.shape == (*x.shape[:-1], layer.out_features) and y.dtype == x.dtype
    bound = rel * kernel_error_bound(t, x, ref, fmt) + 1e-6
    err = (y.float() - ref).reshape(bound.shape).abs()
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max().item():.3g}"


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("sym", [True, False])
def test_cpu_kernel_matches_reference(
    make_gptq, group_size: int, act_order: bool, sym: bool
) -> None:
    t = make_gptq(
        256, 96, group_size, act_order=act_order, sym=sym, seed=group_size + 7 * act_order + 3 * sym
    )
    bias = torch.randn(96).half()
    exact = GPTQLinear.from_gptq_tensors(
        *t, bias=bias, backend="cpu", compute_dtype=torch.float32, keep_gptq_tensors=True
    )
    fast = GPTQLinear.from_gptq_tensors(*t, bias=bias, backend="cpu", keep_gptq_tensors=True)
    assert exact.backend == fast.backend == "cpu" and fast.compute_dtype == torch.bfloat16
    # One group (-1) has nothing to sort: act-order then needs no permutation.
    assert (exact._perm is not None) == (act_order and group_size != -1)
    gen = torch.Generator().manual_seed(11)
    for rows in (1, 7, 33):
        x = torch.randn(rows, 256, generator=gen)
        check_against_reference(exact, t, x, FP32_REL)
        check_against_reference(fast, t, x, BF16_REL)
        check_against_reference(fast, t, x.bfloat16(), BF16_REL)


@pytest.mark.parametrize("group_size", [32, 64, -1])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_native_kernel_gives_the_bits_of_the_dequantized_float32_product(
    make_gptq, group_size: int, act_order: bool, fmt: str
) -> None:
    """On CPU "auto" runs the native kernels: float32 arithmetic over (q - z) * s, exactly the
    dequantized weight, so a row gets the bits of the native float32 product over that weight
    (and of the float model the checkpoint dequantizes to), alone or among others; act-order's
    groups are looked up per input, with no permutation of the activations."""
    from brisklm.kernels import native

    if not native.available():
        pytest.skip("the native kernels do not build here")
    t = make_gptq(256, 88, group_size, act_order=act_order, checkpoint_format=fmt, seed=3)
    bias = torch.randn(88).half()
    layer = GPTQLinear.from_gptq_tensors(
        *t, bias=bias, checkpoint_format=fmt, keep_gptq_tensors=True
    )
    assert layer.backend == "native" and layer.compute_dtype == torch.float32
    assert layer._perm is None
    dense = native.pack(layer.dequantize())
    assert torch.equal(layer.int4.dequantize(), layer.dequantize())
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(70, 256, generator=gen)  # from 64 rows AVX2 widens each panel once
    want = native.linear(x, dense, bias.float(), 88)
    assert torch.equal(layer(x), want)
    for rows in (1, 2, 3, 7):
        assert torch.equal(layer(x[:rows]), want[:rows])
    check_against_reference(layer, t, x[:9], FP32_REL, fmt)
    # Other dtypes in, the same dtype out (computed in float32).
    assert torch.equal(
        layer(x[:3].bfloat16()),
        native.linear(x[:3].bfloat16().float(), dense, bias.float(), 88).bfloat16(),
    )


def test_native_kernel_takes_uneven_groups_in_any_order(make_gptq) -> None:
    """Groups no kernel group fits (sizes 40/24/32/32, shuffled) need no dense copy natively."""
    from brisklm.kernels import native

    if not native.available():
        pytest.skip("the native kernels do not build here")
    t = make_gptq(128, 32, 32, seed=1)
    g_idx = torch.cat(
        [torch.zeros(40), torch.ones(24), torch.full((32,), 2), torch.full((32,), 3)]
    ).int()
    t = t._replace(g_idx=g_idx[torch.randperm(128, generator=torch.Generator().manual_seed(0))])
    layer = GPTQLinear.from_gptq_tensors(*t, keep_gptq_tensors=True)
    assert layer.backend == "native"
    x = torch.randn(5, 128)
    assert torch.equal(layer(x), native.linear(x, native.pack(layer.dequantize()), None, 32))


def test_native_backend_refuses_what_it_cannot_do(make_gptq, monkeypatch) -> None:
    from brisklm.kernels import native

    t = make_gptq(64, 16, 32, seed=4)
    with pytest.raises(ValueError, match="computes in float32"):
        GPTQLinear.from_gptq_tensors(*t, backend="native", compute_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="needs a CPU device"):
        GPTQLinear.from_gptq_tensors(*t, backend="native", device="meta")
    # Without the kernels "auto" takes torch's CPU kernel, and "native" says why it cannot run.
    monkeypatch.setattr(native, "available", lambda: False)
    assert GPTQLinear.from_gptq_tensors(*t).backend == "cpu"
    with pytest.raises(RuntimeError, match="native CPU kernels"):
        GPTQLinear.from_gptq_tensors(*t, backend="native")
    # A bfloat16 product asked for runs on torch's kernel, which computes in it.
    monkeypatch.undo()
    assert GPTQLinear.from_gptq_tensors(*t, compute_dtype=torch.bfloat16).backend == "cpu"


def test_kernel_group_mapping(make_gptq) -> None:
    # -1 (one group) becomes blocks of the largest kernel group dividing K, repeating the scale.
    layout = kernel_layout(*make_gptq(256, 16, -1))
    assert layout.group_size == 256 and torch.equal(layout.scales, layout.scales[:1].expand(1, 16))
    assert kernel_layout(*make_gptq(192, 16, -1)).group_size == 64
    assert (
        kernel_layout(*make_gptq(192, 16, 96)).group_size == 32
    )  # a multiple of 32 that is no power of 2
    layout = kernel_layout(*make_gptq(256, 16, 32, act_order=True))
    assert layout.perm is not None and layout.group_size == 32
    # Sorted g_idx (desc_act with static groups) needs no permutation.
    assert kernel_layout(*make_gptq(256, 16, 64)).perm is None


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_formats_and_shapes(make_gptq, fmt: str) -> None:
    # N = 40 is not a multiple of 16 (the CPU packer pads); leading batch dims; no bias; fp16 input.
    t = make_gptq(128, 40, 32, act_order=True, checkpoint_format=fmt, seed=9)
    layer = GPTQLinear.from_gptq_tensors(
        *t, checkpoint_format=fmt, compute_dtype=torch.float32, keep_gptq_tensors=True
    )
    x = torch.randn(2, 3, 128)
    check_against_reference(layer, t, x, FP32_REL, fmt)
    fast = GPTQLinear.from_gptq_tensors(*t, checkpoint_format=fmt, keep_gptq_tensors=True)
    check_against_reference(fast, t, x.half(), BF16_REL, fmt)
    assert fast(torch.randn(0, 128)).shape == (0, 40)


def test_dense_fallback_for_unaligned_groups(make_gptq, caplog: pytest.LogCaptureFixture) -> None:
    t = make_gptq(128, 32, 32, seed=1)
    # Uneven groups (sizes 40/24/32/32): no kernel group of >= 32 columns fits.
    g_idx = torch.cat(
        [torch.zeros(40), torch.ones(24), torch.full((32,), 2), torch.full((32,), 3)]
    ).int()
    t = t._replace(g_idx=g_idx[torch.randperm(128, generator=torch.Generator().manual_seed(0))])
    with caplog.at_level(logging.WARNING):
        layer = GPTQLinear.from_gptq_tensors(*t, backend="cpu", keep_gptq_tensors=True)
    assert layer.backend == "dense" and "dense" in caplog.text
    x = torch.randn(5, 128)
    check_against_reference(layer, t, x, BF16_REL)


def test_row_results_do_not_depend_on_the_row_count(make_gptq) -> None:
    """Batch invariance: the int4 kernel and the dense fallback give a row the same bits alone
    and among others (seeded sampling must not change with the batch)."""
    t = make_gptq(128, 32, 32, seed=4)
    g_idx = torch.cat(
        [torch.zeros(40), torch.ones(24), torch.full((32,), 2), torch.full((32,), 3)]
    ).int()
    uneven = t._replace(g_idx=g_idx)
    x = torch.randn(8, 128)
    for tensors in (t, uneven):
        for compute in (torch.float32, torch.bfloat16):
            layer = GPTQLinear.from_gptq_tensors(*tensors, compute_dtype=compute)
            batch = layer(x)
            for rows in (1, 3):
                assert torch.equal(layer(x[:rows]), batch[:rows]), (layer.backend, compute, rows)


def test_bias_is_added_in_float32(make_gptq) -> None:
    """Qwen2-sized q/k/v biases (~100) on ~1 products: a bfloat16 sum would round away ~0.5."""
    t = make_gptq(128, 64, 32, seed=5)
    bias = torch.linspace(-136.0, 136.0, 64)
    layer = GPTQLinear.from_gptq_tensors(*t, bias=bias, backend="cpu", keep_gptq_tensors=True)
    assert layer.compute_dtype == torch.bfloat16
    x = torch.randn(4, 128) * 0.05
    expected = x.double() @ layer.dequantize().double().T + bias.double()
    # The error left is the bfloat16 product's, not the bias's rounding (0.25-0.5 at |bias| ~ 100).
    product_error = (layer(x) - bias - (expected - bias.double()).float()).abs().max()
    assert (layer(x).double() - expected).abs().max() < 0.05
    assert product_error < 0.05


def test_meta_construction_then_load(make_gptq) -> None:
    t = make_gptq(128, 64, 32, act_order=True, seed=2)
    layer = GPTQLinear(128, 64, bias=True, group_size=32, device="meta")
    assert layer.qweight.device.type == "meta" and layer.qweight.shape == (16, 64)
    state = {
        "qweight": t.qweight,
        "qzeros": t.qzeros,
        "scales": t.scales,
        "g_idx": t.g_idx,
        "bias": torch.randn(64).half(),
    }
    assert set(layer.state_dict()) == set(state)  # HF names
    layer.load_state_dict(state, assign=True)
    with pytest.raises(RuntimeError, match="meta"):
        GPTQLinear(128, 64, device="meta").prepare("cpu")
    layer.prepare("cpu", compute_dtype=torch.float32, keep_gptq_tensors=True)
    check_against_reference(layer, t, torch.randn(3, 128), FP32_REL)


def test_prepare_drops_gptq_tensors_by_default(make_gptq) -> None:
    t = make_gptq(128, 64, 32, seed=3)
    layer = GPTQLinear.from_gptq_tensors(*t, bias=torch.zeros(64).half())
    assert layer.qweight is None and layer.scales is None
    assert set(layer.state_dict()) == {"bias"}
    packed_bytes = sum(
        b.numel() * b.element_size() for n, b in layer.named_buffers() if "bias" not in n
    )
    # int4 + scales, well under a bf16 copy (the native layout keeps each group's zero points and
    # scales in float32: at groups of 32, 8 bytes per 16 of codes)
    assert packed_bytes <= 128 * 64 * 2 / 2
    with pytest.raises(RuntimeError, match="keep_gptq_tensors"):
        layer.forward_reference(torch.randn(1, 128))
    with pytest.raises(RuntimeError, match="already"):
        layer.prepare("cpu")
    assert layer(torch.randn(2, 128)).shape == (2, 64)


def test_forward_prepares_lazily_and_checks_input(make_gptq) -> None:
    t = make_gptq(64, 16, 32, seed=4)
    layer = GPTQLinear(64, 16, bias=False, group_size=32)
    layer.load_state_dict(
        {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales, "g_idx": t.g_idx}
    )
    from brisklm.kernels import native

    assert layer(torch.randn(1, 64)).shape == (1, 16)
    assert layer.backend == ("native" if native.available() else "cpu")
    with pytest.raises(ValueError, match="last dim"):
        layer(torch.randn(1, 65))


def test_lazy_prepare_chooses_the_backend_for_the_activations_dtype(make_gptq, monkeypatch):
    # "auto" probes the CUDA kernels in the model's dtype; a layer prepared by its first forward
    # probed in bfloat16 whatever the activations were.
    from brisklm.quant import int4_linear

    asked = []
    select = int4_linear._select_backend

    def spy(requested, device, compute_dtype=None, activation_dtype=None):
        asked.append(activation_dtype)
        return select(requested, device, compute_dtype, activation_dtype)

    monkeypatch.setattr(int4_linear, "_select_backend", spy)
    t = make_gptq(64, 16, 32, seed=4)
    layer = GPTQLinear(64, 16, bias=False, group_size=32)
    layer.load_state_dict(
        {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales, "g_idx": t.g_idx}
    )
    layer(torch.randn(1, 64, dtype=torch.float16))
    assert asked == [torch.float16]


def test_model_dtype_casts_leave_the_layer_alone(make_gptq) -> None:
    t = make_gptq(128, 32, 32, act_order=True, seed=6)
    model = torch.nn.Sequential(GPTQLinear(128, 32, group_size=32))
    model[0].load_state_dict(
        {
            "qweight": t.qweight,
            "qzeros": t.qzeros,
            "scales": t.scales,
            "g_idx": t.g_idx,
            "bias": torch.zeros(32).half(),
        }
    )
    model.to(torch.bfloat16)  # before prepare: the fp16 scales must not become bf16
    assert model[0].scales.dtype == torch.float16 and torch.equal(model[0].scales, t.scales)
    model[0].prepare("cpu", keep_gptq_tensors=True)
    model.half()  # after prepare: the kernel's bf16 scales/zeros must stay bf16
    x = torch.randn(3, 128)
    check_against_reference(model[0], t, x.bfloat16(), BF16_REL)


def test_from_float_round_trip() -> None:
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(64, 256, generator=gen) * 0.05
    layer = GPTQLinear.from_float(
        weight, torch.randn(64, generator=gen), group_size=64, keep_gptq_tensors=True
    )
    deq = layer.dequantize()
    # RTN error is at most half a step, scale ~ 2 * max|w| / 15 per group of 64.
    step = 2 * weight.abs().reshape(64, 4, 64).amax(-1).repeat_interleave(64, 1) / 15
    assert bool(((deq - weight).abs() <= step * 0.5 + 1e-2 * step).all())
    x = torch.randn(4, 256, generator=gen)
    assert torch.allclose(layer.forward_reference(x), x @ deq.t() + layer.bias.float(), atol=1e-5)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="multiples of 8"):
        GPTQLinear(60, 16)
    with pytest.raises(ValueError, match="group_size"):
        GPTQLinear(64, 16, group_size=0)
    with pytest.raises(ValueError, match="backend"):
        GPTQLinear(64, 16).prepare("cpu", backend="marlin")
    with pytest.raises(ValueError, match="CUDA"):
        GPTQLinear(64, 16).prepare("cpu", backend="cuda_int4pack")


def test_auto_on_cuda_takes_the_first_backend_whose_probe_passes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Triton installed but unable to build or launch its kernel (no compiler for its launcher,
    # bfloat16 products before Ampere) failed every int4 forward: "auto" took it untried.
    from brisklm.quant import int4_linear

    monkeypatch.setattr(int4_linear, "_PROBED", {})
    monkeypatch.setattr(int4_linear.triton_int4, "triton_available", lambda: True)
    probed = []

    def probe(
        backend: str,
        device: torch.device,
        compute_dtype: torch.dtype | None,
        activation_dtype: torch.dtype,
    ) -> None:
        probed.append((backend, activation_dtype))
        if backend == "triton" and activation_dtype == torch.bfloat16:
            raise RuntimeError("PTX .bf16 requires sm_80\nmore")

    monkeypatch.setattr(int4_linear, "_probe_backend", probe)
    cuda = torch.device("cuda", 0)
    with caplog.at_level(logging.WARNING, logger="brisklm.quant.int4_linear"):
        assert int4_linear._select_backend("auto", cuda) == "cuda_int4pack"
        assert int4_linear._select_backend("auto", cuda) == "cuda_int4pack"  # probed once
    assert probed == [("triton", torch.bfloat16), ("cuda_int4pack", torch.bfloat16)]
    assert "backend 'triton' does not work on cuda:0 (RuntimeError: PTX .bf16 requires sm_80)" in (
        caplog.text
    )
    # Probed in the model's dtype: a float16 model keeps the kernel that works for it.
    assert int4_linear._select_backend("auto", cuda, None, torch.float16) == "triton"
    assert probed[-1] == ("triton", torch.float16)
    # An explicit backend is taken as asked (its errors are the caller's to see).
    assert int4_linear._select_backend("triton", cuda) == "triton"


def test_backend_probes_fail_where_a_kernel_cannot_run_and_pass_where_it_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from brisklm.quant import int4_linear

    monkeypatch.setattr(int4_linear, "_PROBED", {})
    cpu = torch.device("cpu")
    # Neither CUDA kernel runs on a CPU device: the dense layer is what is left.
    assert int4_linear._working_backend(("triton", "cuda_int4pack"), cpu, None) == "dense"
    for backend in ("cpu", "dense"):
        for compute_dtype in (None, torch.float32):
            for activations in (torch.bfloat16, torch.float32):  # raises if it fails
                int4_linear._probe_backend(backend, cpu, compute_dtype, activations)
    assert int4_linear._working_backend(("cpu",), cpu, torch.float32) == "cpu"


# ---------------------------------------------------------------- CUDA (skipped without a GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda_int4pack", "triton"])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("act_order", [False, True])
def test_cuda_kernels_match_reference(
    make_gptq, backend: str, group_size: int, act_order: bool
) -> None:
    if backend == "triton" and not triton_available():
        pytest.skip("triton not installed")
    t = make_gptq(512, 256, group_size, act_order=act_order, sym=False, seed=group_size)
    t = GPTQTensors(*(v.cuda() for v in t))
    layer = GPTQLinear.from_gptq_tensors(
        *t, bias=torch.randn(256, device="cuda").half(), backend=backend, keep_gptq_tensors=True
    )
    assert layer.backend == backend
    for rows in (1, 7, 33):
        x = torch.randn(rows, 512, device="cuda")
        check_against_reference(layer, t, x.bfloat16(), BF16_REL)
        if backend == "triton":
            check_against_reference(layer, t, x.half(), BF16_REL)
            check_against_reference(layer, t, x, BF16_REL)  # fp32 dot (ieee)


def test_a_slow_cpu_compute_dtype_is_warned_of_once(make_gptq, monkeypatch, caplog) -> None:
    """Torch's CPU int4 kernel in float16 runs ~12x slower than in bfloat16 (and than the native
    kernels): asking for it says so, once, and what to do instead."""
    from brisklm.quant import int4_linear

    monkeypatch.setattr(int4_linear, "_WARNED_SLOW", set())
    t = make_gptq(64, 16, 32, seed=4)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            layer = GPTQLinear.from_gptq_tensors(*t, compute_dtype=torch.float16)
            assert layer.backend == "cpu"
        GPTQLinear.from_gptq_tensors(*t, compute_dtype=torch.bfloat16)
    messages = [r.getMessage() for r in caplog.records if "slower" in r.getMessage()]
    assert len(messages) == 1 and "float16" in messages[0], messages
