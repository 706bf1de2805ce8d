"""Checkpoint loading: sharded files, dtypes, tied heads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from brisklm import heap
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.loader import CheckpointError, checkpoint_files, load_model
from brisklm.models import packed_weights
from tests.hf_models import build_hf_model, save_hf_model
from tests.tiny import make_tiny_checkpoint

PROMPT = [1, 5, 9, 33, 70, 2, 140]


def logits_of(model) -> torch.Tensor:
    runner = ModelRunner(model, num_slots=1, max_seq_len=32, attention_backend="sdpa")
    return runner.forward(ForwardBatch([0], [0], [PROMPT], [len(PROMPT)]))


def test_sharded_checkpoint_equals_single_file(tmp_path):
    hf = build_hf_model("llama")
    single = save_hf_model(hf, tmp_path / "single")
    sharded = save_hf_model(hf, tmp_path / "sharded", max_shard_size="40KB")
    files = checkpoint_files(sharded)
    assert len(files) > 2
    assert (sharded / "model.safetensors.index.json").is_file()
    a = logits_of(load_model(single, device="cpu", show_progress=False))
    b = logits_of(load_model(sharded, device="cpu", show_progress=False))
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_transformers(tmp_path, dtype):
    hf = build_hf_model("llama", initializer_range=0.05)
    directory = save_hf_model(hf, tmp_path / "m")
    model = load_model(directory, device="cpu", dtype=dtype, show_progress=False)
    assert model.model.embed_tokens.weight.dtype == dtype
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == dtype
    ours = logits_of(model)
    with torch.no_grad():
        theirs = hf.to(dtype)(torch.tensor([PROMPT])).logits[0].float()
    scale = theirs.abs().max().item()
    assert (ours - theirs).abs().max().item() <= 0.05 * max(scale, 1.0)


def test_default_dtype_is_float32_on_cpu(tmp_path):
    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    model = load_model(directory, device="cpu", show_progress=False)
    assert model.model.embed_tokens.weight.dtype == torch.float32


def test_tied_head_shares_storage_and_ignores_saved_head(
    tmp_path, monkeypatch, without_native_kernels
):
    monkeypatch.setattr(packed_weights, "MIN_FLOAT32_BYTES", 1 << 40)  # strided: the tie itself
    hf = build_hf_model("llama", tie_word_embeddings=True)
    directory = save_hf_model(hf, tmp_path / "m")
    model = load_model(directory, device="cpu", show_progress=False)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def _config_says_tied(directory) -> None:
    config = json.loads((directory / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("kernels", ["default", "torch_only"])
def test_tied_config_with_a_different_stored_head_loads_that_head_as_transformers_does(
    tmp_path, request, caplog, kernels
):
    """config.json says tied, but the checkpoint stores its own, different lm_head.weight:
    transformers 5 keeps the stored head (untied, with a warning), so its logits are the truth."""
    import transformers

    if kernels == "torch_only":
        request.getfixturevalue("without_native_kernels")
    hf = build_hf_model("llama")  # untied: lm_head.weight differs from embed_tokens.weight
    directory = save_hf_model(hf, tmp_path / "m", max_shard_size="40KB")
    _config_says_tied(directory)
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager"
    ).eval()
    assert (
        theirs_model.lm_head.weight.data_ptr() != theirs_model.model.embed_tokens.weight.data_ptr()
    )
    caplog.clear()  # transformers' own warning
    with caplog.at_level("WARNING", logger="brisklm.loader"):
        model = load_model(directory, device="cpu", show_progress=False)
    with torch.no_grad():
        theirs = theirs_model(torch.tensor([PROMPT])).logits[0].float()
    torch.testing.assert_close(logits_of(model), theirs, atol=1e-4, rtol=1e-4)
    assert not model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.dense_weight(), hf.lm_head.weight)
    assert torch.equal(model.model.embed_tokens.weight, hf.model.embed_tokens.weight)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    head_file = directory / index["weight_map"]["lm_head.weight"]
    assert str(head_file) in caplog.text and "tie_word_embeddings" in caplog.text


def test_tied_config_with_an_equal_stored_head_stays_tied(
    tmp_path, monkeypatch, caplog, without_native_kernels
):
    from safetensors.torch import load_file, save_file

    monkeypatch.setattr(packed_weights, "packing_supported", lambda dtype: False)
    hf = build_hf_model("llama", tie_word_embeddings=True)
    directory = save_hf_model(hf, tmp_path / "m")
    state = load_file(str(directory / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()  # as .bin exports do
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level("WARNING", logger="brisklm.loader"):
        model = load_model(directory, device="cpu", show_progress=False)
    assert "tie_word_embeddings" not in caplog.text
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_tied_checkpoint_storing_the_head_alone_loads_it_as_the_shared_matrix(tmp_path):
    """safetensors' save_model keeps one name of tensors sharing memory, the first sorted:
    lm_head.weight. transformers loads such a file; brisklm said embed_tokens was missing."""
    import transformers
    from safetensors.torch import load_file, save_file

    hf = build_hf_model("llama", tie_word_embeddings=True)
    directory = save_hf_model(hf, tmp_path / "m")
    state = load_file(str(directory / "model.safetensors"))
    state["lm_head.weight"] = state.pop("model.embed_tokens.weight")
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        theirs = theirs_model(torch.tensor([PROMPT])).logits[0].float()
    model = load_model(directory, device="cpu", show_progress=False)
    torch.testing.assert_close(logits_of(model), theirs, atol=1e-4, rtol=1e-4)
    assert torch.equal(model.model.embed_tokens.weight, hf.model.embed_tokens.weight)


def test_model_safetensors_wins_over_a_stale_shard_index_as_in_transformers(tmp_path):
    # Saving a model unsharded over a sharded save leaves the old index (and maybe its shards):
    # transformers reads model.safetensors, and brisklm read the index (old weights, or an error
    # naming shards that no longer exist).
    import shutil

    old = save_hf_model(build_hf_model("llama", seed=1), tmp_path / "old", max_shard_size="40KB")
    new = save_hf_model(build_hf_model("llama", seed=2), tmp_path / "new")
    for shard in old.glob("*.safetensors*"):
        shutil.copy(shard, new / shard.name)
    assert checkpoint_files(new) == [new / "model.safetensors"]
    expected = logits_of(load_model(tmp_path / "new", device="cpu", show_progress=False))
    for shard in old.glob("model-*.safetensors"):
        (new / shard.name).unlink()
    assert torch.equal(logits_of(load_model(new, device="cpu", show_progress=False)), expected)
    stale = logits_of(load_model(old, device="cpu", show_progress=False))
    assert not torch.equal(stale, expected)


def test_pickled_weights_alone_are_named_as_unsupported(tmp_path):
    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError) as error:
        checkpoint_files(directory)
    assert "pytorch_model.bin: PyTorch's pickle format, which brisklm does not read" in str(
        error.value
    )


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("model.layers.0.mlp.down_proj.weight", torch.int8), ("model.norm.weight", torch.bool)],
)
def test_a_float_parameter_stored_as_integers_is_refused(tmp_path, name, dtype):
    # A cast loaded int8 values as weights (and a bool norm as 0.0 / 1.0) without a word.
    from safetensors.torch import load_file, save_file

    from brisklm.loader import CheckpointError

    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    tensors = load_file(directory / "model.safetensors")
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as error:
        load_model(directory, device="cpu", show_progress=False)
    stored = str(dtype).removeprefix("torch.")
    assert f"tensor {name!r}: stored as {stored}; expected a float tensor" in str(error.value)


def test_broken_shard_index_names_file(tmp_path):
    hf = build_hf_model("llama")
    sharded = save_hf_model(hf, tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (sharded / first).unlink()
    with pytest.raises(ValueError, match=first):
        load_model(sharded, device="cpu", show_progress=False)


@pytest.mark.parametrize(
    ("index", "says"),
    [
        ({"weight_map": ["model.safetensors"]}, '"weight_map" is a JSON array'),
        (
            {"weight_map": {"model.norm.weight": 1}},
            "'model.norm.weight' the shard 1 (a JSON number)",
        ),
        ({"weight_map": {"model.norm.weight": None}}, "the shard null"),
        ({"metadata": {}}, 'no "weight_map"'),
        ([1], 'no "weight_map"'),
    ],
)
def test_malformed_shard_index_is_a_checkpoint_error(tmp_path, index, says):
    from brisklm.loader import CheckpointError

    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    (directory / "model.safetensors").unlink()  # (it would be read instead of the index)
    index_file = directory / "model.safetensors.index.json"
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as error:
        checkpoint_files(directory)
    message = str(error.value)
    assert str(index_file) in message and says in message
    assert '"weight_map" maps each tensor name to the file name of its shard' in message


def test_cpu_weights_are_packed_and_tied_head_gets_a_packed_copy(
    tmp_path, monkeypatch, without_native_kernels
):
    hf = build_hf_model("llama", tie_word_embeddings=True)
    model = load_model(save_hf_model(hf, tmp_path / "m"), device="cpu", show_progress=False)
    qkv = model.model.layers[0].self_attn.qkv_proj
    if not packed_weights.packing_supported(torch.float32):
        pytest.skip("oneDNN weight packing is not available on this machine")
    assert qkv.is_packed and qkv.weight.is_mkldnn
    expected = hf.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(qkv.dense_weight()[: expected.shape[0]], expected)
    # Tied: the head is packed as a copy; the table keeps its rows contiguous for lookups.
    table = model.model.embed_tokens.weight
    assert model.lm_head.is_packed and model.lm_head.weight.is_mkldnn
    assert table.is_contiguous() and torch.equal(table, hf.model.embed_tokens.weight)
    assert torch.equal(model.lm_head.dense_weight(), table)


def test_float32_weights_are_packed_for_the_native_kernels(tmp_path):
    from brisklm.kernels import native

    if not native.available():
        pytest.skip("the native CPU kernels do not build here")
    hf = build_hf_model("llama", tie_word_embeddings=True)
    model = load_model(save_hf_model(hf, tmp_path / "m"), device="cpu", show_progress=False)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.is_native_packed and not qkv.is_packed
    expected = hf.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(qkv.dense_weight()[: expected.shape[0]], expected)
    # Tied: the head is packed as a copy; the table keeps its rows for lookups.
    table = model.model.embed_tokens.weight
    assert model.lm_head.is_native_packed and torch.equal(model.lm_head.dense_weight(), table)
    # bfloat16 models use them too, with bfloat16 panels (tests/models/test_native_half_weights.py).
    bf16 = load_model(tmp_path / "m", device="cpu", dtype="bfloat16", show_progress=False)
    bf16_qkv = bf16.model.layers[0].self_attn.qkv_proj
    assert bf16_qkv.is_native_packed and bf16_qkv.weight.dtype == torch.bfloat16
    assert torch.equal(bf16_qkv.dense_weight()[: expected.shape[0]], expected.bfloat16())


def test_tied_head_is_not_relaid_out_when_not_packed(tmp_path, monkeypatch, without_native_kernels):
    monkeypatch.setattr(packed_weights, "packing_supported", lambda dtype: False)
    hf = build_hf_model("llama", tie_word_embeddings=True)
    model = load_model(save_hf_model(hf, tmp_path / "m"), device="cpu", show_progress=False)
    assert not model.lm_head.is_packed
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.model.embed_tokens.weight.is_contiguous()


def test_cpu_weights_are_column_major_without_packing(
    tmp_path, monkeypatch, without_native_kernels
):
    monkeypatch.setattr(packed_weights, "packing_supported", lambda dtype: False)
    hf = build_hf_model("llama", tie_word_embeddings=True)
    directory = save_hf_model(hf, tmp_path / "m")
    model = load_model(directory, device="cpu", show_progress=False)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert not qkv.is_packed
    assert qkv.weight.stride() == (1, qkv.weight.shape[0])  # (out, in) view of (in, out) storage
    assert model.model.embed_tokens.weight.is_contiguous()
    expected = hf.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(qkv.dense_weight()[: expected.shape[0]], expected)
    monkeypatch.undo()
    packed = load_model(directory, device="cpu", show_progress=False)
    # Same model either way, up to the kernels' float32 summation order.
    torch.testing.assert_close(logits_of(model), logits_of(packed), atol=1e-4, rtol=0)


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "gptq"])
def test_loading_does_not_import_torch_dynamo(tmp_path, quantized):
    # nn.Embedding initialising its table on the meta device imported torch._dynamo (through
    # torch._refs): a second of every load, the bundled model's 1.4 s against 0.4 s; a GPTQ
    # layer's default g_idx, a division on the meta device, did too (~1.7 s, ~200 MB). In a fresh
    # interpreter, since this one may have imported it for other tests.
    directory = make_tiny_checkpoint(tmp_path / "model")
    if quantized:
        from brisklm.quant.quantize_model import QuantizeOptions, quantize_model

        options = QuantizeOptions(group_size=32, method="rtn")
        quantize_model(directory, tmp_path / "int4", options, show_progress=False)
        directory = tmp_path / "int4"
    script = (
        "import sys; from brisklm.loader import load_model; "
        f"load_model({str(directory)!r}, show_progress=False); "
        "print('torch._dynamo' in sys.modules)"
    )
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_cuda_device_this_machine_lacks_is_a_clear_error(monkeypatch):
    """cuda without CUDA, and cuda:N past the machine's devices (torch's "invalid device ordinal"
    with its debugging advice came from the first allocation, deep in the load)."""
    from brisklm.loader import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda:1' was requested but CUDA is not available"):
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"'cuda:2' .* has 2 CUDA device\(s\): cuda:0 to cuda:1"):
        resolve_device("cuda:2")
    with pytest.raises(ValueError, match="'cuda:7'"):
        resolve_device(torch.device("cuda", 7))


def _all_logits(directory, prompt: list[int]) -> torch.Tensor:
    runner = ModelRunner(load_model(directory, show_progress=False), 1, 64, "sdpa")
    return runner.forward(ForwardBatch([0], [0], [prompt], [len(prompt)]))


def test_mistral_biases_are_applied_where_stored_and_not_required_otherwise(tmp_path):
    # transformers' Mistral has no biases whatever config.json says (it loads such a checkpoint
    # and ignores stored ones); vLLM applies stored ones. brisklm refused a config with
    # attention_bias/mlp_bias true and no bias tensors ("missing tensors").
    prompt = [1, 17, 93, 5, 44, 120, 8]
    ids = torch.tensor([prompt])
    mistral = build_hf_model("mistral", attention_bias=True, mlp_bias=True)
    directory = save_hf_model(mistral, tmp_path / "mistral")
    assert json.loads((directory / "config.json").read_text())["attention_bias"] is True
    with torch.no_grad():
        expected = mistral(ids).logits[0]
    torch.testing.assert_close(_all_logits(directory, prompt), expected, atol=5e-4, rtol=0)
    # Biases stored (a Llama with biases relabelled Mistral): applied.
    llama = build_hf_model("llama", attention_bias=True, mlp_bias=True)
    directory = save_hf_model(llama, tmp_path / "relabelled")
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)
    (directory / "config.json").write_text(json.dumps(config))
    with torch.no_grad():
        expected = llama(ids).logits[0]
    torch.testing.assert_close(_all_logits(directory, prompt), expected, atol=5e-4, rtol=0)


def test_loading_leaves_torchs_symbolic_shapes_unimported(tmp_path):
    """The meta model gets its memory without ``Module.to_empty``, whose ``empty_like`` of a meta
    tensor imports torch's symbolic shapes and sympy (half a second of each process's first
    load). In a fresh process, since an import cannot be undone."""
    directory = make_tiny_checkpoint(tmp_path / "tiny")
    script = (
        "import sys, torch\n"
        "before = 'sympy' in sys.modules\n"
        "from brisklm.loader import load_model\n"
        f"model = load_model({str(directory)!r}, device='cpu', show_progress=False)\n"
        "print(before, 'sympy' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    before, after = done.stdout.split()
    assert after == before  # (torch itself may import it some day: then there is nothing to keep)


RELOAD_SCRIPT = """
import gc, sys
from brisklm import LLM

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

for _ in range(2):
    llm = LLM.from_pretrained(sys.argv[1], show_progress=False)
    print(rss())
    llm.close()
    del llm
    gc.collect()
"""


@pytest.mark.skipif(
    not Path("/proc/self/status").exists() or heap._malloc_trim() is None,
    reason="reads Linux's /proc; glibc's malloc_trim",
)
def test_a_second_load_holds_no_more_memory_than_the_first(tmp_path):
    """The load's temporaries, freed, stayed in malloc's arenas after a process's first load:
    its second load of this 135 MB checkpoint held 128 MB more (brisklm.heap)."""
    from tests.scripts import run_script

    directory = make_tiny_checkpoint(
        tmp_path / "model",
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
    )
    weights = (directory / "model.safetensors").stat().st_size
    first, second = map(int, run_script(tmp_path, RELOAD_SCRIPT, str(directory)).stdout.split())
    assert second - first < 0.2 * weights, (first, second, weights)


def _renamed_copy(source: Path, directory: Path, rename) -> Path:
    """``source``'s checkpoint with its tensors renamed (``rename(name)``; None drops one)."""
    from safetensors.torch import load_file, save_file

    directory.mkdir()
    (directory / "config.json").write_text((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    renamed = {rename(name): t for name, t in tensors.items() if rename(name) is not None}
    save_file(renamed, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.mark.parametrize("saved_from", ["base model", "a wrapper"])
def test_names_without_the_model_prefix_or_with_it_twice_load_as_transformers_maps_them(
    tmp_path, saved_from
):
    """A checkpoint saved from the base model alone (LlamaModel: "layers.0...", its head tied)
    or from a model wrapped once more ("model.model.layers.0...", "model.lm_head.weight") loads
    as transformers loads it; brisklm refused it, naming the first tensor."""
    from transformers import AutoModelForCausalLM

    tied = saved_from == "base model"
    hf = build_hf_model("llama", tie_word_embeddings=tied)
    original = save_hf_model(hf, tmp_path / "original")
    if tied:
        directory = _renamed_copy(
            original,
            tmp_path / "renamed",
            lambda n: None if n == "lm_head.weight" else n.removeprefix("model."),
        )
        assert not any(n.startswith("model.") for n in _stored_names(directory))
    else:
        directory = _renamed_copy(original, tmp_path / "renamed", lambda n: "model." + n)
        assert "model.lm_head.weight" in _stored_names(directory)
    expected = logits_of(load_model(original, device="cpu", show_progress=False))
    got = logits_of(load_model(directory, device="cpu", show_progress=False))
    assert torch.equal(got, expected)
    theirs = AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        reference = theirs(torch.tensor([PROMPT])).logits[0]
    assert (got - reference).abs().max().item() <= 1e-4


def _stored_names(directory: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return set(handle.keys())


def test_a_tensor_stored_under_both_names_is_refused_naming_both(tmp_path):
    from safetensors.torch import load_file, save_file

    directory = save_hf_model(build_hf_model("llama"), tmp_path / "m")
    tensors = load_file(directory / "model.safetensors")
    tensors["norm.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="appears more than once") as error:
        load_model(directory, device="cpu", show_progress=False)
    assert "'model.norm.weight'" in str(error.value) and "'norm.weight'" in str(error.value)


def test_a_tensor_in_two_shards_is_read_from_the_one_the_index_names(tmp_path):
    """As transformers reads it; brisklm refused the checkpoint (a stale copy in another shard)."""
    from safetensors.torch import load_file, save_file

    hf = build_hf_model("llama")
    single = save_hf_model(hf, tmp_path / "single")
    sharded = save_hf_model(hf, tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.norm.weight"
    other = sorted(set(index.values()) - {index[name]})[0]
    tensors = load_file(sharded / other)
    tensors[name] = torch.zeros_like(hf.state_dict()[name])  # not what the index names
    save_file(tensors, sharded / other, metadata={"format": "pt"})
    expected = logits_of(load_model(single, device="cpu", show_progress=False))
    assert torch.equal(logits_of(load_model(sharded, device="cpu", show_progress=False)), expected)


def test_a_tensor_the_index_places_in_a_shard_lacking_it_is_read_where_it_is(tmp_path):
    """As transformers reads it (a review found the index's shard taken on trust: the tensor was
    "missing")."""
    hf = build_hf_model("llama")
    single = save_hf_model(hf, tmp_path / "single")
    sharded = save_hf_model(hf, tmp_path / "sharded", max_shard_size="40KB")
    index_file = sharded / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    name = "model.norm.weight"
    index["weight_map"][name] = sorted(
        set(index["weight_map"].values()) - {index["weight_map"][name]}
    )[0]
    index_file.write_text(json.dumps(index))
    expected = logits_of(load_model(single, device="cpu", show_progress=False))
    assert torch.equal(logits_of(load_model(sharded, device="cpu", show_progress=False)), expected)


def test_a_stale_float32_copy_in_another_shard_leaves_bfloat16_weights_bfloat16(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = build_hf_model("llama").to(torch.bfloat16)
    sharded = save_hf_model(hf, tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.norm.weight"
    other = sorted(set(index.values()) - {index[name]})[0]
    tensors = load_file(sharded / other)
    tensors[name] = torch.zeros(hf.state_dict()[name].shape)  # float32, not the index's copy
    save_file(tensors, sharded / other, metadata={"format": "pt"})
    model = load_model(sharded, device="cpu", show_progress=False)
    # (the stale copy made the checkpoint's weights look mixed: widened to float32)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(model.model.norm.weight.float(), hf.state_dict()[name].float())
