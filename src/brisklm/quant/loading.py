"""Which linear layers a checkpoint needs: dense for float checkpoints, GPTQ int4 for quantized ones.

The loader stays format-agnostic: it calls a linear-layer factory; this module picks the factory
from the checkpoint's quantization config (config.json's ``quantization_config`` or
quantize_config.json). Anything but a supported GPTQ config is a clear error here, before any
weight is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from brisklm.models.layers import Linear, LinearFactory, dense_linear
from brisklm.models.llama import PACKED_MODULES

from .config import GPTQConfig, UnreadableConfigError
from .merged_linear import GPTQMergedLinear


def checkpoint_module_names(prefix: str) -> list[str]:
    """Checkpoint module names behind one of our modules, in shard order.

    ``model.layers.0.self_attn.qkv_proj`` -> [``...q_proj``, ``...k_proj``, ``...v_proj``];
    a module that is not merged maps to itself.
    """
    parent, _, leaf = prefix.rpartition(".")
    shards = sorted(
        (index, original) for original, (merged, index) in PACKED_MODULES.items() if merged == leaf
    )
    if not shards:
        return [prefix]
    return [f"{parent}.{original}" if parent else original for _, original in shards]


def gptq_linear_factory(
    quant: GPTQConfig,
    device: torch.device | str,
    *,
    backend: str = "auto",
    compute_dtype: torch.dtype | None = None,
    activation_dtype: torch.dtype | None = None,
) -> LinearFactory:
    """A factory of GPTQ int4 layers, with dense layers where ``quant`` leaves modules in float.

    ``compute_dtype`` is what the int4 kernels compute in (None: on CPU float32 through the
    native kernels, exact products of the dequantized weight, or torch's bfloat16 kernel without
    them; bfloat16 or float16 take torch's CPU kernel; on CUDA the kernel's own). A merged
    module (q/k/v, gate/up) must be quantized in all its shards or in none: it is one matmul.
    """

    def make_linear(
        in_features: int, out_features: Sequence[int], bias: bool, prefix: str
    ) -> nn.Module:
        names = checkpoint_module_names(prefix)
        quantized = [quant.is_quantized(name) for name in names]
        if not any(quantized):
            return Linear(in_features, out_features, bias)
        if not all(quantized):
            kept = [n for n, q in zip(names, quantized) if not q]
            raise ValueError(
                f"the quantization config leaves {', '.join(kept)} in float but quantizes the rest of "
                f"{', '.join(names)}; brisklm runs these as one fused matmul, so they must be quantized "
                "alike (check modules_to_not_convert / dynamic)"
            )
        return GPTQMergedLinear(
            in_features,
            out_features,
            bias,
            group_size=quant.group_size,
            checkpoint_format=quant.checkpoint_format,
            name=prefix,
            device=device,
            backend=backend,
            compute_dtype=compute_dtype,
            activation_dtype=activation_dtype,
            # Act-order groups cannot be rebuilt without it (static groups are the default order)
            g_idx_required=quant.desc_act and not quant.static_groups and quant.group_size != -1,
        )

    return make_linear


def linear_factory_for(
    model_dir: str | Path,
    *,
    device: torch.device | str,
    backend: str = "auto",
    compute_dtype: torch.dtype | None = None,
    activation_dtype: torch.dtype | None = None,
) -> LinearFactory:
    """The linear-layer factory a checkpoint directory needs (dense unless it is GPTQ-quantized).
    ``activation_dtype``: the model's dtype, in which ``auto`` tries the CUDA int4 kernels.

    Raises ValueError naming the directory for a quantization brisklm cannot run (AWQ, 3-bit, ...).
    """
    try:
        quant = GPTQConfig.from_pretrained(model_dir)
    except UnreadableConfigError:
        raise
    except ValueError as exc:
        raise ValueError(f"unsupported quantization: {exc}") from None  # exc names the file
    if quant is None:
        return dense_linear
    return gptq_linear_factory(
        quant,
        device,
        backend=backend,
        compute_dtype=compute_dtype,
        activation_dtype=activation_dtype,
    )
