"""The native CPU kernels against plain torch: the product, and whole forward passes of each family."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys

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

# Cache positions for the model tests: rows just past MAX_QUERY_LEN fit, several times over.
CACHE = 3 * MAX_QUERY_LEN


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize("k", [1, 15, 16, 40, 75, 768])
@pytest.mark.parametrize("rows", [1, 3, 32, 37, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_a_float64_reference_and_each_row_alone(request, build, k, rows, bias):
    lib = request.getfixturevalue("native_build")(build)
    generator = torch.Generator().manual_seed(k * 100 + rows)
    weight = torch.randn(rows, k, generator=generator)
    b = torch.randn(rows, generator=generator) if bias else None
    x = torch.randn(13, k, generator=generator)  # 6-token tiles 6+6+1, 3-token tiles 3+3+3+3+1
    packed = native.pack(weight)
    assert torch.equal(native.unpack(packed, rows), weight)
    got = native.linear(x, packed, b, rows, lib=lib)
    expected = torch.nn.functional.linear(
        x.double(), weight.double(), None if b is None else b.double()
    )
    torch.testing.assert_close(got.double(), expected, atol=1e-4 * max(1, k**0.5), rtol=0)
    for n in (1, 2, 5):  # a row's bits do not depend on the rows beside it
        assert torch.equal(native.linear(x[3 : 3 + n], packed, b, rows, lib=lib), got[3 : 3 + n])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pack_writes_the_panel_layout(dtype):
    weight = torch.randn(200, 40_000, generator=torch.Generator().manual_seed(1)).to(dtype)
    packed = native.pack(weight)
    assert packed.shape == (7, 40_000, native.PANEL)
    assert torch.equal(native.unpack(packed, 200), weight)
    assert not native.unpack(packed, 7 * native.PANEL)[200:].any()  # the padding is zeros
    panel = weight[32:64].t()  # the second panel, k-major (bfloat16 outputs paired)
    if dtype == torch.bfloat16:
        panel = panel[:, native._BF16_ORDER]
    assert torch.equal(packed[1], panel)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pack_holds_one_more_copy_of_the_weight_at_most(dtype):
    # A padded copy of the whole matrix (and for bfloat16 a reordered one) beside the packed one:
    # a 128k-token vocabulary's head was held three times at once while loading.
    script = f"""
import resource, torch
from brisklm.kernels import native
weight = torch.empty(4101, 8192, dtype=torch.{dtype}).uniform_()
native.pack(weight[:64])  # the library and its first allocations
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
packed = native.pack(weight)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024 / weight.nbytes)
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout) < 1.3  # the packed copy (and its last panel on the way)


def test_rows_without_logits_give_an_empty_result_on_either_path(checkpoint):
    _, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=2, max_seq_len=CACHE)
    long_row = [3 + i % 150 for i in range(MAX_QUERY_LEN + 3)]
    for slot, tokens in enumerate([long_row, [4, 5]]):
        logits = runner.forward(ForwardBatch([slot], [0], [tokens], [0]))
        assert logits.shape == (0, model.config.vocab_size)


@contextlib.contextmanager
def thread_setup(count: int, idle_share: int = -1, late: int = -1):
    """torch's thread count (the kernels' team size) set to ``count``, and the kernels' test hooks
    ``brisk_test_idle_share``: that thread leaves its own share of each product's panels to the
    others, so that taking panels from another thread's share runs whatever the timing; and
    ``brisk_test_late_thread``: that thread comes to every barrier late, so that the others sleep
    there and are woken."""
    threads = torch.get_num_threads()
    hook = ctypes.c_int.in_dll(native.library(), "brisk_test_idle_share")
    late_hook = ctypes.c_int.in_dll(native.library(), "brisk_test_late_thread")
    torch.set_num_threads(count)
    hook.value, late_hook.value = idle_share, late
    try:
        yield
    finally:
        hook.value = late_hook.value = -1
        torch.set_num_threads(threads)


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_product_streamed_from_memory_has_the_bits_of_its_halves(request, build):
    """A product of 64 MB or more prefetches a single token's weight rows too (STREAM_FROM in
    cpu_forward.c); prefetches change no arithmetic, so each half (32 MB, under the threshold)
    gives the same bits as the whole."""
    lib = request.getfixturevalue("native_build")(build)
    generator = torch.Generator().manual_seed(64)
    weight = torch.randn(4096, 4096, generator=generator)  # 64 MB of float32
    x = torch.randn(2, 4096, generator=generator)
    whole = native.pack(weight)
    halves = [native.pack(half) for half in weight.split(2048)]
    for n in (1, 2):
        got = native.linear(x[:n], whole, None, 4096, lib=lib)
        parts = [native.linear(x[:n], half, None, 2048, lib=lib) for half in halves]
        assert torch.equal(got, torch.cat(parts, dim=1))


@pytest.mark.parametrize("rows", [70, 1000])
def test_linear_bits_do_not_depend_on_the_thread_count(rows):
    """Each thread takes panels of 32 outputs from its own share (a single token up to four at a
    time, read together), then from the back of the others' (more threads than panels at 70
    rows): every output is computed once, the same way, also where one thread leaves its whole
    share to the others; a single token gets the bits it has among six."""
    generator = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(rows, 33, generator=generator), torch.randn(6, 33, generator=generator)
    packed = native.pack(weight)
    results = {}
    for count, idle in [(1, -1), (2, -1), (3, -1), (5, -1), (8, -1), (1, 0), (2, 0), (3, 1)]:
        with thread_setup(count, idle):
            results[count, idle] = [native.linear(x, packed, None, rows) for _ in range(3)]
            results[count, idle] += [native.linear(x[2:3], packed, None, rows) for _ in range(3)]
    one = results[1, -1][0]
    torch.testing.assert_close(
        one.double(), torch.nn.functional.linear(x.double(), weight.double()), atol=1e-4, rtol=0
    )
    for setup, outs in results.items():
        for out in outs[:3]:
            assert torch.equal(out, one), setup
        for out in outs[3:]:
            assert torch.equal(out, one[2:3]), setup


CASES = {
    "llama-gqa": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2-bias": ("qwen2", {}),
    "qwen3-qk-norm": ("qwen3", {"head_dim": 32, "attention_bias": True}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    "llama-head-dim-40": ("llama", {"hidden_size": 80, "num_attention_heads": 2, "head_dim": 40}),
    # Head sizes for the AVX2 attention's paths: not a multiple of 8 (4-key scores), and two
    # 64-float blocks of values plus a remainder.
    "llama-head-dim-20": ("llama", {"hidden_size": 40, "num_attention_heads": 2, "head_dim": 20}),
    "llama-head-dim-136": (
        "llama",
        {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 136},
    ),
    # 18 query heads on one KV head: more than attention's 16 queries a unit, so a group's heads
    # are split between units; 72-wide heads: a 64-float block of values and a remainder, in tiles
    # of 48 keys (float32) that the rows cross.
    "llama-18-heads-one-kv": (
        "llama",
        {"hidden_size": 72, "num_attention_heads": 18, "num_key_value_heads": 1, "head_dim": 72},
    ),
    # Rows run past the trained context of 24: cos/sin computed per row, not looked up.
    "llama-dynamic-rope": (
        "llama",
        {
            "max_position_embeddings": 24,
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        },
    ),
    "llama-yarn-rope": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):
    family, overrides = CASES[request.param]
    directory = save_hf_model(
        build_hf_model(family, **overrides), tmp_path_factory.mktemp(request.param)
    )
    return request.param, directory


def runner_on_build(request, build, model, **kwargs) -> ModelRunner:
    """A ModelRunner whose native pass calls the given build of the kernels (conftest.BUILDS)."""
    runner = ModelRunner(model, **kwargs)
    assert runner.native is not None
    runner.native.lib = request.getfixturevalue("native_build")(build)
    return runner


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_native_pass_matches_torch_ops_on_ragged_rows(request, build, checkpoint):
    """Prefill (torch ops), then decode and verification rows at ragged positions in several
    slots, each step run both ways on copies of the cache; sliding windows shorter than the rows."""
    name, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = runner_on_build(request, build, model, num_slots=4, max_seq_len=CACHE)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 150, (n,), generator=generator).tolist() for n in (20, 30, 17)]
    slots = [2, 0, 3]
    runner.forward(ForwardBatch(slots, [0, 0, 0], prompts, [1, 1, 1]))
    lengths = [len(p) for p in prompts]
    native_pass = runner.native
    for step, query in enumerate([[1, 1, 1], [3, 1, 2], [1, 4, 1], [MAX_QUERY_LEN, 1, 2]]):
        tokens = [torch.randint(3, 150, (q,), generator=generator).tolist() for q in query]
        batch = ForwardBatch(slots, list(lengths), tokens, list(query))
        keys, values = runner.kv_cache.keys.clone(), runner.kv_cache.values.clone()
        runner.native = None
        expected = runner.forward(batch)
        torch_keys = runner.kv_cache.keys.clone()
        runner.kv_cache.keys.copy_(keys)
        runner.kv_cache.values.copy_(values)
        runner.native = native_pass
        got = runner.forward(batch)
        # Products summed in another order, at an init of 0.5 (logits ~16): up to ~3e-5 of the
        # logit scale over rows of up to 32 tokens, test_parity's batch tolerance; 3.6e-5 with
        # 136-wide heads on an AVX-512 Xeon with AMX (2026-12-02); 5.7e-5 over a 256-token row
        # with 40-wide heads (session 36), where against transformers in float64 the native
        # pass's largest error was 3.3e-4 and torch's ops' 4.8e-4. Bugs show as O(1).
        diff = (got - expected).abs().max().item()
        scale = expected.abs().max().item()
        assert diff <= 1e-4 * scale, f"{name} step {step}: max |logit diff| {diff} of {scale}"
        # The native pass wrote the same keys into the cache: the deeper layers' keys carry the
        # rounding of the layers below (one of 208,896 off by 3e-4 with 136-wide heads on the
        # AMX Xeon, 2026-12-02); a bug moves many, by O(1).
        torch.testing.assert_close(runner.kv_cache.keys, torch_keys, atol=5e-4, rtol=5e-4)
        lengths = [n + q for n, q in zip(lengths, query)]


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_row_gets_the_bits_of_its_tokens_fed_one_at_a_time(request, build, checkpoint):
    """Each token of a row is computed as it would be alone (products, attention, everything): a
    row of 11 tokens gives bit for bit the logits of the same tokens fed one per call."""
    name, directory = checkpoint
    if name == "llama-dynamic-rope":
        pytest.skip("dynamic NTK scales rope by the row's last position: a longer row differs")
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = runner_on_build(request, build, model, num_slots=2, max_seq_len=CACHE)
    generator = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 150, (45,), generator=generator).tolist()
    runner.forward(ForwardBatch([1], [0], [prompt], [1]))
    row = torch.randint(3, 150, (11,), generator=generator).tolist()
    keys, values = runner.kv_cache.keys.clone(), runner.kv_cache.values.clone()
    together = runner.forward(ForwardBatch([1], [len(prompt)], [row], [len(row)]))
    runner.kv_cache.keys.copy_(keys)
    runner.kv_cache.values.copy_(values)
    alone = torch.cat(
        [
            runner.forward(ForwardBatch([1], [len(prompt) + i], [[token]], [1]))
            for i, token in enumerate(row)
        ]
    )
    assert torch.equal(together, alone), name


def test_the_forward_pass_bits_do_not_depend_on_the_thread_count(checkpoint):
    """Whole passes (products that store and products that add into the residual stream) at 1, 2,
    3 and 5 threads, with one thread leaving its panels to the others, and with one coming late to
    every barrier (the others asleep there till the last comes), give the same logits."""
    name, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    prompt = torch.randint(3, 150, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    runner.forward(ForwardBatch([0], [0], [prompt], [1]))
    keys, values = runner.kv_cache.keys.clone(), runner.kv_cache.values.clone()
    results = {}
    setups = [(1, -1, -1), (2, -1, -1), (3, -1, -1), (5, -1, -1), (2, 0, -1), (2, 1, -1)]
    setups += [(3, 2, -1), (2, -1, 0), (3, -1, 1), (3, 0, 2)]
    for count, idle, late in setups:
        with thread_setup(count, idle, late):
            runner.kv_cache.keys.copy_(keys)
            runner.kv_cache.values.copy_(values)
            results[count, idle, late] = runner.forward(ForwardBatch([0], [20], [[7, 8, 9]], [3]))
    for setup, logits in results.items():
        assert torch.equal(logits, results[1, -1, -1]), f"{name}: {setup}"


def test_a_batch_mixing_short_and_long_rows_runs_each_its_own_way(checkpoint):
    _, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=3, max_seq_len=CACHE)
    long_row, short_row = [3 + i % 150 for i in range(MAX_QUERY_LEN + 5)], [5, 9, 11]
    alone = [
        runner.forward(ForwardBatch([0], [0], [long_row], [2])),
        runner.forward(ForwardBatch([1], [0], [short_row], [3])),
    ]
    mixed = runner.forward(ForwardBatch([2, 1], [0, 0], [long_row, short_row], [2, 3], True))
    assert torch.equal(mixed[:2], alone[0])
    assert torch.equal(mixed[2:], alone[1])


def test_engine_generates_the_same_text_with_and_without_the_kernels(tmp_path, monkeypatch):
    directory = save_hf_model(build_hf_model("llama", vocab_size=300), tmp_path / "model")
    from tests.tiny import train_tokenizer

    train_tokenizer().save(str(directory / "tokenizer.json"))
    prompts = [[1, 17, 93, 5], [1, 44, 120, 8, 61, 33, 150, 9, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def generate() -> tuple[bool, list[list[int]]]:
        llm = LLM.from_pretrained(directory, show_progress=False, max_seq_len=CACHE)
        try:
            return llm.engine.runner.native is not None, [
                o.token_ids for o in llm.generate(prompts, params)
            ]
        finally:
            llm.close()

    with_kernels = generate()
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    native.library.cache_clear()
    try:
        without = generate()
    finally:
        monkeypatch.undo()
        native.library.cache_clear()
    assert with_kernels[0] and not without[0]
    assert with_kernels[1] == without[1]


def test_the_environment_switch_and_a_missing_compiler_fall_back(monkeypatch):
    monkeypatch.setenv(native.ENV_SWITCH, "off")
    native.library.cache_clear()
    try:
        assert native.library() is None
        monkeypatch.setenv(native.ENV_SWITCH, "1")
        monkeypatch.setenv("CC", "")
        monkeypatch.setattr(native.shutil, "which", lambda name: None)
        native.library.cache_clear()
        assert native.library() is None
    finally:
        monkeypatch.undo()
        native.library.cache_clear()
    assert native.available()


def refused_library(monkeypatch, caplog) -> str:
    """With the monkeypatched setting, the library is refused: the warning logged (then restored)."""
    native.library.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert native.library() is None
        return caplog.text
    finally:
        monkeypatch.undo()
        native.library.cache_clear()
        assert native.available()


def test_a_failed_build_is_logged_and_falls_back(monkeypatch, tmp_path, caplog):
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setenv("BRISKLM_CACHE_DIR", str(tmp_path / "cache"))
    assert "native CPU kernels unavailable" in refused_library(monkeypatch, caplog)


def test_no_compiler_is_a_warning_that_says_what_to_install(monkeypatch, caplog):
    # It was logged at INFO: a host without gcc decoded through torch's ops, silently slower.
    monkeypatch.setattr(native, "_compiler", lambda: None)
    logged = refused_library(monkeypatch, caplog)
    assert "no C compiler found" in logged and "install one (e.g. gcc)" in logged


def test_cc_may_carry_arguments_and_a_missing_one_is_named(monkeypatch, tmp_path, caplog):
    # "ccache gcc" was looked up as one program name and cc used instead, silently.
    monkeypatch.setenv("CC", "env cc")
    assert native._compiler() == "env cc"
    monkeypatch.setenv("BRISKLM_CACHE_DIR", str(tmp_path))
    native.library.cache_clear()
    try:
        assert native.library() is not None  # built by `env cc ...`
    finally:
        native.library.cache_clear()
    # A path with a space is one program (it was split into two words).
    spaced = tmp_path / "my tools"
    spaced.mkdir()
    (spaced / "gcc").symlink_to(shutil.which("cc"))
    monkeypatch.setenv("CC", str(spaced / "gcc"))
    assert native._compiler() == str(spaced / "gcc")
    assert native._command(str(spaced / "gcc")) == [str(spaced / "gcc")]
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level("WARNING"):
        assert native._compiler() in ("cc", "gcc", "clang")
    assert "$CC='/nonexistent/cc' is not a command brisklm can run" in caplog.text


def test_the_library_builds_into_an_empty_cache(monkeypatch, tmp_path, capsys):
    """Building takes ~8 s on two cores, which a model loaded with show_progress says (the first
    run of the CLI after an install was ~7 s slower, silently)."""
    monkeypatch.setenv("BRISKLM_CACHE_DIR", str(tmp_path))
    native.library.cache_clear()
    try:
        with native.announcing_build():
            assert native.available()
        built = list((tmp_path / "native").glob("brisk_cpu_forward_*.so"))
        assert len(built) == 1
        assert capsys.readouterr().err == (
            "brisklm: building the native CPU kernels (once per machine and compiler, ~8 s)\n"
        )
        native.library.cache_clear()
        with native.announcing_build():
            assert native.available()  # built: loaded, nothing said
        assert capsys.readouterr().err == ""
        # A load builds it where it is not (the copy stands in for the compiler), saying so with
        # show_progress, whatever first asks for the kernels (an int4 layer did, unsaid).
        monkeypatch.setattr(native, "compile_library", lambda c, s, out: shutil.copy(built[0], out))
        from tests.tiny import make_tiny_checkpoint

        model = make_tiny_checkpoint(tmp_path / "model")
        for show in (False, True):
            monkeypatch.setenv("BRISKLM_CACHE_DIR", str(tmp_path / f"fresh-{show}"))
            native.library.cache_clear()
            LLM.from_pretrained(model, show_progress=show).close()
            said = "brisklm: building the native CPU kernels" in capsys.readouterr().err
            assert said == show
    finally:
        monkeypatch.undo()
        native.library.cache_clear()


def test_the_probe_runs_off_the_calling_thread(monkeypatch):
    """Its parallel region must not leave an OpenMP pool on the caller's thread (with the engine's
    pool, two pools make libgomp put idle workers to sleep)."""
    import threading

    probed_on = []
    real_probe = native._probe
    monkeypatch.setattr(
        native,
        "_probe",
        lambda lib: (probed_on.append(threading.current_thread()), real_probe(lib)),
    )
    native.library.cache_clear()
    try:
        assert native.library() is not None
        assert len(probed_on) == 1 and probed_on[0] is not threading.current_thread()
    finally:
        monkeypatch.undo()
        native.library.cache_clear()


@pytest.mark.parametrize("path", ["native", "torch"])
def test_bad_rows_are_refused_before_anything_is_written(checkpoint, path):
    _, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=2, max_seq_len=CACHE)
    length = 3 if path == "native" else MAX_QUERY_LEN + 3
    tokens = [4 + i % 150 for i in range(length)]
    before = runner.kv_cache.keys.clone()
    bad = [
        ForwardBatch([2], [0], [tokens], [1]),  # no such slot
        ForwardBatch([-1], [0], [tokens], [1]),
        ForwardBatch([0], [-2], [tokens], [1]),  # before the cache
        ForwardBatch([0], [0], [tokens], [length + 1]),  # more logits than tokens
        ForwardBatch([0, 1], [0], [tokens], [1]),  # lists of different lengths
    ]
    for batch in bad:
        with pytest.raises(ValueError):
            runner.forward(batch)
    assert torch.equal(runner.kv_cache.keys, before)
    assert runner.forward(ForwardBatch([1], [0], [tokens], [1])).shape[0] == 1


def test_a_runner_with_another_backend_shares_the_model_with_a_native_one(checkpoint):
    """A reference-backend runner runs torch's ops on the row-major weights (nothing repacked
    under the native runner that shares the model)."""
    _, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    fast = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    reference = ModelRunner(model, num_slots=1, max_seq_len=CACHE, attention_backend="reference")
    assert fast.native is not None and reference.native is None
    long_row = [3 + i % 150 for i in range(MAX_QUERY_LEN + 4)]

    def run(runner: ModelRunner) -> torch.Tensor:
        prefill = runner.forward(ForwardBatch([0], [0], [long_row], [1]))
        step = runner.forward(ForwardBatch([0], [len(long_row)], [[9]], [1]))
        return torch.cat([prefill, step])

    before = run(fast)
    by_reference = run(reference)
    assert torch.equal(run(fast), before)
    torch.testing.assert_close(by_reference, before, atol=2e-4, rtol=0)


def test_a_replaced_cache_is_followed(checkpoint):
    from brisklm.cache.contiguous import KVCache

    _, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    tokens = [4, 5, 6, 7]
    first = runner.forward(ForwardBatch([0], [0], [tokens], [1]))
    config = model.config
    runner.kv_cache = runner.native.kv_cache = KVCache(
        config.num_hidden_layers, 2, 32, config.num_key_value_heads, config.head_dim,
        torch.float32, "cpu",
    )  # fmt: skip
    runner.max_seq_len = 32
    again = runner.forward(ForwardBatch([1], [0], [tokens], [1]))
    assert torch.equal(again, first)
    assert runner.kv_cache.keys[:, 1, :, :4].abs().sum() > 0


def test_a_cache_folder_others_can_write_is_refused(monkeypatch, tmp_path, caplog):
    shared = tmp_path / "shared"
    (shared / "native").mkdir(parents=True)
    (shared / "native").chmod(0o777)
    monkeypatch.setenv("BRISKLM_CACHE_DIR", str(shared))
    assert "not private" in refused_library(monkeypatch, caplog)


def test_a_cache_folder_brisklm_makes_under_umask_002_is_private(tmp_path):
    # Made group-writable by the umask (many distributions' default), it was then refused: every
    # model ran on torch's ops, and the warning's advice (a new BRISKLM_CACHE_DIR) failed the same
    folder = tmp_path / "cache" / "native"
    previous = os.umask(0o002)
    try:
        native._make_private_folder(folder)
    finally:
        os.umask(previous)
    assert folder.stat().st_mode & 0o777 == 0o700
    native._check_private(folder)  # not refused
    native._make_private_folder(folder)  # there already: left as it is


def test_threads_asleep_for_a_late_teammate_cut_the_team_and_the_bits_stay(checkpoint):
    """A thread coming late to every barrier (as a preempted one does) makes the others sleep
    there: the kernels count the time (brisk_barrier_sleep_ns), and after a window of such
    passes the pass runs one thread fewer, with the same logits; torch's count stays."""
    from brisklm.kernels.team_size import TEAM, WINDOW_S

    name, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=CACHE)
    slept = ctypes.c_int64.in_dll(native.library(), "brisk_barrier_sleep_ns")
    batch = ForwardBatch([0], [0], [[5, 6, 7]], [3])
    expected = runner.forward(batch)
    with thread_setup(2, late=1):
        before, passes = slept.value, 0
        while TEAM.cap is None:
            assert runner.forward(batch).equal(expected), name
            passes += 1
            assert passes < 20 * WINDOW_S / 300e-6, "no cap after many late passes"
        # The sleep was counted (how much of the window depends on the host's load: no timing).
        assert slept.value > before
        assert runner.forward(batch).equal(expected)
        assert TEAM.cap == 1 and runner.native.args.n_threads == 1
        assert torch.get_num_threads() == 2


def cache_put_back(
    runner: ModelRunner, keys: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The runner's cache's keys and values (copies) before they are set back to ``keys`` and
    ``values``: what a call of several steps wrote, before the steps run a call each."""
    written = runner.kv_cache.keys.clone(), runner.kv_cache.values.clone()
    runner.kv_cache.keys.copy_(keys)
    runner.kv_cache.values.copy_(values)
    return written


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_greedy_steps_in_one_call_are_the_steps_one_call_each(request, build, checkpoint):
    """``run_steps``: n greedy passes of one token a row in one call of the kernels give the
    tokens and the cache (keys and values, bit for bit) of n calls of ``forward_greedy``, rows at
    ragged positions in several slots, sliding windows shorter than the rows; past a dynamic-NTK
    model's trained context (rotary tables per row) it declines."""
    name, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = runner_on_build(request, build, model, num_slots=4, max_seq_len=CACHE)
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 150, (n,), generator=generator).tolist() for n in (9, 14, 6)]
    slots = [3, 1, 0]
    columns = model.config.vocab_size - 3  # the greedy tokens of the first columns only
    _, firsts = runner.forward_greedy(ForwardBatch(slots, [0, 0, 0], prompts, [1, 1, 1]), columns)
    starts = [len(p) for p in prompts]
    keys, values = runner.kv_cache.keys.clone(), runner.kv_cache.values.clone()
    steps = 7
    got = runner.run_steps(
        ForwardBatch(slots, starts, [[t] for t in firsts], [1, 1, 1]), columns, steps
    )
    if name == "llama-dynamic-rope":  # trained context 24: 14 + 7 stays inside it
        assert got is not None
        late = ForwardBatch(slots, [20, 21, 22], [[5], [6], [7]], [1, 1, 1])
        assert runner.run_steps(late, columns, 4) is None  # past 24: declined, nothing ran
    assert got is not None and len(got) == steps and all(len(row) == 3 for row in got)
    assert all(0 <= t < columns for row in got for t in row)
    stepped_keys, stepped_values = cache_put_back(runner, keys, values)
    want, tokens = [], firsts
    for step in range(steps):
        batch = ForwardBatch(slots, [s + step for s in starts], [[t] for t in tokens], [1, 1, 1])
        _, tokens = runner.forward_greedy(batch, columns)
        want.append(list(tokens))
    assert got == want, name
    assert torch.equal(stepped_keys, runner.kv_cache.keys), name
    assert torch.equal(stepped_values, runner.kv_cache.values), name


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_sampled_steps_in_one_call_draw_what_the_sampler_draws_a_call_each(
    request, build, checkpoint
):
    """``run_steps`` with ``StepSampling``: each sampled row's token at each step is what
    ``native_draws`` draws with that step's uniform from the logits of a call a step (their columns
    past ``columns`` at -inf, as the engine masks them), beside a greedy row; the cache is the
    calls' bit for bit, and so are the logits kept in ``step_logits`` (raw: before the masks)."""
    from brisklm.models.native_forward import StepSampling
    from brisklm.sampling import SamplingMetadata
    from brisklm.sampling.sampler import native_draws

    name, directory = checkpoint
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = runner_on_build(request, build, model, num_slots=4, max_seq_len=CACHE)
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 150, (n,), generator=generator).tolist() for n in (9, 14, 6)]
    slots, steps, vocab = [2, 0, 3], 6, model.config.vocab_size
    columns = vocab - 3
    params = [
        SamplingParams(temperature=1.5, top_k=40),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.9, top_p=0.9, min_p=0.01),
    ]
    md = SamplingMetadata.build(
        params, prompts, [[], [], []], [None] * 3, vocab_size=vocab, device="cpu"
    )
    uniforms = torch.rand(steps, 3, dtype=torch.float64, generator=generator)
    sampling = StepSampling(uniforms, torch.tensor([True, False, True]), md.filter_rows)
    _, firsts = runner.forward_greedy(ForwardBatch(slots, [0, 0, 0], prompts, [1, 1, 1]), columns)
    starts = [len(p) for p in prompts]
    keys, values = runner.kv_cache.keys.clone(), runner.kv_cache.values.clone()
    step_logits = torch.full((steps, 3, vocab), float("nan"))
    got = runner.run_steps(
        ForwardBatch(slots, starts, [[t] for t in firsts], [1, 1, 1]),
        columns,
        steps,
        sampling,
        None,
        step_logits,
    )
    assert got is not None and len(got) == steps
    stepped_keys, stepped_values = cache_put_back(runner, keys, values)
    want, tokens = [], firsts
    for step in range(steps):
        batch = ForwardBatch(slots, [s + step for s in starts], [[t] for t in tokens], [1, 1, 1])
        logits = runner.forward(batch).clone()
        assert torch.equal(step_logits[step], logits), (name, step)
        logits[:, columns:] = float("-inf")
        drawn = native_draws(logits, md, uniforms[step])
        assert drawn is not None
        tokens = [int(drawn[0]), int(logits[1].argmax()), int(drawn[2])]
        want.append(tokens)
    assert got == want, name
    assert len({tuple(t) for t in got}) > 1  # the draws moved on
    assert torch.equal(stepped_keys, runner.kv_cache.keys), name
    assert torch.equal(stepped_values, runner.kv_cache.values), name


def test_greedy_steps_refuse_what_does_not_fit(tmp_path):
    """More steps than the cache has positions, or steps x rows past the kernels' tokens a call:
    a ValueError naming the limit, nothing run."""
    directory = save_hf_model(build_hf_model("llama"), tmp_path)
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=32)
    assert runner.native is not None
    with pytest.raises(ValueError, match="does not fit the cache"):
        runner.run_steps(ForwardBatch([0], [30], [[5]], [1]), 16, 3)
    with pytest.raises(ValueError, match="steps x rows"):
        runner.native.run_steps([5], [0], [0], native.MAX_TOKENS + 1, 16)
    # Rows of more than one token, or with no logits, are not greedy steps: declined.
    assert runner.run_steps(ForwardBatch([0], [0], [[5, 6]], [1]), 16, 2) is None
    # Two rows in one slot would write each other's positions.
    with pytest.raises(ValueError, match="a slot of its own"):
        runner.native.run_steps([5, 6], [0, 0], [3, 4], 2, 16)
    # Room for the steps' logits of another shape: refused before the pass points at it.
    vocab = model.config.vocab_size
    for room in (torch.empty(2, 1, vocab + 1), torch.empty(2, 1, vocab, dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"step_logits must be .* shape \(2, 1, "):
            runner.native.run_steps([5], [0], [0], 2, 16, step_logits=room)
        assert not runner.native.args.step_logits
    # One step is forward_greedy's pass (the kernels then write no step tokens of their own).
    runner.forward(ForwardBatch([0], [0], [[7, 8, 9]], [1]))
    one = runner.run_steps(ForwardBatch([0], [3], [[5]], [1]), 16, 1)
    assert one == [runner.forward_greedy(ForwardBatch([0], [3], [[5]], [1]), 16)[1]]


def test_the_argument_structs_mirror_the_c_ones() -> None:
    """The Python mirrors of the kernels' argument structs have their sizes (a field added on
    one side only would shift or drop the others); a library whose struct is longer than its
    mirror (it would read past the end) is refused, a shorter one (an older source, as
    bench/native_kernel_ab.py builds) is not."""
    lib = native.library()
    assert lib.brisk_forward_args_bytes() == ctypes.sizeof(native.ForwardArgs)
    assert lib.brisk_q4_weight_bytes() == ctypes.sizeof(native.Q4Weight)

    class Library:
        def __init__(self, forward_bytes: int) -> None:
            self.brisk_forward_args_bytes = lambda: forward_bytes
            self.brisk_q4_weight_bytes = lambda: ctypes.sizeof(native.Q4Weight)

    native._check_layouts(Library(ctypes.sizeof(native.ForwardArgs) - 8))
    with pytest.raises(RuntimeError, match="ForwardArgs is .* longer than"):
        native._check_layouts(Library(ctypes.sizeof(native.ForwardArgs) + 8))
