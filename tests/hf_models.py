"""Tiny random Hugging Face checkpoints for parity tests, built with transformers and saved to disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

BASE_CONFIG: dict[str, Any] = {
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.5,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

ARCH_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def build_hf_model(family: str = "llama", seed: int = 0, **overrides: Any) -> Any:
    """A random transformers model of the given family with a large init so RoPE/mask bugs show."""
    import transformers

    config_name, model_name = ARCH_CLASSES[family]
    config = getattr(transformers, config_name)(**{**BASE_CONFIG, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    # Norm weights start at exactly 1 and biases at 0; randomise them so they are exercised too.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0, 0.5)
    return model.eval()


def save_hf_model(model: Any, directory: Path, **kwargs: Any) -> Path:
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory
