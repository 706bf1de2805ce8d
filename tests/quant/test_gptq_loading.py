"""Loading GPTQ checkpoints into brisklm models: every format variant against its dequantized float copy."""

from __future__ import annotations

import json

import pytest
import torch

from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.loader import CheckpointError, load_model
from brisklm.models.layers import Linear
from brisklm.quant import GPTQConfig, GPTQMergedLinear, gptq_linear_factory, linear_factory_for
from tests.hf_models import build_hf_model
from tests.quant.gptq_checkpoints import write_dequantized_copy, write_gptq_checkpoint

pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Requested first so the module's other fixtures run single-threaded too."""


SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
PROMPT = [1, 5, 9, 33, 70, 2, 140, 17, 88, 3, 121, 64]

VARIANTS = {
    "v1-sym-g128": ("llama", dict(group_size=128, sym=True)),
    "v2-asym-g64": ("llama", dict(group_size=64, sym=False, checkpoint_format="gptq_v2")),
    "v1-asym-g32-act-order": ("llama", dict(group_size=32, sym=False, act_order=True)),
    "v2-sym-g32-act-order": (
        "llama",
        dict(group_size=32, sym=True, act_order=True, checkpoint_format="gptq_v2"),
    ),
    "v1-asym-g-1": ("llama", dict(group_size=-1, sym=False)),
    "act-order-distinct-qkv-g_idx": (
        "llama",
        dict(group_size=32, sym=False, act_order=True, distinct_qkv_g_idx=True),
    ),
    "quantized-lm-head": ("llama", dict(group_size=32, sym=False, lm_head=True)),
    "skipped-modules": (
        "llama",
        dict(
            group_size=64,
            modules_to_not_convert=("down_proj",),
            dynamic={r"-:model\.layers\.1\.self_attn\..*": {}},
        ),
    ),
    "no-g_idx-zero-bias-quantize_config": (
        "llama",
        dict(group_size=64, omit_g_idx=True, zero_bias=True, config_in="quantize_config.json"),
    ),
    "both-configs": ("llama", dict(group_size=32, sym=False, config_in="both")),
    "qwen2-bias-tied-act-order": ("qwen2", dict(group_size=64, sym=False, act_order=True)),
    "qwen3-qk-norm": ("qwen3", dict(group_size=32, sym=False)),
}


@pytest.fixture(scope="module")
def hf_models():
    return {
        "llama": build_hf_model("llama", **SHAPE),
        "qwen2": build_hf_model("qwen2", tie_word_embeddings=True, **SHAPE),
        "qwen3": build_hf_model("qwen3", head_dim=32, **SHAPE),
    }


def all_logits(model) -> torch.Tensor:
    runner = ModelRunner(model, num_slots=1, max_seq_len=32, attention_backend="sdpa")
    return runner.forward(ForwardBatch([0], [0], [PROMPT], [len(PROMPT)]))


def load_exact(directory):
    """The quantized model with float32 kernel arithmetic: equal to the float copy up to summation order."""
    quant = GPTQConfig.from_pretrained(directory)
    factory = gptq_linear_factory(quant, "cpu", compute_dtype=torch.float32)
    return load_model(
        directory, device="cpu", dtype="float32", make_linear=factory, show_progress=False
    )


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, rel: float) -> None:
    scale = max(theirs.abs().max().item(), 1.0)
    diff = (ours - theirs).abs().max().item()
    assert diff <= rel * scale, f"max |diff| {diff} vs scale {scale}"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gptq_checkpoint_matches_dequantized_float_copy(variant, hf_models, tmp_path):
    family, options = VARIANTS[variant]
    gptq_dir = write_gptq_checkpoint(hf_models[family], tmp_path / "gptq", **options)
    float_dir = write_dequantized_copy(gptq_dir, tmp_path / "float")
    reference = all_logits(
        load_model(float_dir, device="cpu", dtype="float32", show_progress=False)
    )
    model = load_exact(gptq_dir)
    assert_close(all_logits(model), reference, 1e-4)

    attn = model.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj, GPTQMergedLinear)
    expected_parts = 3 if options.get("distinct_qkv_g_idx") else 1
    assert len(attn.qkv_proj.parts) == expected_parts
    assert attn.qkv_proj.parts[0].qweight is None  # checkpoint tensors dropped after prepare
    head_type = GPTQMergedLinear if options.get("lm_head") else Linear
    assert isinstance(model.lm_head, head_type)
    if variant == "skipped-modules":
        assert isinstance(model.model.layers[0].mlp.down_proj, Linear)
        assert isinstance(model.model.layers[0].mlp.gate_up_proj, GPTQMergedLinear)
        assert isinstance(model.model.layers[1].self_attn.qkv_proj, Linear)
        assert isinstance(model.model.layers[1].self_attn.o_proj, Linear)
    if family == "qwen2":  # tied: the table itself, or on CPU a packed copy of it
        table = model.model.embed_tokens.weight
        if model.lm_head.is_packed or model.lm_head.is_native_packed:
            assert torch.equal(model.lm_head.dense_weight(), table)
        else:
            assert model.lm_head.weight is table


@pytest.mark.parametrize("variant", ["v1-asym-g32-act-order", "qwen2-bias-tied-act-order"])
def test_default_bf16_kernel_is_close(variant, hf_models, tmp_path, without_native_kernels):
    """The default load path (auto factory, fast bfloat16 kernel under float32 activations) is at
    least as close to the float copy as the float copy itself run in bfloat16 arithmetic (torch's
    ops: through the native kernels a bfloat16 model keeps only its weights in bfloat16)."""
    family, options = VARIANTS[variant]
    gptq_dir = write_gptq_checkpoint(hf_models[family], tmp_path / "gptq", **options)
    float_dir = write_dequantized_copy(gptq_dir, tmp_path / "float")
    reference = all_logits(
        load_model(float_dir, device="cpu", dtype="float32", show_progress=False)
    )
    in_bf16 = all_logits(load_model(float_dir, device="cpu", dtype="bfloat16", show_progress=False))
    model = load_model(gptq_dir, device="cpu", show_progress=False)
    assert model.model.layers[0].mlp.down_proj.parts[0].compute_dtype == torch.bfloat16
    int4_error = (all_logits(model) - reference).abs().max().item()
    assert int4_error <= (in_bf16 - reference).abs().max().item()


def test_float_checkpoint_gets_dense_factory(hf_models, tmp_path):
    from brisklm.models.layers import dense_linear
    from tests.hf_models import save_hf_model

    directory = save_hf_model(hf_models["llama"], tmp_path / "float")
    assert linear_factory_for(directory, device="cpu") is dense_linear


def _rewrite_quant_config(directory, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"].update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bits": 3}, "bits=3 is not supported"),
        ({"quant_method": "awq"}, "quant_method='awq' is not supported"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format='marlin' is not supported"),
        ({"group_size": 48}, "group_size=48 is not supported"),
    ],
)
def test_unsupported_quantization_is_a_clear_error(hf_models, tmp_path, changes, message):
    directory = write_gptq_checkpoint(hf_models["llama"], tmp_path / "q", group_size=32)
    _rewrite_quant_config(directory, **changes)
    with pytest.raises(ValueError, match="unsupported quantization") as info:
        load_model(directory, device="cpu", show_progress=False)
    assert message in str(info.value)
    # The file and the key that hold the value (it said only the directory).
    assert f"{directory / 'config.json'}'s quantization_config: " in str(info.value)
    from brisklm import LLM

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        LLM.from_pretrained(directory, device="cpu", show_progress=False)


def test_an_unsupported_quantize_config_json_is_named(hf_models, tmp_path):
    directory = write_gptq_checkpoint(
        hf_models["llama"], tmp_path / "q", group_size=32, config_in="quantize_config.json"
    )
    path = directory / "quantize_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "bits": 8}))
    with pytest.raises(ValueError, match=f"{path}: bits=8 is not supported"):
        load_model(directory, device="cpu", show_progress=False)


def test_config_not_matching_tensors_names_the_tensor(hf_models, tmp_path):
    directory = write_gptq_checkpoint(hf_models["llama"], tmp_path / "q", group_size=32)
    _rewrite_quant_config(directory, group_size=64)
    with pytest.raises(
        # the first of the layer's tensors in the file to disagree with the config
        ValueError,
        match=r"\.(qzeros|scales|g_idx).: .*group_size=64.* does the quantization config",
    ):
        load_model(directory, device="cpu", show_progress=False)


def test_fused_modules_must_be_quantized_alike(hf_models, tmp_path):
    directory = write_gptq_checkpoint(
        hf_models["llama"], tmp_path / "q", group_size=32, modules_to_not_convert=("v_proj",)
    )
    with pytest.raises(ValueError, match="must be quantized alike"):
        load_model(directory, device="cpu", show_progress=False)


def test_gptq_tensors_without_config_are_explained(hf_models, tmp_path):
    directory = write_gptq_checkpoint(hf_models["llama"], tmp_path / "q", group_size=32)
    config = json.loads((directory / "config.json").read_text())
    del config["quantization_config"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="it is a GPTQ tensor"):
        load_model(directory, device="cpu", show_progress=False)


def test_modules_in_block_to_quantize_leaves_the_rest_in_float(hf_models, tmp_path):
    """optimum / transformers describe a partly quantized layer by the modules that are quantized."""
    directory = write_gptq_checkpoint(
        hf_models["llama"], tmp_path / "q", group_size=32, modules_to_not_convert=("o_proj",)
    )
    config = json.loads((directory / "config.json").read_text())
    quant = config["quantization_config"]
    del quant["modules_to_not_convert"]
    quant["modules_in_block_to_quantize"] = [
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        ["mlp.gate_proj", "mlp.up_proj"],
        ["mlp.down_proj"],
    ]
    (directory / "config.json").write_text(json.dumps(config))
    model = load_exact(directory)
    assert isinstance(model.model.layers[0].self_attn.o_proj, Linear)
    assert isinstance(model.model.layers[0].self_attn.qkv_proj, GPTQMergedLinear)
    float_dir = write_dequantized_copy(directory, tmp_path / "float")
    reference = all_logits(
        load_model(float_dir, device="cpu", dtype="float32", show_progress=False)
    )
    assert_close(all_logits(model), reference, 1e-4)
    # A config that says o_proj is quantized, while the file stores it in float, says so.
    quant["modules_in_block_to_quantize"].append(["self_attn.o_proj"])
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="stores a float weight for it"):
        load_model(directory, device="cpu", show_progress=False)


def test_missing_gptq_tensor_is_reported(hf_models, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = write_gptq_checkpoint(hf_models["llama"], tmp_path / "q", group_size=32)
    state = load_file(str(directory / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.scales"]
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.scales"
    ):
        load_model(directory, device="cpu", show_progress=False)


def test_act_order_without_g_idx_or_with_g_idx_out_of_range_is_refused(hf_models, tmp_path):
    # Loaded in the default order (logits off by 154% of their scale), and a bad value was named
    # by the fused module ("...qkv_proj"), not the file and tensor
    from safetensors.torch import load_file, save_file

    missing = write_gptq_checkpoint(
        hf_models["llama"], tmp_path / "a", group_size=32, act_order=True, omit_g_idx=True
    )
    with pytest.raises(CheckpointError, match=r"missing tensors: .*self_attn\.k_proj\.g_idx"):
        load_model(missing, device="cpu", show_progress=False)
    directory = write_gptq_checkpoint(
        hf_models["llama"], tmp_path / "b", group_size=32, act_order=True
    )
    state = load_file(str(directory / "model.safetensors"))
    state["model.layers.1.self_attn.k_proj.g_idx"][5] = 99
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: tensor 'model\.layers\.1\.self_attn\.k_proj\.g_idx': "
        r"g_idx values must lie in \[0, \d+\)",
    ):
        load_model(directory, device="cpu", show_progress=False)
