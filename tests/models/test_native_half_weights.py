"""bfloat16 and float16 models on CPU through the native kernels: weights and KV cache stored in
half precision, arithmetic in float32. The reference is the same model loaded in float32 from a
checkpoint whose values are already bfloat16 (float16) numbers, given a KV cache of the same
dtype: the kernels widen each weight and cached element exactly as they read it and multiply in
the same order, so every logit must match bit for bit, on the native pass (decode steps,
verification rows) and on torch's ops (rows longer than MAX_QUERY_LEN). Against transformers, the
reference rounds its cache the same way."""

from __future__ import annotations

import ctypes
import inspect

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
    "qwen3-qk-norm": ("qwen3", {"head_dim": 32}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    # Heads of 64: attention's 64-output value blocks (AVX2), over bfloat16 caches read in pairs.
    "llama-head-64": (
        "llama",
        {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64},
    ),
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
    assert runner.native is not None and runner.kv_cache.keys.dtype == half
    assert model.cache_dtype == half and reference.cache_dtype == torch.float32
    reference_runner = ModelRunner(reference, num_slots=1, max_seq_len=CACHE)
    assert runner.kv_cache.keys.nbytes * 2 == reference_runner.kv_cache.keys.nbytes


def float32_with_cache(directory, dtype: str):
    """The float32 load of ``directory`` with a KV cache of ``dtype``: the reference."""
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    model.kv_cache_dtype = getattr(torch, dtype)
    return model


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_half_precision_logits_are_the_float32_logits_bit_for_bit(
    request, build, rounded_checkpoint
):
    """A prefill longer than MAX_QUERY_LEN (torch's ops), then decode, verification and ragged rows
    (the native pass) in two slots: the half-precision load and the float32 load of the same
    values with a cache of the same dtype."""
    name, half, directory, _ = rounded_checkpoint
    runners = []
    for model in (
        load_model(directory, device="cpu", dtype=half, show_progress=False),
        float32_with_cache(directory, half),
    ):
        runner = ModelRunner(model, num_slots=2, max_seq_len=CACHE)
        assert runner.native is not None
        runner.native.lib = request.getfixturevalue("native_build")(build)
        runners.append(runner)
    generator = torch.Generator().manual_seed(11)
    prompts = [
        torch.randint(3, 150, (n,), generator=generator).tolist() for n in (MAX_QUERY_LEN + 6, 9)
    ]
    steps = [ForwardBatch([0, 1], [0, 0], prompts, [2, 1])]
    lengths = [len(p) for p in prompts]
    for query in ([1, 1], [5, 1], [1, 3], [MAX_QUERY_LEN, 1]):  # from 64 tokens AVX2 widens
        tokens = [torch.randint(3, 150, (q,), generator=generator).tolist() for q in query]
        steps.append(ForwardBatch([0, 1], list(lengths), tokens, list(query)))
        lengths = [n + q for n, q in zip(lengths, query)]
    for index, batch in enumerate(steps):
        got, expected = (runner.forward(batch) for runner in runners)
        assert torch.equal(got, expected), f"{name}, step {index}"
    assert runners[0].kv_cache.keys.dtype == getattr(torch, half)
    assert torch.equal(runners[0].kv_cache.keys, runners[1].kv_cache.keys)
    assert torch.equal(runners[0].kv_cache.values, runners[1].kv_cache.values)


def rounding_cache(dtype: torch.dtype):
    """A transformers cache that stores keys and values rounded to ``dtype`` (kept in the model's
    dtype), so that attention sees them as brisklm's half-precision cache holds them."""
    from transformers import DynamicCache

    class RoundingCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            rounded = [t.to(dtype).to(t.dtype) for t in (key_states, value_states)]
            return super().update(*rounded, layer_idx, *args, **kwargs)

    return RoundingCache()


@pytest.mark.parametrize("length", [40, MAX_QUERY_LEN + 6])  # the native pass, then torch's ops
def test_half_precision_prefill_matches_transformers_with_a_rounded_cache(
    rounded_checkpoint, length
):
    name, dtype, directory, hf = rounded_checkpoint
    model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    prompt = torch.randint(3, 150, (length,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = runner.forward(ForwardBatch([0], [0], [prompt], [len(prompt)]))
    # transformers 5.x names the argument ``cache`` (``past_key_values`` before)
    argument = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.no_grad():
        theirs = hf(
            torch.tensor([prompt]),
            **{argument: rounding_cache(getattr(torch, dtype))},
            use_cache=True,
        ).logits[0]
        unrounded = hf(torch.tensor([prompt])).logits[0]
    scale = max(1.0, theirs.abs().max().item())
    diff = (ours - theirs).abs().max().item()
    # Not 1e-4: keys and values that differ by a float32 rounding in the two implementations can
    # round to neighbouring half-precision values, one unit in the last place apart, and a few
    # such flips move the logits by up to about an ulp of their scale. Measured over 518 tokens on
    # an AVX-512 Xeon: up to 0.033 in float16 (1.5 ulp of a scale of 22), 0.048 in bfloat16 (0.45
    # ulp), and transformers in float32 and in float64 differ from each other by as much.
    tolerance = 2 * torch.finfo(getattr(torch, dtype)).eps * scale
    assert diff <= tolerance, f"{name}: {diff}"
    # The rounding is there to see: the logits are much closer to the rounded reference.
    assert (ours - unrounded).abs().max().item() > 2 * diff


@pytest.mark.parametrize("build", sorted(BUILDS) + [F16C_FALLBACK])
@pytest.mark.parametrize("dtype", HALF)
def test_the_cache_rounds_as_torch_converts(request, build, dtype):
    """Keys and values are written rounded to nearest even, exactly as torch's ``.to(dtype)``:
    ties both ways, subnormals, overflow to infinity (float16), signed zeros, infinities."""
    lib = request.getfixturevalue("native_build")(build)
    half = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(5)
    widths = torch.logspace(-9, 5.2, 4001).repeat_interleave(4)
    x = torch.cat(
        [
            torch.randn(20000, generator=generator) * widths.repeat(5)[:20000],
            # every float16 and bfloat16 value, and the points halfway between neighbours
            torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(half).float(),
            torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 65504.0, 65519.0, 65520.0]),
            torch.tensor([6.1e-5, 6.0e-8, 2.9e-8, 3.0e-8, 1e-45, -1e-40, 3.4e38]),
        ]
    )
    values = x.to(half)
    upper = (values.view(torch.int16) + 1).view(half)
    x = torch.cat([x, (values.float() + upper.float()) / 2])  # exact ties (float32 holds them)
    x = x[x.isfinite() | x.isinf()].contiguous()
    out = torch.empty(x.shape, dtype=half)
    lib.brisk_test_cache_store.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    lib.brisk_test_cache_store(x.data_ptr(), x.numel(), out.data_ptr(), native.WEIGHT_TYPES[half])
    expected = x.to(half)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize("half", HALF)
def test_engine_generates_from_half_precision_what_float32_computes_with_the_same_cache(
    tmp_path, half
):
    """The engine over the half-precision load against the engine over the float32 load with a
    cache of the same dtype (``kv_cache_dtype``)."""
    from tests.tiny import train_tokenizer

    hf = rounded(build_hf_model("llama", vocab_size=300), half)
    directory = save_hf_model(hf, tmp_path / "model")
    train_tokenizer().save(str(directory / "tokenizer.json"))
    prompts = [[1, 17, 93, 5], [3 + i % 150 for i in range(MAX_QUERY_LEN + 6)]]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs = {}
    for dtype in (half, "float32"):
        llm = LLM.from_pretrained(
            directory, dtype=dtype, kv_cache_dtype=half, show_progress=False, max_seq_len=CACHE
        )
        try:
            assert llm.engine.runner.native is not None
            assert llm.engine.runner.kv_cache.keys.dtype == getattr(torch, half)
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


def test_widened_panel_buffers_are_freed_with_their_threads(native_build):
    """Each thread widens bfloat16 panels into a buffer of its own (AVX2, from 64 tokens); OpenMP's
    workers end with the thread that started them, as the engine's thread does when idle. 24
    short-lived callers (each with its team's workers) must leave no buffer behind: the library
    counts the buffers allocated now (``brisk_test_wide_buffers``). Counted, not read off the
    resident memory, which depends on glibc's arenas and on the rest of the suite (a bound on it
    failed once on a busy host)."""
    import threading
    import time

    lib = native_build("avx2")
    live = ctypes.c_int.in_dll(lib, "brisk_test_wide_buffers")
    k = 4096  # one panel of 32 outputs, widened: 512 KB a thread
    packed = native.pack(torch.ones(32, k, dtype=torch.bfloat16))
    x = torch.ones(64, k)

    def call() -> None:
        assert native.linear(x, packed, None, 32, lib=lib)[0, 0].item() == k

    def settled(most: int) -> int:
        """The count once it is at most ``most``, or after 10 s: a thread's buffer is freed as
        the thread exits, after Python's join has returned."""
        deadline = time.monotonic() + 10
        while live.value > most and time.monotonic() < deadline:
            time.sleep(0.01)
        return live.value

    before = live.value
    call()  # the buffer of this thread or of its team's worker (one panel) stays with it
    for _ in range(24):
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
    assert settled(before + 1) <= before + 1


def test_kv_cache_dtype_is_checked_and_named(tmp_path):
    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    from tests.tiny import train_tokenizer

    train_tokenizer().save(str(directory / "tokenizer.json"))
    with pytest.raises(ValueError, match="kv_cache_dtype: unsupported dtype 'int8'; supported:"):
        LLM.from_pretrained(directory, kv_cache_dtype="int8", show_progress=False)
    llm = LLM.from_pretrained(
        directory, kv_cache_dtype="bfloat16", show_progress=False, max_seq_len=CACHE
    )
    try:  # a float32 model with a bfloat16 cache: half the cache's bytes, still generating
        assert llm.engine.runner.kv_cache.keys.dtype == torch.bfloat16
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        assert len(llm.generate([[1, 5, 9]], params)[0].token_ids) == 4
    finally:
        llm.close()


@pytest.mark.parametrize("dtype", HALF)
def test_a_row_in_a_ragged_batch_gets_its_logits_alone_with_a_half_precision_cache(tmp_path, dtype):
    directory = save_hf_model(rounded(build_hf_model("llama"), dtype), tmp_path / "m")
    model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 150, (n,), generator=generator).tolist() for n in (9, 30, 4)]
    steps = [[torch.randint(3, 150, (q,), generator=generator).tolist() for q in (1, 5, 3)]]
    together = ModelRunner(model, num_slots=3, max_seq_len=CACHE)
    together.forward(ForwardBatch([0, 1, 2], [0, 0, 0], prompts, [1, 1, 1]))
    lengths = [len(p) for p in prompts]
    batched = together.forward(ForwardBatch([0, 1, 2], lengths, steps[0], [1, 5, 3]))
    offset = 0
    for row, (prompt, tokens) in enumerate(zip(prompts, steps[0])):
        alone = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
        alone.forward(ForwardBatch([0], [0], [prompt], [1]))
        logits = alone.forward(ForwardBatch([0], [len(prompt)], [tokens], [len(tokens)]))
        assert torch.equal(logits, batched[offset : offset + len(tokens)]), f"row {row}"
        offset += len(tokens)


@pytest.fixture(scope="module", params=["llama-tied-bfloat16", "qwen2-bias-float16"])
def stored_half(request, tmp_path_factory):
    """(dtype, a checkpoint stored in that half dtype, the same values stored in float32)."""
    case, _, dtype = request.param.rpartition("-")
    family, overrides = CASES[case]
    hf = rounded(build_hf_model(family, **overrides), dtype)
    as_float32 = save_hf_model(hf, tmp_path_factory.mktemp(f"{case}-float32"))
    as_half = save_hf_model(hf.to(getattr(torch, dtype)), tmp_path_factory.mktemp(case))
    return dtype, as_half, as_float32


def test_by_default_a_half_precision_checkpoint_keeps_its_weights_and_float32_logits(stored_half):
    """dtype left to its default on CPU is float32 arithmetic: a checkpoint stored in bfloat16
    (float16) keeps those weights, with a float32 KV cache, and gives the logits of the float32
    load bit for bit (a prefill longer than MAX_QUERY_LEN through torch's ops, then the native
    pass); "float32" asked for widens the weights at load."""
    dtype, as_half, as_float32 = stored_half
    half = getattr(torch, dtype)
    model = load_model(as_half, device="cpu", show_progress=False)
    assert model.model.embed_tokens.weight.dtype == half
    assert model.model.layers[0].mlp.down_proj.weight.dtype == half
    assert model.activation_dtype == torch.float32 and model.cache_dtype == torch.float32
    widened = load_model(as_half, device="cpu", dtype="float32", show_progress=False)
    assert widened.model.embed_tokens.weight.dtype == torch.float32
    reference = load_model(as_float32, device="cpu", show_progress=False)
    assert reference.model.embed_tokens.weight.dtype == torch.float32
    runners = [ModelRunner(m, num_slots=1, max_seq_len=CACHE) for m in (model, reference)]
    assert all(runner.native is not None for runner in runners)
    generator = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 150, (MAX_QUERY_LEN + 6,), generator=generator).tolist()
    tokens = torch.randint(3, 150, (4,), generator=generator).tolist()
    steps = [ForwardBatch([0], [0], [prompt], [3])]
    for offset, token in enumerate(tokens):
        steps.append(ForwardBatch([0], [len(prompt) + offset], [[token]], [1]))
    for index, batch in enumerate(steps):
        got, expected = (runner.forward(batch) for runner in runners)
        assert torch.equal(got, expected), f"step {index}"


def test_a_checkpoint_of_mixed_dtypes_loads_in_float32_by_default(stored_half, tmp_path):
    from safetensors.torch import load_file, save_file

    dtype, as_half, _ = stored_half
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for path in as_half.iterdir():
        if path.suffix != ".safetensors":
            (mixed / path.name).write_bytes(path.read_bytes())
    tensors = load_file(str(as_half / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].float()
    save_file(tensors, str(mixed / "model.safetensors"), metadata={"format": "pt"})
    model = load_model(mixed, device="cpu", show_progress=False)
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert model.cache_dtype == torch.float32


def test_without_the_kernels_a_half_precision_checkpoint_loads_in_float32_by_default(
    stored_half, without_native_kernels
):
    """torch's ops would compute in the weights' dtype: float32 was asked for, so the weights widen."""
    _, as_half, _ = stored_half
    model = load_model(as_half, device="cpu", show_progress=False)
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert model.activation_dtype == torch.float32
