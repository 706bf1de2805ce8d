"""config.json parsing: families, GQA, head_dim, biases, sliding windows, rope keys of both eras."""

from __future__ import annotations

import json

import pytest

from brisklm.config import ModelConfig

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "vocab_size": 100,
}


def make(**overrides):
    return ModelConfig.from_dict({**BASE, **overrides})


def test_defaults_and_gqa():
    config = make(num_key_value_heads=2)
    assert config.head_dim == 8 and config.num_query_groups == 4
    assert config.rope.rope_type == "default" and config.rope.theta == 10000.0
    assert config.sliding_windows == (None,) * 4
    assert make().num_key_value_heads == 8
    assert make(head_dim=32).head_dim == 32


def test_rope_keys_v4_and_v5_agree():
    v4 = make(
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    v5 = make(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    )
    assert v4.rope == v5.rope
    assert v4.rope.theta == 500000.0 and v4.rope.factor == 8.0
    legacy_type = make(rope_scaling={"type": "linear", "factor": 2.0})
    assert legacy_type.rope.rope_type == "linear"


def test_qwen2_bias_and_sliding_layers():
    qwen = make(
        architectures=["Qwen2ForCausalLM"],
        num_key_value_heads=8,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=2,
    )
    assert qwen.qkv_bias and not qwen.o_proj_bias
    assert qwen.sliding_windows == (None, None, 16, 16)
    assert (
        make(
            architectures=["Qwen2ForCausalLM"], num_key_value_heads=8, sliding_window=16
        ).sliding_windows
        == (None,) * 4
    )
    # Without a sliding_window key, transformers' default window (4096) applies.
    defaulted = make(
        architectures=["Qwen2ForCausalLM"],
        num_key_value_heads=8,
        use_sliding_window=True,
        max_window_layers=2,
    )
    assert defaulted.sliding_windows == (None, None, 4096, 4096)


def test_mistral_sliding_window_all_layers():
    assert (
        make(architectures=["MistralForCausalLM"], sliding_window=32).sliding_windows == (32,) * 4
    )
    assert (
        make(architectures=["MistralForCausalLM"], sliding_window=None).sliding_windows
        == (None,) * 4
    )


def test_mistral_layer_types_name_the_windowed_layers():
    # transformers' Mistral warns of layer_types, but its masks follow them (the logits:
    # tests/models/test_parity.py, test_mistral_layer_types_window_only_the_sliding_layers).
    kinds = ["full_attention", "sliding_attention"] * 2
    windows = make(architectures=["MistralForCausalLM"], sliding_window=32, layer_types=kinds)
    assert windows.sliding_windows == (None, 32, None, 32)
    everywhere = make(
        architectures=["MistralForCausalLM"], sliding_window=32, layer_types=["full_attention"] * 4
    )
    assert everywhere.sliding_windows == (None,) * 4


@pytest.mark.parametrize(
    "overrides",
    [
        # A transformers 5 Qwen2 config saved with sliding layers named, but the flag off: the
        # config drops the window, so every layer attends to the whole sequence.
        {"use_sliding_window": False, "layer_types": ["full_attention", "sliding_attention"] * 2},
        {"use_sliding_window": True, "layer_types": ["full_attention", "sliding_attention"] * 2},
        {"use_sliding_window": True, "max_window_layers": 1},
        {"use_sliding_window": True, "max_window_layers": 1, "layer_types": ["full_attention"] * 4},
        {"architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True, "max_window_layers": 1},
        {
            "architectures": ["Qwen3ForCausalLM"],
            "use_sliding_window": True,
            "layer_types": ["full_attention", "sliding_attention"] * 2,
        },
        {"architectures": ["Qwen3ForCausalLM"], "layer_types": ["sliding_attention"] * 4},
    ],
)
def test_sliding_windows_per_layer_match_transformers(overrides):
    transformers = pytest.importorskip("transformers")
    raw = {
        **BASE,
        "architectures": ["Qwen2ForCausalLM"],
        "num_key_value_heads": 8,
        "sliding_window": 16,
        **overrides,
    }
    raw["model_type"] = raw["architectures"][0].removesuffix("ForCausalLM").lower()
    reference = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**raw)
    )
    # (Mistral's attention keeps no window of its own: it reads the config's at every layer.)
    window = reference.config.sliding_window
    expected = tuple(
        getattr(layer.self_attn, "sliding_window", window) for layer in reference.model.layers
    )
    assert ModelConfig.from_dict(raw).sliding_windows == expected


@pytest.mark.parametrize(
    ("layer_types", "message"),
    [
        (["full_attention"] * 3, r"one entry per layer \(4\), got \['full_attention'"),
        ("sliding_attention", "one entry per layer"),
        (["full_attention"] * 3 + ["chunked_attention"], "holds 'chunked_attention'"),
    ],
)
def test_bad_layer_types_name_what_is_allowed(layer_types, message):
    with pytest.raises(ValueError, match=message):
        make(
            architectures=["Qwen2ForCausalLM"],
            num_key_value_heads=8,
            sliding_window=16,
            use_sliding_window=True,
            layer_types=layer_types,
        )


def test_bias_keys_are_read_for_llama_and_mistral():
    biased = dict(attention_bias=True, mlp_bias=True)
    for architecture in ("LlamaForCausalLM", "MistralForCausalLM"):
        config = make(architectures=[architecture], **biased)
        assert config.qkv_bias and config.o_proj_bias and config.mlp_bias


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel.*supported: LlamaForCausalLM"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "longrope.*supported: default"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"vocab_size": 0}, "vocab_size"),
        # These said "int() argument must be a string, ... not 'NoneType'".
        ({"vocab_size": None}, "required field 'vocab_size' is null: it must be an integer"),
        ({"intermediate_size": None}, "required field 'intermediate_size' is null"),
        ({"hidden_size": "64x"}, "field 'hidden_size' must be an integer, got '64x'"),
        # 16.5 was read as 16; a string eos list loaded as strings.
        ({"head_dim": 16.5}, "field 'head_dim' must be an integer, got 16.5"),
        ({"eos_token_id": ["</s>"]}, "'eos_token_id' must be a token id or a list of token ids"),
        # These loaded, then every request failed (ZeroDivisionError, math domain error)
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0}},
            "yarn rope needs a rope theta other than 1",
        ),
        (
            {
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 2.0,
                    "original_max_position_embeddings": 0,
                }
            },
            "yarn rope needs original_max_position_embeddings >= 1, got 0",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": -8,
                }
            },
            "llama3 rope needs original_max_position_embeddings >= 1, got -8",
        ),
        # A factor missing was 1.0 (no scaling at all), and beta_fast 0 became 32 unseen.
        ({"rope_scaling": {"type": "linear"}}, "linear rope needs factor; config.json's rope_sc"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": None}}, "dynamic rope needs factor"),
        (
            {"rope_parameters": {"rope_type": "llama3"}},
            "llama3 rope needs factor and low_freq_factor and high_freq_factor; config.json's "
            "rope_parameters has none",
        ),
        # These loaded with guesses (1.0 and 4.0; a yarn factor of max_position_embeddings over
        # the original context), where transformers refuses them.
        (
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
            "llama3 rope needs high_freq_factor; config.json's rope_parameters has none",
        ),
        (
            {"rope_scaling": {"type": "yarn", "original_max_position_embeddings": 64}},
            "yarn rope needs factor; config.json's rope_scaling has none",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 0}},
            "yarn rope needs beta_fast and beta_slow > 0, got 0.0 and 1.0",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_slow": -1}},
            "yarn rope needs beta_fast and beta_slow > 0, got 32.0 and -1.0",
        ),
    ],
)
def test_errors_name_the_problem(overrides, message):
    with pytest.raises(ValueError, match=message):
        make(**overrides)


def test_flags_written_as_strings_and_null_layer_counts():
    # bool("false") is True: a string flag tied an untied model's head to its embedding.
    assert not make(tie_word_embeddings="false").tie_word_embeddings
    assert make(tie_word_embeddings="true").tie_word_embeddings
    assert not make(tie_word_embeddings=None).tie_word_embeddings
    assert make(tie_word_embeddings=1.0).tie_word_embeddings  # (bool() took it)
    with pytest.raises(ValueError, match="tie_word_embeddings must be true or false, got 'yes'"):
        make(tie_word_embeddings="yes")
    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "sliding_window": 8, "num_key_value_heads": 8}
    off = make(**qwen2, use_sliding_window="false", max_window_layers=0)
    assert off.sliding_windows == (None,) * 4
    # null max_window_layers was int(None): a bare TypeError. It takes the default (28) now.
    assert (
        make(**qwen2, use_sliding_window=True, max_window_layers=None).sliding_windows
        == (None,) * 4
    )
    assert make(**qwen2, use_sliding_window=True, max_window_layers=2).sliding_windows == (
        None,
        None,
        8,
        8,
    )
    with pytest.raises(ValueError, match="'sliding_window' must be an integer, got 5.5"):
        make(architectures=["MistralForCausalLM"], sliding_window=5.5)


def test_missing_field_and_bad_json(tmp_path):
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "hidden_size"})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert ModelConfig.from_pretrained(tmp_path).architecture == "LlamaForCausalLM"


def test_rope_scaling_replaces_rope_parameters_as_transformers_reads_them(caplog):
    # A transformers 5 config (rope_parameters) with the rope_scaling block a model card says to
    # add for long context: the default rope_type of rope_parameters won, and yarn was off.
    config = make(
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )
    assert config.rope.rope_type == "yarn" and config.rope.factor == 4.0
    assert config.rope.theta == 1000000.0  # still rope_parameters' (the block has none)
    # transformers 5.25 reads 10000 there (an audit's finding): said, once per load
    differs = [r for r in caplog.records if "transformers 5 reads 10000.0 there" in r.getMessage()]
    assert len(differs) == 1 and "(1000000.0)" in differs[0].getMessage()
    caplog.clear()
    make(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rope_theta=1e6)
    make(rope_scaling={"type": "linear", "factor": 2.0, "rope_theta": 5e5})
    assert not [r for r in caplog.records if "transformers 5 reads" in r.getMessage()]
    assert make(rope_scaling={}, rope_parameters={"rope_type": "linear", "factor": 2.0}).rope == (
        make(rope_parameters={"rope_type": "linear", "factor": 2.0}).rope
    )


def test_null_settings_are_unset():
    # float(None) failed for these; a null required rope key is a missing one.
    assert make(rms_norm_eps=None).rms_norm_eps == 1e-6
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": None}
    with pytest.raises(ValueError, match="llama3 rope needs low_freq_factor and high_freq_factor"):
        make(rope_parameters=llama3)
    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": None}
    assert make(rope_parameters=linear).rope.theta == 10000.0
    assert make(max_position_embeddings=None).max_position_embeddings == 2048


def test_family_defaults_for_missing_fields_follow_transformers():
    # A missing max_position_embeddings was 2048 and a missing Mistral window none, for all.
    qwen2 = make(architectures=["Qwen2ForCausalLM"], num_key_value_heads=8)
    mistral = make(architectures=["MistralForCausalLM"])
    assert qwen2.max_position_embeddings == 32768 and qwen2.sliding_windows == (None,) * 4
    assert mistral.max_position_embeddings == 131072 and mistral.sliding_windows == (4096,) * 4
    assert make().max_position_embeddings == 2048


def test_model_type_decides_the_family_as_in_transformers(caplog):
    # AutoModelForCausalLM builds what model_type names; brisklm followed "architectures" and
    # built Llama (no window) for a Mistral config saved with a Llama architecture name.
    with caplog.at_level("WARNING", logger="brisklm.config"):
        config = make(model_type="mistral", sliding_window=6)
    assert config.architecture == "MistralForCausalLM" and config.sliding_windows == (6,) * 4
    assert "names architecture 'LlamaForCausalLM' but model_type 'mistral'" in caplog.text
    assert make(model_type="qwen2", num_key_value_heads=2).qkv_bias
    assert make(model_type="gemma").architecture == "LlamaForCausalLM"  # unknown: the name's


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # head_dim left out: Qwen3's config gives 128, not hidden_size // heads
        {"head_dim": 16},
        {"attention_bias": True, "mlp_bias": True},  # its MLP has no bias whatever the file says
        {"num_key_value_heads": None},
    ],
)
def test_qwen3_configs_build_the_network_transformers_builds(overrides):
    transformers = pytest.importorskip("transformers")
    raw = {
        **BASE,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_key_value_heads": 4,
        **overrides,
    }
    reference = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**raw)
    )
    layer = reference.model.layers[0]
    config = ModelConfig.from_dict(raw)
    assert config.qk_norm and config.model_type == "qwen3"
    assert config.head_dim == layer.self_attn.head_dim == layer.self_attn.q_norm.weight.shape[0]
    assert config.num_key_value_heads == reference.config.num_key_value_heads
    assert config.qkv_bias == (layer.self_attn.q_proj.bias is not None)
    assert config.o_proj_bias == (layer.self_attn.o_proj.bias is not None)
    assert config.mlp_bias == (layer.mlp.down_proj.bias is not None)
    assert config.max_position_embeddings == reference.config.max_position_embeddings
    qwen2 = make(architectures=["Qwen2ForCausalLM"], num_key_value_heads=8)
    assert not make().qk_norm and not qwen2.qk_norm


def test_missing_kv_heads_take_each_familys_default():
    # transformers' MistralConfig defaults to 8 key/value heads, Qwen2Config to 32; brisklm
    # took num_attention_heads for all and refused the checkpoint's k_proj shape.
    assert (
        make(architectures=["MistralForCausalLM"], num_attention_heads=32).num_key_value_heads == 8
    )
    assert (
        make(architectures=["Qwen2ForCausalLM"], num_attention_heads=32).num_key_value_heads == 32
    )
    assert make(num_attention_heads=32).num_key_value_heads == 32
    null = make(architectures=["Qwen2ForCausalLM"], num_key_value_heads=None)  # as transformers
    assert null.num_key_value_heads == 8
    with pytest.raises(
        ValueError, match=r"default for qwen2 \(32\) does not divide num_attention_"
    ):
        make(architectures=["Qwen2ForCausalLM"])


def test_one_architecture_name_as_a_string():
    # It was read as a list of characters: "unsupported architecture 'L'"
    assert make(architectures="MistralForCausalLM").architecture == "MistralForCausalLM"


@pytest.mark.parametrize("rope_type", ["llama3", "yarn"])
def test_a_top_level_original_context_wins_as_in_transformers(tmp_path, rope_type):
    # transformers gives a top-level original_max_position_embeddings (Phi-3 writes one) priority
    # over the rope block's for llama3 and yarn; brisklm took the block's, and other frequencies.
    transformers = pytest.importorskip("transformers")
    import torch

    from brisklm.models.rope import rope_inv_freq
    from tests.hf_models import build_hf_model, save_hf_model

    rope = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 4.0}
    rope["original_max_position_embeddings"] = 16
    if rope_type == "llama3":
        rope.update(low_freq_factor=1.0, high_freq_factor=4.0)
    save_hf_model(build_hf_model("llama", rope_parameters=rope), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["original_max_position_embeddings"] = 64
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config = ModelConfig.from_pretrained(tmp_path)
    assert config.rope.original_max_position_embeddings == 64
    ours, _ = rope_inv_freq(config.rope, config.head_dim, config.max_position_embeddings)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).model.rotary_emb
    torch.testing.assert_close(ours, reference.inv_freq, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "overrides, says",
    [
        # Phi-3's v4 rope block: the file, the block and the key that hold the value.
        (
            {"rope_scaling": {"type": "su", "short_factor": [1.0], "long_factor": [1.0]}},
            "unsupported rope type 'su' (config.json's rope_scaling.type); supported: default",
        ),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            "unsupported rope type 'longrope' (config.json's rope_parameters.rope_type)",
        ),
        (
            {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"},
            "unsupported architecture 'MixtralForCausalLM' (config.json's architectures); "
            "supported: LlamaForCausalLM",
        ),
        (
            {"hidden_act": "gelu"},
            "unsupported activation 'gelu' (config.json's hidden_act); supported: silu",
        ),
        ({"hidden_size": None}, "required field 'hidden_size' is null"),
    ],
)
def test_unsupported_values_name_the_file_the_field_and_what_is_supported(
    tmp_path, overrides, says
):
    # These said "unsupported rope type 'su'; supported: ...": no file, no field.
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **overrides}))
    with pytest.raises(ValueError) as info:
        ModelConfig.from_pretrained(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'config.json'}: ")
    assert says in str(info.value)


def test_swish_is_silu_as_in_transformers():
    # transformers' ACT2FN maps "swish" to SiLU; brisklm refused the checkpoint.
    assert make(hidden_act="swish").hidden_act == "silu"
