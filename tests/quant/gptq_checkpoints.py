"""Hand-built GPTQ checkpoints in every format variant, and their dequantized float copies.

`write_gptq_checkpoint` turns a float transformers model into a GPTQ checkpoint written the way
auto-gptq / GPTQModel lay it out (HF module names, qweight/qzeros/scales/g_idx per linear), with
round-to-nearest codes on the real weights. `write_dequantized_copy` reads any GPTQ checkpoint
back through the plain-torch reference `dequantize_gptq` and writes the float checkpoint it stands
for: the reference every quantized model is compared with.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from brisklm.quant import (
    GPTQConfig,
    GPTQTensors,
    default_g_idx,
    dequantize_gptq,
    pack_qweight,
    quantize_rtn,
    qzeros_v1_to_v2,
    unpack_qweight,
)
from tests.hf_models import save_hf_model

LINEAR_LEAVES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Modules quantized from one input (one Hessian in GPTQ): they share an act-order permutation.
SHARED_INPUT = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "gate_proj": "mlp",
    "up_proj": "mlp",
}


def rtn_tensors(
    weight: torch.Tensor, group_size: int, sym: bool, perm: torch.Tensor | None
) -> GPTQTensors:
    """v1 GPTQ tensors for weight [N, K] by round-to-nearest; with `perm`, groups are formed in
    that column order (as act-order GPTQ does), so g_idx is a scrambled k // group_size."""
    if perm is None:
        return quantize_rtn(weight, group_size=group_size, sym=sym).tensors
    permuted = quantize_rtn(weight[:, perm], group_size=group_size, sym=sym).tensors
    inverse = torch.argsort(perm)
    size = weight.shape[1] if group_size == -1 else group_size
    q = unpack_qweight(permuted.qweight)[inverse]  # (K, N) back in input order
    g_idx = default_g_idx(weight.shape[1], size)[inverse]
    return GPTQTensors(pack_qweight(q), permuted.qzeros, permuted.scales, g_idx)


def write_gptq_checkpoint(
    hf_model: Any,
    directory: Path,
    *,
    group_size: int = 128,
    sym: bool = True,
    act_order: bool = False,
    checkpoint_format: str = "gptq",
    lm_head: bool = False,
    modules_to_not_convert: tuple[str, ...] = (),
    dynamic: dict[str, Any] | None = None,
    config_in: str = "config.json",
    omit_g_idx: bool = False,
    zero_bias: bool = False,
    distinct_qkv_g_idx: bool = False,
    seed: int = 0,
) -> Path:
    """Save `hf_model`, then replace its linears by GPTQ tensors as the options describe.

    config_in: "config.json" (quantization_config), "quantize_config.json", or "both".
    zero_bias: add all-zero biases to bias-free layers, as auto-gptq's QuantLinear saves them.
    distinct_qkv_g_idx: k_proj gets its own act-order permutation (a g_idx unlike q/v's).
    """
    save_hf_model(hf_model, directory)
    raw_quant = {
        "bits": 4,
        "group_size": group_size,
        "desc_act": act_order,
        "sym": sym,
        "checkpoint_format": checkpoint_format,
        "lm_head": lm_head,
        "quant_method": "gptq",
    }
    if modules_to_not_convert:
        raw_quant["modules_to_not_convert"] = list(modules_to_not_convert)
    if dynamic:
        raw_quant["dynamic"] = dynamic
    quant = GPTQConfig.from_dict(raw_quant)
    weights_path = directory / "model.safetensors"
    state = load_file(str(weights_path))
    gen = torch.Generator().manual_seed(seed)
    perms: dict[tuple[str, str], torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        module, _, kind = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        if leaf not in (*LINEAR_LEAVES, "lm_head") or not quant.is_quantized(module):
            out[name] = tensor
            continue
        if kind == "bias":
            out[name] = tensor.half()
            continue
        perm = None
        if act_order:
            key = (parent, SHARED_INPUT.get(leaf, leaf))
            if distinct_qkv_g_idx and leaf == "k_proj":
                key = (parent, leaf)
            if key not in perms:
                perms[key] = torch.randperm(tensor.shape[1], generator=gen)
            perm = perms[key]
        t = rtn_tensors(tensor.float(), group_size, sym, perm)
        qzeros = qzeros_v1_to_v2(t.qzeros) if checkpoint_format == "gptq_v2" else t.qzeros
        out[f"{module}.qweight"] = t.qweight
        out[f"{module}.qzeros"] = qzeros
        out[f"{module}.scales"] = t.scales
        if not omit_g_idx:
            out[f"{module}.g_idx"] = t.g_idx
        if zero_bias and f"{module}.bias" not in state:
            out[f"{module}.bias"] = torch.zeros(t.qweight.shape[1], dtype=torch.float16)
    save_file(out, str(weights_path), metadata={"format": "pt"})

    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    if config_in in ("config.json", "both"):
        config["quantization_config"] = raw_quant
        config_path.write_text(json.dumps(config))
    if config_in in ("quantize_config.json", "both"):
        (directory / "quantize_config.json").write_text(json.dumps(raw_quant))
    return directory


def write_dequantized_copy(gptq_dir: Path, directory: Path) -> Path:
    """The float checkpoint a GPTQ checkpoint stands for: every GPTQ layer dequantized to float32
    by `dequantize_gptq`, everything else copied; config without the quantization config."""
    quant = GPTQConfig.from_pretrained(gptq_dir)
    assert quant is not None, f"{gptq_dir} is not a GPTQ checkpoint"
    directory.mkdir(parents=True, exist_ok=True)
    for path in gptq_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "quantize_config.json":
            shutil.copy(path, directory / path.name)
    config = json.loads((gptq_dir / "config.json").read_text())
    config.pop("quantization_config", None)
    (directory / "config.json").write_text(json.dumps(config))
    state = {}
    for path in sorted(gptq_dir.glob("*.safetensors")):
        state.update(load_file(str(path)))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        module, _, kind = name.rpartition(".")
        if kind in ("qzeros", "scales", "g_idx"):
            continue
        if kind == "qweight":
            out[f"{module}.weight"] = dequantize_gptq(
                tensor,
                state[f"{module}.qzeros"],
                state[f"{module}.scales"],
                state.get(f"{module}.g_idx"),
                checkpoint_format=quant.checkpoint_format,
                group_size=quant.group_size,
            )
        elif kind == "bias" and f"{module}.qweight" in state and not bool(tensor.any()):
            continue  # auto-gptq's placeholder zeros on a bias-free layer
        else:
            out[name] = tensor.float()
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
