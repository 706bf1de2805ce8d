"""GPTQ int4 models on CPU through the native kernels: the products read 4-bit codes and each
group's zero points and scales, and compute (code - zero) * scale in float32 as they read it,
which is exactly the weight GPTQ's dequantization gives. The reference is the checkpoint's
dequantized float32 copy run through the same kernels: every product, and so every logit, must
match it bit for bit, on the native pass (decode steps, verification rows, short prompts) and on
torch's ops (rows longer than MAX_QUERY_LEN), act-order included (its groups are looked up per
input, the activations are not permuted)."""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.kernels import native
from brisklm.loader import load_model
from brisklm.models.native_forward import MAX_QUERY_LEN
from tests.hf_models import build_hf_model
from tests.models.conftest import BUILDS
from tests.quant.gptq_checkpoints import write_dequantized_copy, write_gptq_checkpoint

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")

SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


def random_int4(k: int, rows: int, groups: int, seed: int, shuffled: bool = True):
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (k, rows), generator=generator)
    zeros = torch.randint(0, 16, (groups, rows), generator=generator)
    scales = torch.rand(groups, rows, generator=generator) / 8 + 1e-3
    g_idx = torch.arange(k) * groups // k
    if shuffled:  # act-order: groups in any order along the inputs
        g_idx = g_idx[torch.randperm(k, generator=generator)]
    return codes, zeros, scales, g_idx


def dequantized(codes, zeros, scales, g_idx) -> torch.Tensor:
    """GPTQ's dequantization, (rows, k) float32: scale * (code - zero)."""
    return (scales.float()[g_idx] * (codes - zeros[g_idx]).float()).t().contiguous()


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize(("k", "groups"), [(8, 1), (48, 3), (256, 2), (768, 6)])
@pytest.mark.parametrize("rows", [1, 37, 96])
def test_int4_product_has_the_bits_of_the_float32_one_over_the_dequantized_weight(
    request, build, k, groups, rows
):
    lib = request.getfixturevalue("native_build")(build)
    codes, zeros, scales, g_idx = random_int4(k, rows, groups, seed=k + rows)
    weight = native.pack_int4(codes, zeros, scales, g_idx)
    dense = dequantized(codes, zeros, scales, g_idx)
    assert torch.equal(weight.dequantize(), dense)
    bias = torch.randn(rows)
    x = torch.randn(70, k)  # from 32 tokens each panel is dequantized once
    got = native.linear_int4(x, weight, bias, lib=lib)
    assert torch.equal(got, native.linear(x, native.pack(dense), bias, rows, lib=lib))
    expected = torch.nn.functional.linear(x.double(), dense.double(), bias.double())
    torch.testing.assert_close(got.double(), expected, atol=1e-4 * max(1, k**0.5), rtol=0)
    # a row's bits do not depend on the rows beside it: whole-panel and half-panel tiles (up to
    # 10 tokens with AVX-512), balanced splits (11, 17, 31) and widened panels (from 32)
    for n in (1, 2, 3, 4, 7, 10, 11, 17, 31, 32):
        assert torch.equal(native.linear_int4(x[5 : 5 + n], weight, bias, lib=lib), got[5 : 5 + n])


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_int4_zero_points_outside_a_nibble_keep_the_bits(request, build):
    """Zero points are stored as 2^23 + zero and codes turned into 2^23 + code: exact for GPTQ
    v1's 16, negative zero points and large ones (the limit 2^22), for every row count."""
    lib = request.getfixturevalue("native_build")(build)
    codes, zeros, scales, g_idx = random_int4(256, 40, 4, seed=11)
    zeros[0] = 16
    zeros[1] = -zeros[1]
    zeros[2, :5] = 2**22
    zeros[3, :5] = -(2**22)
    weight = native.pack_int4(codes, zeros, scales, g_idx)
    dense = dequantized(codes, zeros, scales, g_idx)
    assert torch.equal(weight.dequantize(), dense)
    small = zeros.clamp(0, 16)  # GPTQ's range, in every integer and float type
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.float16, torch.float32):
        packed = native.pack_int4(codes, small.to(dtype), scales, g_idx)
        assert torch.equal(packed.dequantize(), dequantized(codes, small, scales, g_idx))
    x = torch.randn(40, 256)
    for n in (1, 2, 5, 12, 33, 40):
        got = native.linear_int4(x[:n], weight, None, lib=lib)
        assert torch.equal(got, native.linear(x[:n], native.pack(dense), None, 40, lib=lib))


def test_int4_bits_do_not_depend_on_the_thread_count():
    codes, zeros, scales, g_idx = random_int4(512, 200, 4, seed=1)
    weight = native.pack_int4(codes, zeros, scales, g_idx)
    x = torch.randn(9, 512)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            results.append(native.linear_int4(x, weight, None))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(r, results[0]) for r in results[1:])


def test_pack_int4_lays_codes_out_in_blocks_of_eight_inputs():
    """Word o of a panel's block b holds output o's codes of inputs 8b..8b+7, input 8b+r in bits
    4r..4r+3; each group's block is its 32 zero points (as 2^23 + zero) then its 32 scales."""
    codes, zeros, scales, g_idx = random_int4(16, 40, 2, seed=3, shuffled=False)
    weight = native.pack_int4(codes, zeros, scales, g_idx)
    assert weight.codes.shape == (2, 2, 32) and weight.zs.shape == (2, 2, 64)
    word = int(weight.codes[1, 1, 3]) & 0xFFFFFFFF
    assert [(word >> (4 * r)) & 15 for r in range(8)] == codes[8:16, 32 + 3].tolist()
    assert torch.equal(weight.zs[0, 1, :32], zeros[1, :32].float() + 2**23)
    assert torch.equal(weight.zs[1, 0, 32 + 7], scales[0, 39].float())
    padding = torch.cat([weight.zs[1, :, 8:32], weight.zs[1, :, 40:]], dim=1)
    assert torch.equal(padding, torch.zeros(2, 48))  # padding outputs weigh 0
    assert weight.group_at.tolist() == (g_idx * 64).tolist()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c, z, s, g: (c[:12], z, s, g[:12]), "multiple of 8"),
        (lambda c, z, s, g: (c + 1, z, s, g), "codes must be in 0..15"),
        (lambda c, z, s, g: (c, z, s, g + 1), r"g_idx must be in \[0, 2\)"),
        (lambda c, z, s, g: (c, z[:, :5], s, g), "do not fit together"),
        (lambda c, z, s, g: (c, z, s[:, :39], g), "do not fit together"),
        (lambda c, z, s, g: (c, z + 0.5, s, g), "zero points must be whole numbers"),
        (lambda c, z, s, g: (c, z.float() * float("nan"), s, g), "zero points must be whole"),
        (lambda c, z, s, g: (c, z.float() - float("inf"), s, g), "zero points must be whole"),
        (lambda c, z, s, g: (c, z + 2**22 + 1, s, g), "magnitude at most 4194304"),
        (lambda c, z, s, g: (c, z.int() * 0 + torch.iinfo(torch.int32).min, s, g), "at most"),
        (lambda c, z, s, g: (c, z * 0 + torch.iinfo(torch.int64).min, s, g), "at most"),
    ],
)
def test_pack_int4_refuses_tensors_that_do_not_fit(change, message):
    tensors = random_int4(16, 40, 2, seed=4, shuffled=False)
    with pytest.raises(ValueError, match=message):
        native.pack_int4(*change(*tensors))


def test_linear_int4_refuses_bad_inputs_by_name():
    weight = native.pack_int4(*random_int4(16, 8, 1, seed=5))
    with pytest.raises(ValueError, match="float32 CPU rows of 16 inputs"):
        native.linear_int4(torch.randn(2, 15), weight, None)
    with pytest.raises(ValueError, match="float32 CPU rows"):
        native.linear_int4(torch.randn(2, 16).double(), weight, None)
    with pytest.raises(ValueError, match="bias"):
        native.linear_int4(torch.randn(2, 16), weight, torch.randn(7))
    assert native.linear_int4(torch.randn(0, 16), weight, None).shape == (0, 8)


@pytest.fixture(scope="module")
def hf_llama():
    return build_hf_model("llama", **SHAPE)


def all_logits(model, prompt: list[int], cache: int) -> tuple[torch.Tensor, bool]:
    runner = ModelRunner(model, num_slots=2, max_seq_len=cache, attention_backend="sdpa")
    logits = runner.forward(ForwardBatch([0], [0], [prompt], [len(prompt)]))
    # Then decode steps through the cache, two rows at once (the second a fresh prompt).
    steps = [logits]
    for step in range(3):
        token = int(steps[-1][-1].argmax())
        steps.append(
            runner.forward(
                ForwardBatch([0, 1], [len(prompt) + step, 0], [[token], prompt[:5]], [1, 1])
            )
        )
    return torch.cat(steps), runner.native is not None


@pytest.mark.parametrize(
    "options",
    [
        dict(group_size=32, sym=False, act_order=True),
        dict(group_size=64, sym=True, checkpoint_format="gptq_v2"),
        dict(group_size=-1, sym=False),
        dict(group_size=32, sym=False, lm_head=True),
        # int4 and float products side by side (each product has its own weight type)
        dict(
            group_size=64,
            modules_to_not_convert=("down_proj",),
            dynamic={r"-:model\.layers\.1\.self_attn\..*": {}},
        ),
    ],
    ids=["act-order", "v2-sym", "one-group", "int4-head", "mixed"],
)
def test_gptq_model_has_the_logits_of_its_dequantized_copy_bit_for_bit(hf_llama, tmp_path, options):
    gptq_dir = write_gptq_checkpoint(hf_llama, tmp_path / "gptq", **options)
    float_dir = write_dequantized_copy(gptq_dir, tmp_path / "float")
    int4 = load_model(gptq_dir, show_progress=False)
    dense = load_model(float_dir, device="cpu", dtype="float32", show_progress=False)
    assert int4.model.layers[0].self_attn.qkv_proj.parts[0].backend == "native"
    cache = MAX_QUERY_LEN + 80
    generator = torch.Generator().manual_seed(0)
    for length in (12, MAX_QUERY_LEN + 40):  # the native pass, then torch's ops
        prompt = torch.randint(0, 160, (length,), generator=generator).tolist()
        got, native_pass = all_logits(int4, prompt, cache)
        want, _ = all_logits(dense, prompt, cache)
        assert native_pass
        assert torch.equal(got, want)


def test_a_pass_that_wants_no_logits_runs_with_an_int4_head(hf_llama, tmp_path):
    """A prompt chunk before the last asks for no logits: the int4 head's product then has no rows
    (splitting them into tiles divided by zero and killed the process: SIGFPE)."""
    gptq_dir = write_gptq_checkpoint(hf_llama, tmp_path / "gptq", group_size=32, lm_head=True)
    float_dir = write_dequantized_copy(gptq_dir, tmp_path / "float")
    prompt = list(range(3, 40))
    results = []
    for model in (
        load_model(gptq_dir, show_progress=False),
        load_model(float_dir, device="cpu", dtype="float32", show_progress=False),
    ):
        runner = ModelRunner(model, num_slots=1, max_seq_len=64, attention_backend="sdpa")
        assert runner.native is not None
        assert runner.forward(ForwardBatch([0], [0], [prompt[:20]], [0])).shape[0] == 0
        results.append(runner.forward(ForwardBatch([0], [20], [prompt[20:]], [17])))
    assert torch.equal(results[0], results[1])


def test_gptq_model_the_pass_cannot_take_runs_torchs_ops_on_the_int4_products(hf_llama, tmp_path):
    """Q/k/v shards with their own act-order groups (one product each, outputs concatenated):
    torch's ops run the model, its int4 products still through the kernels."""
    options = dict(group_size=32, sym=False, act_order=True, distinct_qkv_g_idx=True)
    gptq_dir = write_gptq_checkpoint(hf_llama, tmp_path / "gptq", **options)
    float_dir = write_dequantized_copy(gptq_dir, tmp_path / "float")
    model = load_model(gptq_dir, show_progress=False)
    prompt = list(range(3, 40))
    got, native_pass = all_logits(model, prompt, 64)
    assert not native_pass
    assert len(model.model.layers[0].self_attn.qkv_proj.parts) == 3
    assert model.model.layers[0].self_attn.qkv_proj.parts[0].backend == "native"
    want, _ = all_logits(load_model(float_dir, dtype="float32", show_progress=False), prompt, 64)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)


def test_engine_reuses_any_cached_prefix_of_an_int4_model(hf_llama, tmp_path):
    """Through the native pass an int4 model computes a token alike in any call, so prefix
    caching reuses a prefix at any length (off it only whole prompt chunks were kept), and a
    seeded request gets its tokens whatever else is in the batch."""
    from brisklm.quant import QuantizeOptions, quantize_model
    from tests.tiny import make_tiny_checkpoint

    float_dir = make_tiny_checkpoint(tmp_path / "float", **SHAPE)
    gptq_dir = tmp_path / "gptq"
    options = QuantizeOptions(method="rtn", group_size=32, sym=False)
    quantize_model(float_dir, gptq_dir, options, show_progress=False)
    prompt = list(range(5, 45))
    seeded = SamplingParams(max_tokens=6, temperature=0.9, seed=7, ignore_eos=True)
    with LLM.from_pretrained(gptq_dir, show_progress=False, max_batch_size=2) as llm:
        assert llm.engine.runner.native is not None
        alone = llm.generate([prompt], seeded)[0]
        again = llm.generate([prompt[:30] + [77, 78]], seeded)[0]
        assert again.usage.cached_prompt_tokens == 30
        beside = llm.generate([prompt, list(range(60, 90))], seeded)[0]
    assert beside.token_ids == alone.token_ids
    assert [e.logprob for e in beside.logprobs or []] == [e.logprob for e in alone.logprobs or []]
    with LLM.from_pretrained(gptq_dir, show_progress=False, prefix_caching=False) as llm:
        assert llm.generate([prompt], seeded)[0].token_ids == alone.token_ids


def test_an_int4_layer_survives_pickling_copies_and_shared_memory(tmp_path):
    """The layer's C struct holds addresses: a pickled or copied layer points at its own tensors,
    and one whose tensors moved in place (``share_memory``) at where they are now."""
    import copy

    from brisklm.quant import GPTQLinear

    generator = torch.Generator().manual_seed(0)
    layer = GPTQLinear.from_float(torch.randn(96, 64, generator=generator), group_size=32)
    assert layer.backend == "native"
    x = torch.randn(3, 64, generator=generator)
    want = layer(x)
    torch.save(layer, tmp_path / "layer.pt")
    loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
    copied = copy.deepcopy(layer)
    assert copied.int4.codes.data_ptr() != layer.int4.codes.data_ptr()
    before = layer._int4_codes.data_ptr()
    layer.share_memory()
    assert layer._int4_codes.data_ptr() != before  # moved: the struct must follow
    del before
    for other in (loaded, copied, layer):
        assert torch.equal(other(x), want)


def test_a_bfloat16_gptq_checkpoint_keeps_its_tables_in_bfloat16(tmp_path):
    """GPTQ tools store scales in float16 whatever the model's dtype: a bfloat16 model's
    embedding and head stay bfloat16 by default (they were widened to float32, twice the memory
    and the head's reads a step), with the logits of the float32 load bit for bit."""
    hf_model = build_hf_model("llama", **SHAPE).to(torch.bfloat16)
    gptq_dir = write_gptq_checkpoint(hf_model, tmp_path / "gptq", group_size=32, act_order=True)
    kept = load_model(gptq_dir, show_progress=False)
    widened = load_model(gptq_dir, dtype="float32", show_progress=False)
    assert kept.model.embed_tokens.weight.dtype == torch.bfloat16
    assert widened.model.embed_tokens.weight.dtype == torch.float32
    prompt = list(range(3, 30))
    got, native_pass = all_logits(kept, prompt, 64)
    want, _ = all_logits(widened, prompt, 64)
    assert native_pass and torch.equal(got, want)


def test_a_half_precision_int4_model_on_torchs_kernel_keeps_its_dtype(hf_llama, tmp_path):
    """Only a model the native pass will run gets its float32 form: with int4 layers on torch's
    kernel (int4_compute_dtype="bfloat16") a bfloat16 model computes in bfloat16, as before."""
    from brisklm.quant import QuantizeOptions, quantize_model
    from tests.tiny import make_tiny_checkpoint

    float_dir = make_tiny_checkpoint(tmp_path / "float", **SHAPE)
    gptq_dir = tmp_path / "gptq"
    quantize_model(float_dir, gptq_dir, QuantizeOptions(method="rtn"), show_progress=False)
    kwargs = dict(dtype="bfloat16", show_progress=False)
    with LLM.from_pretrained(gptq_dir, int4_compute_dtype="bfloat16", **kwargs) as llm:
        model = llm.engine.runner.model
        assert model.compute_dtype is None and model.activation_dtype == torch.bfloat16
        assert llm.engine.runner.native is None
    with LLM.from_pretrained(gptq_dir, **kwargs) as llm:
        model = llm.engine.runner.model
        assert model.compute_dtype == torch.float32 and llm.engine.runner.native is not None
