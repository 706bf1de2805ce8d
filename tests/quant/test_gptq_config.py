"""GPTQConfig: the spellings auto-gptq, GPTQModel and transformers write, and clear errors for the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brisklm.quant import GPTQConfig

# auto-gptq 0.7.x quantize_config.json
AUTO_GPTQ = {
    "bits": 4,
    "group_size": 128,
    "damp_percent": 0.01,
    "desc_act": True,
    "static_groups": False,
    "sym": True,
    "true_sequential": True,
    "model_name_or_path": None,
    "model_file_base_name": "model",
    "quant_method": "gptq",
    "checkpoint_format": "gptq",
}
# auto-gptq <= 0.6: no quant_method, no checkpoint_format (v1 implied)
AUTO_GPTQ_OLD = {
    "bits": 4,
    "group_size": -1,
    "damp_percent": 0.1,
    "desc_act": False,
    "sym": False,
    "true_sequential": True,
}
# GPTQModel (writes both `format` and `checkpoint_format`, pack_dtype, lm_head, meta, dynamic)
GPTQMODEL = {
    "bits": 4,
    "dynamic": {"-:.*mlp\\.down_proj": {}, "+:.*self_attn.*": {"desc_act": False}},
    "group_size": 32,
    "desc_act": False,
    "lm_head": True,
    "method": "gptq",
    "quant_method": "gptq",
    "format": "gptq_v2",
    "checkpoint_format": "gptq_v2",
    "pack_dtype": "int32",
    "sym": False,
    "meta": {
        "quantizer": ["gptqmodel:4.0.0"],
        "damp_percent": 0.05,
        "static_groups": True,
        "true_sequential": True,
    },
}
# transformers 5.x config.json quantization_config (GPTQConfig.to_dict)
TRANSFORMERS = {
    "quant_method": "gptq",
    "bits": 4,
    "tokenizer": None,
    "dataset": None,
    "group_size": 64,
    "damp_percent": 0.1,
    "desc_act": False,
    "act_group_aware": True,
    "sym": True,
    "true_sequential": True,
    "format": "gptq",
    "checkpoint_format": "gptq",
    "meta": None,
    "backend": "auto",
    "model_seqlen": None,
    "block_name_to_quantize": None,
    "module_name_preceding_first_block": None,
    "batch_size": 1,
    "pad_token_id": None,
    "max_input_length": None,
    "cache_block_outputs": True,
    "modules_in_block_to_quantize": None,
    "modules_to_not_convert": ["model.layers.0.mlp"],
    "use_exllama": True,
    "exllama_config": {"version": 1},
}


def test_auto_gptq() -> None:
    cfg = GPTQConfig.from_dict(AUTO_GPTQ)
    assert (cfg.bits, cfg.group_size, cfg.desc_act, cfg.sym, cfg.checkpoint_format) == (
        4,
        128,
        True,
        True,
        "gptq",
    )
    assert not cfg.lm_head and not cfg.is_v2


def test_auto_gptq_old_defaults_to_v1() -> None:
    cfg = GPTQConfig.from_dict(AUTO_GPTQ_OLD)
    assert (cfg.group_size, cfg.sym, cfg.checkpoint_format, cfg.damp_percent) == (
        -1,
        False,
        "gptq",
        0.1,
    )


def test_dynamic_rules_apply_in_order() -> None:
    """GPTQModel's dynamic_get: a module's first matching rule decides it, so a positive rule
    before a '-:' rule keeps its modules quantized (they were skipped, and the checkpoint's
    tensors for them refused as unexpected)."""
    dynamic = {
        r"+:model\.layers\.1\.mlp\..*": {},
        r"-:model\.layers\.1\..*": {},
        r"model\.layers\.2\..*": {"bits": 4},
        r"-:.*down_proj": {},
    }
    cfg = GPTQConfig.from_dict({"bits": 4, "group_size": 128, "dynamic": dynamic})
    expected = {
        "model.layers.1.mlp.up_proj": True,
        "model.layers.1.self_attn.q_proj": False,
        "model.layers.2.mlp.down_proj": True,  # the layer-2 rule comes first
        "model.layers.3.mlp.down_proj": False,
        "model.layers.0.mlp.up_proj": True,
    }
    assert {name: cfg.is_quantized(name) for name in expected} == expected
    again = GPTQConfig.from_dict(cfg.to_quantize_config())  # written back, read the same
    assert {name: again.is_quantized(name) for name in expected} == expected


def test_gptqmodel() -> None:
    cfg = GPTQConfig.from_dict(GPTQMODEL)
    assert (cfg.group_size, cfg.sym, cfg.checkpoint_format, cfg.lm_head) == (
        32,
        False,
        "gptq_v2",
        True,
    )
    assert cfg.is_v2 and cfg.damp_percent == 0.05 and cfg.static_groups
    assert cfg.skip_patterns == (".*mlp\\.down_proj",)
    assert cfg.is_quantized("lm_head")
    assert not cfg.is_quantized("model.layers.3.mlp.down_proj")
    assert cfg.is_quantized("model.layers.3.mlp.up_proj")


def test_transformers() -> None:
    cfg = GPTQConfig.from_dict(TRANSFORMERS)
    assert (cfg.group_size, cfg.sym, cfg.checkpoint_format) == (64, True, "gptq")
    assert cfg.modules_to_not_convert == ("model.layers.0.mlp",)
    assert not cfg.is_quantized("model.layers.0.mlp.gate_proj")
    assert cfg.is_quantized("model.layers.1.mlp.gate_proj")
    assert not cfg.is_quantized("lm_head")


def test_transformers_format_key_only() -> None:
    raw = {k: v for k, v in TRANSFORMERS.items() if k != "checkpoint_format"} | {
        "format": "gptq_v2"
    }
    assert GPTQConfig.from_dict(raw).checkpoint_format == "gptq_v2"


@pytest.mark.parametrize("group_size", [32, 64, 128, -1, 256, 96])
def test_accepted_group_sizes(group_size: int) -> None:
    assert GPTQConfig.from_dict({"bits": 4, "group_size": group_size}).group_size == group_size


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"bits": 8}, "bits=8"),
        ({"bits": 3}, "bits=3"),
        ({"bits": 2}, "bits=2"),
        ({"group_size": 16}, "group_size=16"),
        ({"group_size": 100}, "group_size=100"),
        ({"group_size": 0}, "group_size=0"),
        ({"group_size": -2}, "group_size=-2"),
        ({"group_size": 1.5}, "group_size must be an integer"),
        ({"quant_method": "awq"}, "quant_method='awq'"),
        ({"quant_method": "bitsandbytes"}, "quant_method='bitsandbytes'"),
        ({"quant_method": "fp8"}, "quant_method='fp8'"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format='marlin'"),
        ({"checkpoint_format": "gptq_v3"}, "checkpoint_format='gptq_v3'"),
        ({"is_marlin_format": True}, "is_marlin_format"),
        ({"pack_dtype": "int16"}, "pack_dtype='int16'"),
        ({"format": "gptq", "checkpoint_format": "gptq_v2"}, "conflicting"),
        ({"dynamic": {"+:.*q_proj": {"bits": 8}}}, "per-module"),
    ],
)
def test_unsupported_is_a_clear_error(override: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        GPTQConfig.from_dict(AUTO_GPTQ | override)
    if "dynamic" not in override:
        assert "supports GPTQ int4" in str(info.value)  # says what is supported


def test_bitsandbytes_config_without_quant_method_is_refused() -> None:
    # transformers reads load_in_4bit / load_in_8bit without a quant_method as bitsandbytes.
    for flag in ("load_in_4bit", "load_in_8bit"):
        with pytest.raises(ValueError, match="quant_method='bitsandbytes'"):
            GPTQConfig.from_dict({flag: True, "bits": 4})


def test_informational_fields_may_be_null() -> None:
    cfg = GPTQConfig.from_dict(AUTO_GPTQ | {"damp_percent": None, "true_sequential": None})
    assert cfg.damp_percent == 0.01
    with pytest.raises(ValueError, match="damp_percent must be a number"):
        GPTQConfig.from_dict(AUTO_GPTQ | {"damp_percent": "lots"})
    # Out of range, it stopped loading a model whose weights read the same whatever it says.
    assert GPTQConfig.from_dict(AUTO_GPTQ | {"damp_percent": 1.5}).damp_percent == 0.01


def test_modules_in_block_to_quantize() -> None:
    groups = [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["mlp.up_proj"]]
    cfg = GPTQConfig.from_dict(TRANSFORMERS | {"modules_in_block_to_quantize": groups})
    assert cfg.is_quantized("model.layers.0.self_attn.k_proj")
    assert cfg.is_quantized("model.layers.11.mlp.up_proj")
    assert not cfg.is_quantized("model.layers.0.self_attn.o_proj")
    assert not cfg.is_quantized("model.layers.3.mlp.down_proj")
    assert not cfg.is_quantized("lm_head")
    again = GPTQConfig.from_dict(json.loads(json.dumps(cfg.to_quantize_config())))
    assert again.modules_in_block_to_quantize == cfg.modules_in_block_to_quantize
    assert GPTQConfig.from_dict(
        TRANSFORMERS | {"modules_in_block_to_quantize": ["mlp.up_proj"]}
    ).is_quantized("model.layers.2.mlp.up_proj")  # (TRANSFORMERS leaves layer 0's mlp in float)
    bare = [["q_proj", "k_proj", "v_proj"], ["down_proj"]]  # optimum matches name endings
    cfg = GPTQConfig.from_dict(AUTO_GPTQ | {"modules_in_block_to_quantize": bare})
    assert cfg.is_quantized("model.layers.4.self_attn.v_proj")
    assert not cfg.is_quantized("model.layers.4.self_attn.o_proj")
    with pytest.raises(ValueError, match="modules_in_block_to_quantize"):
        GPTQConfig.from_dict(TRANSFORMERS | {"modules_in_block_to_quantize": "mlp.up_proj"})
    with pytest.raises(ValueError, match="modules_in_block_to_quantize"):
        GPTQConfig.from_dict(TRANSFORMERS | {"modules_in_block_to_quantize": [[3]]})


def test_direct_construction_validates() -> None:
    with pytest.raises(ValueError, match="bits"):
        GPTQConfig(bits=8)
    with pytest.raises(ValueError, match="checkpoint_format"):
        GPTQConfig(checkpoint_format="awq")
    with pytest.raises(ValueError, match="damp_percent"):
        GPTQConfig(damp_percent=1.5)


def test_written_config_reads_back() -> None:
    for raw in (AUTO_GPTQ, GPTQMODEL, TRANSFORMERS):
        cfg = GPTQConfig.from_dict(raw)
        again = GPTQConfig.from_dict(json.loads(json.dumps(cfg.to_quantize_config())))
        assert again == cfg


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def test_from_pretrained_sources(tmp_path: Path) -> None:
    plain = {"model_type": "llama", "hidden_size": 64}
    (tmp_path / "float").mkdir()
    _write(tmp_path / "float" / "config.json", plain)
    assert GPTQConfig.from_pretrained(tmp_path / "float") is None

    (tmp_path / "qc").mkdir()
    _write(tmp_path / "qc" / "config.json", plain)
    _write(tmp_path / "qc" / "quantize_config.json", AUTO_GPTQ)
    assert GPTQConfig.from_pretrained(tmp_path / "qc").group_size == 128

    (tmp_path / "hf").mkdir()
    _write(tmp_path / "hf" / "config.json", plain | {"quantization_config": TRANSFORMERS})
    assert GPTQConfig.from_pretrained(tmp_path / "hf").group_size == 64

    (tmp_path / "both").mkdir()  # GPTQModel writes both; they agree
    _write(tmp_path / "both" / "config.json", plain | {"quantization_config": GPTQMODEL})
    _write(tmp_path / "both" / "quantize_config.json", GPTQMODEL)
    assert GPTQConfig.from_pretrained(tmp_path / "both").checkpoint_format == "gptq_v2"

    (tmp_path / "clash").mkdir()
    _write(tmp_path / "clash" / "config.json", plain | {"quantization_config": AUTO_GPTQ})
    _write(tmp_path / "clash" / "quantize_config.json", AUTO_GPTQ | {"group_size": 32})
    with pytest.raises(ValueError, match="disagree.*group_size"):
        GPTQConfig.from_pretrained(tmp_path / "clash")

    # Fields one file leaves out are not compared with its defaults: sym / desc_act do not change
    # how tensors read, and a format only quantize_config.json states is taken from it.
    (tmp_path / "partial").mkdir()
    partial = {k: v for k, v in AUTO_GPTQ.items() if k not in ("desc_act", "sym")}
    _write(
        tmp_path / "partial" / "config.json",
        plain | {"quantization_config": {**partial, "checkpoint_format": None}},
    )
    _write(
        tmp_path / "partial" / "quantize_config.json",
        AUTO_GPTQ | {"sym": False, "checkpoint_format": "gptq_v2"},
    )
    partial_config = GPTQConfig.from_pretrained(tmp_path / "partial")
    assert partial_config.checkpoint_format == "gptq_v2"
    # desc_act, sym and static_groups only quantize_config.json states are taken from it too:
    # config.json's default desc_act (False) loaded an act-order checkpoint missing its g_idx.
    assert partial_config.desc_act is True and partial_config.sym is False

    # Which modules are quantized is taken from whichever file says it; module lists compare as sets.
    (tmp_path / "modules").mkdir()
    blocks = [["self_attn.q_proj", "self_attn.k_proj"], ["mlp.up_proj"]]
    _write(
        tmp_path / "modules" / "config.json",
        plain | {"quantization_config": AUTO_GPTQ | {"modules_in_block_to_quantize": blocks}},
    )
    _write(
        tmp_path / "modules" / "quantize_config.json",
        AUTO_GPTQ
        | {
            "modules_in_block_to_quantize": [
                ["mlp.up_proj", "self_attn.k_proj"],
                ["self_attn.q_proj"],
            ],
            "dynamic": {"-:model\\.layers\\.1\\..*": {}},
            "modules_to_not_convert": ["down_proj"],
        },
    )
    merged = GPTQConfig.from_pretrained(tmp_path / "modules")
    assert merged.skip_patterns == ("model\\.layers\\.1\\..*",)
    assert merged.modules_to_not_convert == ("down_proj",)
    assert set(merged.modules_in_block_to_quantize) == {
        "self_attn.q_proj",
        "self_attn.k_proj",
        "mlp.up_proj",
    }

    (tmp_path / "awq").mkdir()
    _write(
        tmp_path / "awq" / "config.json",
        plain | {"quantization_config": {"quant_method": "awq", "bits": 4}},
    )
    with pytest.raises(ValueError, match="awq"):
        GPTQConfig.from_pretrained(tmp_path / "awq")


def test_flags_written_as_strings_read_as_they_say() -> None:
    """bool("false") is True: an act-order flag written as a string was always on."""
    read = GPTQConfig.from_dict(AUTO_GPTQ | {"desc_act": "false", "sym": "False", "lm_head": 0})
    assert (read.desc_act, read.sym, read.lm_head) == (False, False, False)
    assert GPTQConfig.from_dict(AUTO_GPTQ | {"desc_act": "true"}).desc_act is True
    with pytest.raises(ValueError, match="desc_act must be true or false, got 'yes'"):
        GPTQConfig.from_dict(AUTO_GPTQ | {"desc_act": "yes"})
