"""bfloat16 models on CPU through the native kernels: weights stored in bfloat16, arithmetic in
float32. The reference is the same model loaded in float32 from a checkpoint whose values are
already bfloat16 numbers: the kernels widen each weight exactly as they read it and multiply in
the same order, so every logit must match bit for bit, on the native pass (decode steps,
verification rows) and on torch's ops (rows longer than MAX_QUERY_LEN)."""

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
from tests.models.conftest import BUILDS

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")

CACHE = 3 * MAX_QUERY_LEN


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize("k", [1, 15, 40, 768])
@pytest.mark.parametrize("rows", [1, 37, 70])
def test_bfloat16_product_has_the_bits_of_the_float32_one_over_the_same_values(
    request, build, k, rows
):
    lib = request.getfixturevalue("native_build")(build)
    generator = torch.Generator().manual_seed(k * 7 + rows)
    weight = torch.randn(rows, k, generator=generator).bfloat16()
    bias = torch.randn(rows, generator=generator)
    x = torch.randn(70, k, generator=generator)  # from 64 tokens AVX2 widens each panel first
    packed = native.pack(weight)
    assert (
        packed.dtype == torch.bfloat16 and packed.nbytes == native.pack(weight.float()).nbytes // 2
    )
    assert torch.equal(native.unpack(packed, rows), weight)
    got = native.linear(x, packed, bias, rows, lib=lib)
    assert torch.equal(got, native.linear(x, native.pack(weight.float()), bias, rows, lib=lib))
    expected = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
    torch.testing.assert_close(got.double(), expected, atol=1e-4 * max(1, k**0.5), rtol=0)
    for n in (1, 4, 17):  # a row's bits do not depend on the rows beside it (or their number)
        assert torch.equal(native.linear(x[5 : 5 + n], packed, bias, rows, lib=lib), got[5 : 5 + n])


def test_pack_and_linear_refuse_other_dtypes_by_name():
    with pytest.raises(ValueError, match="float32 or bfloat16 weights, got torch.float16"):
        native.pack(torch.zeros(4, 4, dtype=torch.float16))
    packed = native.pack(torch.zeros(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float32 inputs"):
        native.linear(torch.zeros(1, 4, dtype=torch.bfloat16), packed, None, 4)


def rounded(hf):
    """``hf`` with every parameter rounded to bfloat16 and kept in float32 (the buffers, such as
    rope's frequencies, left alone: ``.to(torch.bfloat16)`` would round them too)."""
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(param.bfloat16())
    return hf


CASES = {
    "llama-gqa": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2-bias": ("qwen2", {}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def rounded_checkpoint(request, tmp_path_factory):
    """A float32 checkpoint whose every value is a bfloat16 number, and the model it was saved from."""
    family, overrides = CASES[request.param]
    hf = rounded(build_hf_model(family, **overrides))
    return request.param, save_hf_model(hf, tmp_path_factory.mktemp(request.param)), hf


def test_a_bfloat16_model_on_cpu_keeps_its_weights_in_bfloat16_and_computes_in_float32(
    rounded_checkpoint,
):
    _, directory, _ = rounded_checkpoint
    model = load_model(directory, device="cpu", dtype="bfloat16", show_progress=False)
    reference = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    assert model.activation_dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.is_native_packed and qkv.weight.dtype == torch.bfloat16
    assert model.lm_head.is_native_packed and model.lm_head.weight.dtype == torch.bfloat16
    assert model.model.norm.weight.dtype == torch.float32
    if qkv.bias is not None:
        assert qkv.bias.dtype == torch.float32
    ref_qkv = reference.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.nbytes * 2 == ref_qkv.weight.nbytes
    assert torch.equal(qkv.dense_weight().float(), ref_qkv.dense_weight())
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    assert runner.native is not None and runner.kv_cache.keys.dtype == torch.float32


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_bfloat16_logits_are_the_float32_logits_bit_for_bit(request, build, rounded_checkpoint):
    """A prefill longer than MAX_QUERY_LEN (torch's ops), then decode, verification and ragged rows
    (the native pass) in two slots: the bfloat16 load and the float32 load of the same values."""
    name, directory, _ = rounded_checkpoint
    runners = []
    for dtype in ("bfloat16", "float32"):
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


def test_bfloat16_prefill_matches_transformers_in_float32_on_the_same_values(rounded_checkpoint):
    name, directory, hf = rounded_checkpoint
    model = load_model(directory, device="cpu", dtype="bfloat16", show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    prompt = torch.randint(3, 150, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = runner.forward(ForwardBatch([0], [0], [prompt], [len(prompt)]))
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0]
    diff = (ours - theirs).abs().max().item()
    assert diff <= 1e-4 * max(1.0, theirs.abs().max().item()), f"{name}: {diff}"


def test_engine_generates_from_bfloat16_what_it_generates_from_float32(tmp_path):
    from tests.tiny import train_tokenizer

    hf = rounded(build_hf_model("llama", vocab_size=300))
    directory = save_hf_model(hf, tmp_path / "model")
    train_tokenizer().save(str(directory / "tokenizer.json"))
    prompts = [[1, 17, 93, 5], list(range(3, 3 + MAX_QUERY_LEN + 6))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs = {}
    for dtype in ("bfloat16", "float32"):
        llm = LLM.from_pretrained(directory, dtype=dtype, show_progress=False, max_seq_len=CACHE)
        try:
            assert llm.engine.runner.native is not None
            outputs[dtype] = [o.token_ids for o in llm.generate(prompts, params)]
        finally:
            llm.close()
    assert outputs["bfloat16"] == outputs["float32"]


def test_without_the_kernels_a_bfloat16_model_computes_in_bfloat16(
    tmp_path, without_native_kernels
):
    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    model = load_model(directory, device="cpu", dtype="bfloat16", show_progress=False)
    assert model.activation_dtype == torch.bfloat16 and model.compute_dtype is None
    assert model.model.norm.weight.dtype == torch.bfloat16
    assert not model.model.layers[0].self_attn.qkv_proj.is_native_packed
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    assert runner.native is None and runner.kv_cache.keys.dtype == torch.bfloat16
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
