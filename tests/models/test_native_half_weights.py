"""bfloat16 and float16 models on CPU through the native kernels: weights stored in half
precision, arithmetic in float32. The reference is the same model loaded in float32 from a
checkpoint whose values are already bfloat16 (float16) numbers: the kernels widen each weight
exactly as they read it and multiply in the same order, so every logit must match bit for bit, on
the native pass (decode steps, verification rows) and on torch's ops (rows longer than
MAX_QUERY_LEN)."""

from __future__ import annotations

import platform

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.kernels import native
from brisklm.loader import load_model
from brisklm.models.native_forward import MAX_QUERY_LEN
from tests.hf_models import build_hf_model, save_hf_model
from tests.models.conftest import BUILDS, F16C_FALLBACK

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")

CACHE = 3 * MAX_QUERY_LEN
HALF = ["bfloat16", "float16"]
# float16 weights are widened by F16C where the CPU has it, else lane by lane: both builds.
PRODUCT_CASES = [(build, dtype) for build in sorted(BUILDS) for dtype in HALF] + [
    (F16C_FALLBACK, "float16")
]


@pytest.mark.parametrize(("build", "dtype"), PRODUCT_CASES)
@pytest.mark.parametrize("k", [1, 15, 40, 768])
@pytest.mark.parametrize("rows", [1, 37, 70])
def test_half_precision_product_has_the_bits_of_the_float32_one_over_the_same_values(
    request, build, dtype, k, rows
):
    lib = request.getfixturevalue("native_build")(build)
    generator = torch.Generator().manual_seed(k * 7 + rows)
    weight = torch.randn(rows, k, generator=generator).to(getattr(torch, dtype))
    bias = torch.randn(rows, generator=generator)
    x = torch.randn(70, k, generator=generator)  # from 64 tokens AVX2 widens each panel first
    packed = native.pack(weight)
    assert packed.dtype == weight.dtype
    assert packed.nbytes == native.pack(weight.float()).nbytes // 2
    assert torch.equal(native.unpack(packed, rows), weight)
    got = native.linear(x, packed, bias, rows, lib=lib)
    assert torch.equal(got, native.linear(x, native.pack(weight.float()), bias, rows, lib=lib))
    expected = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
    torch.testing.assert_close(got.double(), expected, atol=1e-4 * max(1, k**0.5), rtol=0)
    for n in (1, 4, 17):  # a row's bits do not depend on the rows beside it (or their number)
        assert torch.equal(native.linear(x[5 : 5 + n], packed, bias, rows, lib=lib), got[5 : 5 + n])


@pytest.mark.parametrize("build", sorted(BUILDS) + [F16C_FALLBACK])
def test_float16_widening_is_exact_for_every_value(request, build):
    """Every float16 bit pattern as a weight (65,536 outputs of one input) times 1: each output is
    the weight widened, in the tiles and (from 64 tokens with AVX2) over the widened panel:
    subnormals, infinities and the largest values exact, NaNs NaN (the accumulator starts at +0,
    so -0 comes out +0, as in the float32 product)."""
    lib = request.getfixturevalue("native_build")(build)
    weight = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    weight = weight.view(-1, 1)
    expected = weight.float().view(-1) + 0.0
    nan = expected.isnan()
    packed = native.pack(weight)
    for n in (1, 2, 3, 70):
        got = native.linear(torch.ones(n, 1), packed, None, weight.shape[0], lib=lib)
        assert torch.equal(got[:, ~nan], expected[~nan].expand(n, -1))
        assert got[:, nan].isnan().all()


def test_pack_and_linear_refuse_other_dtypes_by_name():
    with pytest.raises(ValueError, match="float32, bfloat16 or float16 weights, got torch.float64"):
        native.pack(torch.zeros(4, 4, dtype=torch.float64))
    packed = native.pack(torch.zeros(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float32 inputs"):
        native.linear(torch.zeros(1, 4, dtype=torch.bfloat16), packed, None, 4)


def rounded(hf, dtype: str):
    """``hf`` with every parameter rounded to ``dtype`` and kept in float32 (the buffers, such as
    rope's frequencies, left alone: ``.to(dtype)`` would round them too)."""
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(param.to(getattr(torch, dtype)))
    return hf


CASES = {
    "llama-gqa": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2-bias": ("qwen2", {}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    # A width that is no multiple of 8: the embedding rows' and the products' tails.
    "llama-width-36": (
        "llama",
        {
            "hidden_size": 36,
            "intermediate_size": 52,
            "num_attention_heads": 3,
            "head_dim": 12,
            "num_key_value_heads": 1,
        },
    ),
}


@pytest.fixture(
    scope="module", params=[(case, dtype) for case in sorted(CASES) for dtype in HALF], ids=str
)
def rounded_checkpoint(request, tmp_path_factory):
    """A float32 checkpoint whose every value is a bfloat16 (float16) number, the dtype, and the
    model it was saved from."""
    case, dtype = request.param
    family, overrides = CASES[case]
    hf = rounded(build_hf_model(family, **overrides), dtype)
    name = f"{case}-{dtype}"
    return name, dtype, save_hf_model(hf, tmp_path_factory.mktemp(name)), hf


def test_a_half_precision_model_on_cpu_keeps_its_weights_and_computes_in_float32(
    rounded_checkpoint,
):
    _, dtype, directory, _ = rounded_checkpoint
    half = getattr(torch, dtype)
    model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
    reference = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    assert model.activation_dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == half
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.is_native_packed and qkv.weight.dtype == half
    assert model.lm_head.is_native_packed and model.lm_head.weight.dtype == half
    assert model.model.norm.weight.dtype == torch.float32
    if qkv.bias is not None:
        assert qkv.bias.dtype == torch.float32
    ref_qkv = reference.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.nbytes * 2 == ref_qkv.weight.nbytes
    assert torch.equal(qkv.dense_weight().float(), ref_qkv.dense_weight())
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    assert runner.native is not None and runner.kv_cache.keys.dtype == torch.float32


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_half_precision_logits_are_the_float32_logits_bit_for_bit(
    request, build, rounded_checkpoint
):
    """A prefill longer than MAX_QUERY_LEN (torch's ops), then decode, verification and ragged rows
    (the native pass) in two slots: the half-precision load and the float32 load of the same
    values."""
    name, half, directory, _ = rounded_checkpoint
    runners = []
    for dtype in (half, "float32"):
        model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
        runner = ModelRunner(model, num_slots=2, max_seq_len=CACHE)
        assert runner.native is not None
        runner.native.lib = request.getfixturevalue("native_build")(build)
        runners.append(runner)
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 150, (n,), generator=generator).tolist() for n in (70, 9)]
    steps = [ForwardBatch([0, 1], [0, 0], prompts, [2, 1])]
    lengths = [len(p) for p in prompts]
    for query in ([1, 1], [5, 1], [1, 3], [MAX_QUERY_LEN, 1]):  # 65 tokens: AVX2 widens
        tokens = [torch.randint(3, 150, (q,), generator=generator).tolist() for q in query]
        steps.append(ForwardBatch([0, 1], list(lengths), tokens, list(query)))
        lengths = [n + q for n, q in zip(lengths, query)]
    for index, batch in enumerate(steps):
        got, expected = (runner.forward(batch) for runner in runners)
        assert torch.equal(got, expected), f"{name}, step {index}"
    assert torch.equal(runners[0].kv_cache.keys, runners[1].kv_cache.keys)


def test_half_precision_prefill_matches_transformers_in_float32_on_the_same_values(
    rounded_checkpoint,
):
    name, dtype, directory, hf = rounded_checkpoint
    model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    prompt = torch.randint(3, 150, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = runner.forward(ForwardBatch([0], [0], [prompt], [len(prompt)]))
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0]
    diff = (ours - theirs).abs().max().item()
    assert diff <= 1e-4 * max(1.0, theirs.abs().max().item()), f"{name}: {diff}"


@pytest.mark.parametrize("half", HALF)
def test_engine_generates_from_half_precision_what_it_generates_from_float32(tmp_path, half):
    from tests.tiny import train_tokenizer

    hf = rounded(build_hf_model("llama", vocab_size=300), half)
    directory = save_hf_model(hf, tmp_path / "model")
    train_tokenizer().save(str(directory / "tokenizer.json"))
    prompts = [[1, 17, 93, 5], list(range(3, 3 + MAX_QUERY_LEN + 6))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs = {}
    for dtype in (half, "float32"):
        llm = LLM.from_pretrained(directory, dtype=dtype, show_progress=False, max_seq_len=CACHE)
        try:
            assert llm.engine.runner.native is not None
            outputs[dtype] = [o.token_ids for o in llm.generate(prompts, params)]
        finally:
            llm.close()
    assert outputs[half] == outputs["float32"]


@pytest.mark.parametrize("dtype", HALF)
def test_without_the_kernels_a_half_precision_model_computes_in_its_dtype(
    tmp_path, without_native_kernels, dtype
):
    half = getattr(torch, dtype)
    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
    assert model.activation_dtype == half and model.compute_dtype is None
    assert model.model.norm.weight.dtype == half
    assert not model.model.layers[0].self_attn.qkv_proj.is_native_packed
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    assert runner.native is None and runner.kv_cache.keys.dtype == half
    assert runner.forward(ForwardBatch([0], [0], [[3, 4, 5]], [1])).isfinite().all()


def resident_bytes() -> int:
    import os

    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/self/statm")
def test_widened_panel_buffers_are_freed_with_their_threads(native_build):
    """Each thread widens bfloat16 panels into a buffer of its own (AVX2, from 64 tokens); OpenMP's
    workers end with the thread that started them, as the engine's thread does when idle. 24
    short-lived callers of a product whose buffer is 16 MB a thread must not keep them (before the
    buffers were freed with their threads, 12 callers kept 192 MB; since, the allocator holds
    16-48 MB however many callers come)."""
    import threading

    lib = native_build("avx2")
    k = 131072  # one panel of 32 outputs: 131072 x 32 floats widened = 16 MB
    packed = native.pack(torch.ones(32, k, dtype=torch.bfloat16))
    x = torch.ones(64, k)

    def call() -> None:
        assert native.linear(x, packed, None, 32, lib=lib)[0, 0].item() == k

    for _ in range(2):  # the allocator's own high-water mark first
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
    before = resident_bytes()
    for _ in range(24):
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
    assert resident_bytes() - before < 128 * 2**20
