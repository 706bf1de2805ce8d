"""brisklm's model quantizer: checkpoint layout, reload parity, auto-gptq format check, engine, GPTQ vs RTN."""

from __future__ import annotations

import errno
import json
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from brisklm import LLM, SamplingParams
from brisklm.loader import load_model
from brisklm.quant import GPTQConfig, GPTQTensors, QuantizeOptions, dequantize_gptq, quantize_model
from brisklm.quant.calibration import calibration_token_ids, read_calibration_samples
from brisklm.tokenizer import Tokenizer
from tests.quant.gptq_checkpoints import write_dequantized_copy
from tests.quant.test_autogptq_compat import autogptq_weight, load_autogptq_qlinear
from tests.quant.test_gptq_loading import all_logits, load_exact
from tests.tiny import CORPUS, make_tiny_checkpoint

pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Requested first so the module's other fixtures run single-threaded too."""


SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
LLAMA_OPTIONS = QuantizeOptions(
    group_size=32, sym=False, act_order=True, num_samples=16, seq_len=64, batch_size=8
)
HELD_OUT = [
    "A small boat drifted past the harbour wall while gulls circled overhead and fishermen "
    "mended their nets.",
    "To reset the router, hold the button for ten seconds, wait for the light to blink, then "
    "connect again.",
    "The recipe needs three eggs, a cup of milk, and flour; mix them well before you heat the pan.",
]
HF_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def llama_float(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("llama-float"), **SHAPE)


@pytest.fixture(scope="module")
def llama_gptq(llama_float, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "llama-gptq"
    result = quantize_model(llama_float, out, LLAMA_OPTIONS, show_progress=False)
    assert result.num_sequences > 1 and result.seq_len == 64
    return out


@pytest.fixture(scope="module")
def llama_rtn(llama_float, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "llama-rtn"
    options = QuantizeOptions(method="rtn", group_size=32, sym=False)
    quantize_model(llama_float, out, options, show_progress=False)
    return out


@pytest.fixture(scope="module")
def qwen2_gptq_lm_head(tmp_path_factory):
    """Qwen2 (q/k/v biases, tied embeddings), head quantized, all four Hessians from one pass."""
    float_dir = make_tiny_checkpoint(
        tmp_path_factory.mktemp("qwen2-float"), family="qwen2", tie_word_embeddings=True, **SHAPE
    )
    out = tmp_path_factory.mktemp("q") / "qwen2-gptq"
    options = QuantizeOptions(
        group_size=64,
        quantize_lm_head=True,
        true_sequential=False,
        num_samples=8,
        seq_len=64,
        batch_size=8,
    )
    quantize_model(float_dir, out, options, show_progress=False)
    return out


def test_checkpoint_layout(llama_float, llama_gptq):
    names = {p.name for p in llama_gptq.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "quantize_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    config = json.loads((llama_gptq / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["bits"] == 4 and qc["group_size"] == 32
    assert qc["desc_act"] is True and qc["sym"] is False and qc["checkpoint_format"] == "gptq"
    quantize_config = json.loads((llama_gptq / "quantize_config.json").read_text())
    assert quantize_config["model_file_base_name"] == "model"
    parsed = GPTQConfig.from_pretrained(llama_gptq)
    assert (parsed.group_size, parsed.desc_act, parsed.sym) == (32, True, False)

    state = load_file(str(llama_gptq / "model.safetensors"))
    for layer in range(2):
        for leaf in HF_LINEARS:
            block = "self_attn" if leaf in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"model.layers.{layer}.{block}.{leaf}"
            assert state[f"{prefix}.qweight"].dtype == torch.int32
            assert state[f"{prefix}.qzeros"].dtype == torch.int32
            assert state[f"{prefix}.scales"].dtype == torch.float16
            assert state[f"{prefix}.g_idx"].dtype == torch.int32
            assert f"{prefix}.weight" not in state
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in state)
    assert "lm_head.weight" in state and "lm_head.qweight" not in state
    # act-order: one Hessian for q/k/v, so their column orders agree; and g_idx is no plain k // 32.
    attn = "model.layers.0.self_attn"
    assert torch.equal(state[f"{attn}.q_proj.g_idx"], state[f"{attn}.v_proj.g_idx"])
    assert not torch.equal(
        state[f"{attn}.q_proj.g_idx"], torch.arange(128, dtype=torch.int32) // 32
    )
    with safe_open(str(llama_gptq / "model.safetensors"), "pt") as handle:
        assert handle.metadata()["format"] == "pt"


def test_named_chat_templates_are_copied(tmp_path):
    """transformers 5 layout: chat_template.jinja plus additional_chat_templates/<name>.jinja."""
    source = make_tiny_checkpoint(tmp_path / "float", num_hidden_layers=1, **SHAPE)
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "chat_template.jinja").write_text(config.pop("chat_template"))
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    (source / "additional_chat_templates").mkdir()
    tool_use = "TOOLS {{ tools|tojson }}{% for m in messages %}{{ m.content }}{% endfor %}"
    (source / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use)
    (source / "original").mkdir()  # e.g. Meta's consolidated weights: not for the GPTQ copy
    (source / "original" / "params.json").write_text("{}")
    out = tmp_path / "q"
    options = QuantizeOptions(method="rtn", group_size=32, sym=False)
    quantize_model(source, out, options, show_progress=False)
    assert (out / "additional_chat_templates" / "tool_use.jinja").read_text() == tool_use
    assert not (out / "original").exists()
    tokenizer = Tokenizer.from_pretrained(out)
    assert sorted(tokenizer.chat_templates) == ["default", "tool_use"]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools)
    assert rendered.startswith("TOOLS [") and rendered.endswith("hi")


def test_unpackable_layer_sizes_are_refused_before_any_work(tmp_path, monkeypatch, capsys):
    import importlib

    from brisklm.cli import main

    quantize_module = importlib.import_module("brisklm.quant.quantize_model")

    def no_work(*args, **kwargs):
        raise AssertionError("the shapes must be checked before the model is loaded")

    odd_vocab = make_tiny_checkpoint(tmp_path / "vocab405", vocab_size=405, num_hidden_layers=1)
    odd_mlp = make_tiny_checkpoint(tmp_path / "mlp100", intermediate_size=100, num_hidden_layers=1)
    capsys.readouterr()  # transformers' progress bars from saving them
    with monkeypatch.context() as patch:
        patch.setattr(quantize_module, "load_model", no_work)
        patch.setattr(quantize_module, "read_calibration_samples", no_work)
        args = ["quantize", "--model", str(odd_vocab), "--out", str(tmp_path / "q")]
        assert main([*args, "--quantize-lm-head"]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        for part in (
            "cannot quantize lm_head: its output size is 405 (the model's vocab_size), "
            "not a multiple of 8",
            "drop --quantize-lm-head",
        ):
            assert part in err
        with pytest.raises(ValueError) as error:
            quantize_model(odd_mlp, tmp_path / "q", show_progress=False)
        message = str(error.value)
        assert "cannot quantize model.layers.0.mlp.gate_proj: its output size is 100" in message
        assert "multiples of 8" in message and "cannot be quantized" in message
    assert not (tmp_path / "q").exists()
    # The head stays float without --quantize-lm-head: its vocabulary is then no concern.
    options = QuantizeOptions(method="rtn", group_size=32, sym=False)
    quantize_model(odd_vocab, tmp_path / "q", options, show_progress=False)
    assert load_model(tmp_path / "q", device="cpu", show_progress=False).config.vocab_size == 405


def test_sizes_other_loaders_cannot_read_are_named(tmp_path, caplog):
    """A layer size that is a multiple of 8 but not of 32 quantizes and loads here, but auto-gptq
    (buffers of size // 32 * 4 words) refuses the files: said at quantize time, not found later."""
    import logging

    narrow = make_tiny_checkpoint(tmp_path / "mlp200", intermediate_size=200, num_hidden_layers=1)
    options = QuantizeOptions(method="rtn", group_size=32, sym=False)
    with caplog.at_level(logging.WARNING, logger="brisklm.quant.quantize_model"):
        quantize_model(narrow, tmp_path / "q", options, show_progress=False)
    warning = caplog.text
    assert "3 layer size(s) are multiples of 8 but not of 32" in warning
    assert "model.layers.0.mlp.gate_proj (output 200)" in warning
    assert "model.layers.0.mlp.down_proj (input 200)" in warning and "auto-gptq" in warning
    assert (
        load_model(tmp_path / "q", device="cpu", show_progress=False).config.intermediate_size
        == 200
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="brisklm.quant.quantize_model"):
        quantize_model(make_tiny_checkpoint(tmp_path / "aligned"), tmp_path / "q2", options)
    assert "not of 32" not in caplog.text


@pytest.mark.parametrize("quantize_lm_head", [False, True])
def test_tied_config_with_its_own_stored_head_quantizes_that_head(tmp_path, quantize_lm_head):
    """config.json says tied but the checkpoint stores a different lm_head.weight: the loader
    takes the stored head (as transformers does), so the quantized checkpoint carries that head
    and says it is untied."""
    source = make_tiny_checkpoint(tmp_path / "float", num_hidden_layers=1, **SHAPE)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    float_state = load_file(str(source / "model.safetensors"))
    head, table = float_state["lm_head.weight"], float_state["model.embed_tokens.weight"]
    assert not torch.equal(head, table)
    out = tmp_path / "q"
    options = QuantizeOptions(
        method="rtn", group_size=32, sym=False, quantize_lm_head=quantize_lm_head
    )
    quantize_model(source, out, options, show_progress=False)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    state = load_file(str(out / "model.safetensors"))
    if quantize_lm_head:
        tensors = [state[f"lm_head.{kind}"] for kind in ("qweight", "qzeros", "scales", "g_idx")]
        stored = dequantize_gptq(*tensors)
        assert (stored - head).abs().max() < 0.1 * (table - head).abs().max()
    else:
        torch.testing.assert_close(state["lm_head.weight"].float(), head, atol=1e-3, rtol=1e-3)
    model = load_model(out, device="cpu", show_progress=False)
    assert not model.config.tie_word_embeddings


def test_refuses_quantized_input_and_non_empty_output(llama_float, llama_gptq, tmp_path):
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(llama_gptq, tmp_path / "again", show_progress=False)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        quantize_model(llama_float, tmp_path / "busy", show_progress=False)
    with pytest.raises(ValueError, match="act_order needs calibration"):
        QuantizeOptions(method="rtn", act_order=True)
    with pytest.raises(ValueError, match="group_size=48"):
        QuantizeOptions(group_size=48)


def test_the_output_may_be_the_current_folder(llama_float, llama_rtn, tmp_path, monkeypatch):
    # `--out .` quantized the whole model, then failed with "[Errno 22] Invalid argument: '.'"
    # and wrote nothing: the staging folder went inside the output folder.
    out = tmp_path / "here"
    out.mkdir()
    monkeypatch.chdir(out)
    options = QuantizeOptions(method="rtn", group_size=32, sym=False)
    quantize_model(llama_float, ".", options, show_progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in llama_rtn.iterdir())
    assert Path.cwd() == out and out.samefile(".")  # the folder itself was filled, not replaced


def test_a_config_without_a_dtype_keeps_the_stored_one(llama_float, tmp_path):
    # The float tensors were written as float16 whatever the checkpoint stored.
    import shutil

    from safetensors import safe_open

    source = tmp_path / "no-dtype"
    shutil.copytree(llama_float, source)
    config = json.loads((source / "config.json").read_text())
    for key in ("torch_dtype", "dtype"):
        config.pop(key, None)
    (source / "config.json").write_text(json.dumps(config))
    options = QuantizeOptions(method="rtn", group_size=32, sym=False)
    quantize_model(source, tmp_path / "out", options, show_progress=False)
    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as handle:
        assert handle.get_tensor("model.embed_tokens.weight").dtype == torch.float32


def test_an_output_folder_that_cannot_be_made_is_refused_before_the_work(llama_float, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        quantize_model(llama_float, tmp_path / "file", show_progress=False)
    with pytest.raises(ValueError, match="is not a writable folder"):
        quantize_model(llama_float, tmp_path / "file" / "out", show_progress=False)
    # A folder that access() calls writable but that takes no new folder: /proc as root, some
    # network mounts. The staging folder failed after the work, named in the error.
    real_mkdtemp = tempfile.mkdtemp

    def refusing_mkdtemp(*args, **kwargs):
        if kwargs.get("dir") == tmp_path:
            raise OSError(errno.ENOENT, "No such file or directory")
        return real_mkdtemp(*args, **kwargs)

    with mock.patch("tempfile.mkdtemp", refusing_mkdtemp):
        with pytest.raises(ValueError, match=f"{tmp_path} takes no new folder"):
            quantize_model(llama_float, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["llama_gptq", "llama_rtn", "qwen2_gptq_lm_head"])
def test_reload_matches_dequantized_float_copy(which, request, tmp_path):
    quantized = request.getfixturevalue(which)
    float_dir = write_dequantized_copy(quantized, tmp_path / "float")
    reference = all_logits(
        load_model(float_dir, device="cpu", dtype="float32", show_progress=False)
    )
    model = load_exact(quantized)
    scale = max(reference.abs().max().item(), 1.0)
    assert (all_logits(model) - reference).abs().max().item() <= 1e-4 * scale
    if which == "qwen2_gptq_lm_head":
        config = json.loads((quantized / "config.json").read_text())
        assert config["tie_word_embeddings"] is False  # the int4 head no longer is the embedding
        assert config["quantization_config"]["lm_head"] is True
        assert type(model.lm_head).__name__ == "GPTQMergedLinear"


@pytest.mark.parametrize("which", ["llama_gptq", "qwen2_gptq_lm_head"])
def test_autogptq_reads_the_quantized_checkpoint(which, request):
    """Every saved layer, read by auto-gptq's own QuantLinear, is the weight our reference reads."""
    quantized = request.getfixturevalue(which)
    cls = load_autogptq_qlinear().QuantLinear
    config = GPTQConfig.from_pretrained(quantized)
    state = load_file(str(quantized / "model.safetensors"))
    modules = [n.removesuffix(".qweight") for n in state if n.endswith(".qweight")]
    assert len(modules) == 2 * len(HF_LINEARS) + (which == "qwen2_gptq_lm_head")
    for module in modules:
        tensors = GPTQTensors(
            *(state[f"{module}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx"))
        )
        ours = dequantize_gptq(*tensors)
        assert torch.equal(autogptq_weight(cls, tensors, config.group_size), ours), module


def test_engine_greedy_tokens_match_dequantized_float_model(llama_gptq, tmp_path):
    float_dir = write_dequantized_copy(llama_gptq, tmp_path / "float")
    prompts = ["The quick brown fox", "Hello world! How are", '{"name": "Ada",']
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kwargs = dict(device="cpu", max_batch_size=3, max_seq_len=64, show_progress=False)
    with LLM.from_pretrained(llama_gptq, int4_compute_dtype="float32", **kwargs) as int4:
        assert type(int4.engine.model.model.layers[0].mlp.down_proj).__name__ == "GPTQMergedLinear"
        ours = [o.token_ids for o in int4.generate(prompts, params)]
    with LLM.from_pretrained(float_dir, **kwargs) as dense:
        theirs = [o.token_ids for o in dense.generate(prompts, params)]
    assert ours == theirs
    # The default path (the native kernels where they build, else torch's bfloat16 kernel)
    # generates the same tokens; "auto" is that default; "bfloat16" takes torch's kernel.
    from brisklm.kernels import native

    default = "native" if native.available() else "cpu"
    for option, backend in (({}, default), ({"int4_compute_dtype": "auto"}, default)):
        with LLM.from_pretrained(llama_gptq, **kwargs, **option) as fast:
            down = fast.engine.model.model.layers[0].mlp.down_proj.parts[0]
            assert down.backend == backend, down.backend
            got = [o.token_ids for o in fast.generate(prompts, params)]
            if backend == "native":
                assert got == theirs
    with LLM.from_pretrained(llama_gptq, int4_compute_dtype="bfloat16", **kwargs) as torch_kernel:
        down = torch_kernel.engine.model.model.layers[0].mlp.down_proj.parts[0]
        assert (down.backend, down.compute_dtype) == ("cpu", torch.bfloat16)
        assert len(torch_kernel.generate(prompts[0], params).token_ids) == 12


def test_gptq_error_below_rtn_on_held_out_text(llama_float, llama_gptq, llama_rtn):
    """Model-level output error vs the float model on text the calibration never saw.

    The held-out text must be like the calibration text: the tiny tokenizer was trained on
    tests.tiny.CORPUS alone, so CORPUS sentences become merged tokens that plain English (the
    built-in calibration text) never produces, and a random model's Hessians say nothing about them.
    """
    tokenizer = Tokenizer.from_pretrained(llama_float)
    held_out = [tokenizer.encode(text) for text in HELD_OUT]
    reference = load_model(llama_float, device="cpu", dtype="float32", show_progress=False)
    gptq, rtn = load_exact(llama_gptq), load_exact(llama_rtn)

    def error(model) -> float:
        total = 0.0
        for ids in held_out:
            ours, theirs = logits_for(model, ids), logits_for(reference, ids)
            total += float(((ours - theirs) ** 2).mean())
        return total

    gptq_error, rtn_error = error(gptq), error(rtn)
    assert gptq_error < 0.6 * rtn_error, (gptq_error, rtn_error)


def logits_for(model, ids: list[int]) -> torch.Tensor:
    from brisklm.engine.model_runner import ForwardBatch, ModelRunner

    runner = ModelRunner(model, num_slots=1, max_seq_len=len(ids) + 1, attention_backend="sdpa")
    return runner.forward(ForwardBatch([0], [0], [ids], [len(ids)]))


def test_calibration_windows(llama_float, tmp_path):
    tokenizer = Tokenizer.from_pretrained(llama_float)
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(c.strip().replace("\n", " ") for c in CORPUS * 4))
    samples = read_calibration_samples(lines)
    assert len(samples) == len(CORPUS) * 4  # no blank lines: one sample per line
    stream_len = sum(len(tokenizer.encode(s)) for s in samples)
    ids = calibration_token_ids(tokenizer, samples, num_samples=1000, seq_len=16)
    assert ids.shape == (stream_len // 16, 16)  # as many non-overlapping windows as fit
    ids = calibration_token_ids(tokenizer, samples, num_samples=3, seq_len=16)
    assert ids.shape == (3, 16)
    assert ids[0, 0] == tokenizer.bos_token_id
    short = calibration_token_ids(tokenizer, samples[:1], num_samples=4, seq_len=10_000)
    assert short.shape[0] == 1 and short.shape[1] == len(tokenizer.encode(samples[0]))
    default = read_calibration_samples(None)
    assert len(default) > 30 and all("\n\n" not in s for s in default)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match="holds no text"):
        read_calibration_samples(empty)


def test_cli_quantize(llama_float, llama_gptq, tmp_path, capsys, monkeypatch):
    from brisklm.cli import main

    out = tmp_path / "rtn"
    args = ["quantize", "--model", str(llama_float), "--out", str(out)]
    assert main([*args, "--method", "rtn", "--group-size", "64", "--asym"]) == 0
    assert "wrote" in capsys.readouterr().out
    with monkeypatch.context() as m:
        # With stderr closed (`2>&-`) the progress bar raised: exit 1 and no message anywhere.
        m.setattr(sys, "stderr", None)
        quiet = ["quantize", "--model", str(llama_float), "--out", str(tmp_path / "quiet")]
        assert main([*quiet, "--method", "rtn"]) == 0
    assert GPTQConfig.from_pretrained(tmp_path / "quiet").bits == 4
    capsys.readouterr()
    config = GPTQConfig.from_pretrained(out)
    assert (config.group_size, config.sym, config.desc_act) == (64, False, False)
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n\n".join(CORPUS * 8))
    gptq_out = tmp_path / "gptq"
    gptq_args = ["quantize", "--model", str(llama_float), "--out", str(gptq_out)]
    code = main(
        [*gptq_args, "--group-size", "-1", "--calibration", str(calibration), "--num-samples", "4"]
        + ["--seq-len", "32", "--quantize-lm-head"]
    )
    assert code == 0
    assert "calibrated on 4 x 32 tokens" in capsys.readouterr().out
    assert GPTQConfig.from_pretrained(gptq_out).lm_head is True
    for bad, message in [
        # It named the API's options (act_order, method 'gptq').
        (
            ["--method", "rtn", "--act-order"],
            "--act-order needs calibration data: use --method gptq",
        ),
        (["--group-size", "48"], "--group-size 48 is not supported"),
        (["--damp", "2"], "--damp must be in (0, 1), got 2.0"),  # was damp_percent
        (["--num-samples", "0"], "--num-samples must be >= 1"),
        (["--calibration", str(tmp_path / "missing.txt")], "does not exist"),
        (["--calibration", str(tmp_path)], "is a directory: pass a text file"),
    ]:
        assert main([*args[:-1], str(tmp_path / "new"), *bad]) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert main(["quantize", "--model", str(llama_gptq), "--out", str(tmp_path / "x")]) == 1
    assert "already quantized" in capsys.readouterr().err


def test_a_gptq_draft_computes_in_the_targets_int4_compute_dtype(llama_rtn):
    # The draft was loaded with the kernel's default (bfloat16) whatever int4_compute_dtype said.
    llm = LLM.from_pretrained(
        llama_rtn, draft=llama_rtn, int4_compute_dtype="float32", show_progress=False
    )
    try:
        draft = llm.engine.speculator.proposer.runner.model
        for model in (llm.engine.model, draft):
            assert model.model.layers[0].mlp.down_proj.parts[0].compute_dtype == torch.float32
    finally:
        llm.close()


FORCED_RUNS_SCHEMA = {
    "type": "array",
    "minItems": 6,
    "items": {
        "type": "object",
        "properties": {
            "description_of_the_item": {"type": "string", "maxLength": 6},
            "quantity_currently_in_stock": {"type": "integer", "maximum": 999},
            "is_available_for_shipping": {"type": "boolean"},
        },
        "required": [
            "description_of_the_item",
            "quantity_currently_in_stock",
            "is_available_for_shipping",
        ],
    },
}


def test_a_gptq_target_with_a_draft_gives_the_plain_output_bit_for_bit(llama_gptq):
    """Verification attends query by query on CPU (AttentionMetadata.stepwise): the masked call
    over a row's k+1 queries rounded differently from one-token steps, which the bfloat16 int4
    compute magnified to logprobs ~1e-2 apart and, at near-ties, other tokens."""
    prompts = ["The quick brown fox", "Once upon a time there", "A small boat drifted"]
    greedy = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, logprobs=2)
    seeded = SamplingParams(temperature=0.9, seed=11, max_tokens=80, ignore_eos=True)
    # Without logprobs a grammar's forced runs are fed as one row: query by query there too.
    constrained = SamplingParams(temperature=0, max_tokens=200, json_schema=FORCED_RUNS_SCHEMA)
    with LLM.from_pretrained(llama_gptq, show_progress=False) as plain:
        expected = [plain.generate(p, greedy) for p in prompts]
        expected_json = [plain.generate(p, constrained) for p in ["JSON:", prompts[0]]]
    for draft in (llama_gptq, "ngram"):
        with LLM.from_pretrained(
            llama_gptq, draft=draft, num_speculative_tokens=4, show_progress=False
        ) as drafted:
            accepted = 0
            for prompt, want in zip(prompts, expected):
                got = drafted.generate(prompt, greedy)
                assert got.token_ids == want.token_ids
                assert [e.logprob for e in got.logprobs] == [e.logprob for e in want.logprobs]
                assert [[t.logprob for t in e.top] for e in got.logprobs] == [
                    [t.logprob for t in e.top] for e in want.logprobs
                ]
                accepted += got.speculative.num_accepted
            assert accepted > 0
            got_json = [drafted.generate(p, constrained) for p in ["JSON:", prompts[0]]]
            assert [o.token_ids for o in got_json] == [o.token_ids for o in expected_json]
            # Beside a seeded request every row is computed as alone, verification included.
            outputs = drafted.generate(prompts, [seeded, greedy, greedy])
            for got, want in zip(outputs[1:], expected[1:]):
                assert got.token_ids == want.token_ids
                assert [e.logprob for e in got.logprobs] == [e.logprob for e in want.logprobs]


def test_an_int4_model_without_a_compiler_is_told_and_runs_torchs_kernel(
    llama_rtn, monkeypatch, caplog
):
    # Int4 models run the native kernels on CPU too: without gcc the loader says what to install
    # (once), and the layers take torch's int4 kernel.
    from brisklm.kernels import native

    monkeypatch.setattr(native, "_compiler", lambda: None)
    native.library.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            llm = LLM.from_pretrained(llama_rtn, show_progress=False)
        try:
            assert caplog.text.count("no C compiler") == 1
            layer = llm.engine.runner.model.model.layers[0].mlp.down_proj.parts[0]
            assert layer.backend == "cpu" and llm.engine.runner.native is None
            assert llm.generate("Hi", SamplingParams(max_tokens=2)).token_ids
        finally:
            llm.close()
    finally:
        monkeypatch.undo()
        native.library.cache_clear()
