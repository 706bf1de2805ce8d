"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3) over Hugging Face parameter names.

q/k/v and gate/up are merged into one matmul each (``qkv_proj``, ``gate_up_proj``); the loader maps
the checkpoint's separate tensors onto slices of them through ``PACKED_MODULES``. Nothing here
allocates caches, moves devices or picks kernels: the forward pass receives the KV cache, the
attention metadata and the attention backend as arguments.
"""

from __future__ import annotations

import torch
from torch import nn

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata
from brisklm.cache.contiguous import KVCache
from brisklm.config import ModelConfig
from brisklm.models.layers import GatedMLP, LinearFactory, RMSNorm, dense_linear
from brisklm.models.rope import RotaryEmbedding, apply_rotary

# Checkpoint module name -> (our merged module name, shard index within it).
PACKED_MODULES: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_index: int, make_linear: LinearFactory, prefix: str
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.sliding_window = config.sliding_windows[layer_index]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = make_linear(
            config.hidden_size, [q_size, kv_size, kv_size], config.qkv_bias, f"{prefix}.qkv_proj"
        )
        self.o_proj = make_linear(
            q_size, [config.hidden_size], config.o_proj_bias, f"{prefix}.o_proj"
        )
        # Qwen3: an RMSNorm over each query head and each key head, before the rotation.
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(
            num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim
        )
        qk = qkv[:, : self.num_heads + self.num_kv_heads]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        # Rotate q and k together: one set of elementwise ops instead of two.
        qk = apply_rotary(qk, cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.num_heads + self.num_kv_heads :]
        out = backend.attend(q, k, v, kv[0], kv[1], meta, self.sliding_window)  # (N, H * D)
        return self.o_proj(out)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_index: int, make_linear: LinearFactory, prefix: str
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_index, make_linear, f"{prefix}.self_attn")
        self.mlp = GatedMLP(
            config.hidden_size,
            config.intermediate_size,
            config.mlp_bias,
            make_linear,
            f"{prefix}.mlp",
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, meta, backend)
        return x + self.mlp(self.post_attention_layernorm(x), meta.row_invariant)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, make_linear: LinearFactory) -> None:
        super().__init__()
        # Built on the meta device and filled by the loader. The table is given, not initialised:
        # nn.Embedding's own normal_() on meta tensors runs through torch._refs, whose first call
        # imports torch._dynamo, 1 s of every load (the bundled model's: 1.4 s, 0.4 s without).
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=weight, _freeze=True
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, make_linear, f"model.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Decoder plus LM head. ``forward`` returns final hidden states; ``compute_logits`` the logits."""

    def __init__(self, config: ModelConfig, make_linear: LinearFactory = dense_linear) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, make_linear)
        self.lm_head = make_linear(config.hidden_size, [config.vocab_size], False, "lm_head")
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, config.max_position_embeddings)
        # The dtype hidden states are computed in; None: the embedding table's. The loader sets
        # float32 for a bfloat16 or float16 model on CPU that runs through the native kernels
        # (weights stored in half precision, arithmetic in float32: see
        # brisklm.models.native_forward).
        self.compute_dtype: torch.dtype | None = None
        # The KV cache's element type; None: activation_dtype. Such a half-precision model keeps
        # its cache in its own dtype (rounded as it is written, widened as it is read).
        self.kv_cache_dtype: torch.dtype | None = None

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype of the hidden states (and of attention's arithmetic)."""
        return self.compute_dtype or self.model.embed_tokens.weight.dtype

    @property
    def cache_dtype(self) -> torch.dtype:
        """The dtype of the KV cache's elements."""
        return self.kv_cache_dtype or self.activation_dtype

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head (call after materialising parameters).

        A quantized LM head (no float ``weight``) keeps its own int4 weights. On CPU the head is
        later packed as a copy (``Linear.finalize``); the embedding table keeps its row layout.
        """
        if self.config.tie_word_embeddings and isinstance(
            getattr(self.lm_head, "weight", None), nn.Parameter
        ):
            self.lm_head.weight = self.model.embed_tokens.weight
            self.lm_head.relayout_on_cpu = False

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Hidden states (N, E) for the packed input_ids (N,) placed as ``meta`` describes."""
        hidden = self.model.embed_tokens(input_ids).to(self.activation_dtype)
        cos, sin = self.rotary(
            meta.positions, hidden.dtype, meta.query_lens, meta.row_max_positions
        )
        for index, layer in enumerate(self.model.layers):
            hidden = layer(hidden, cos, sin, kv_cache.layer(index), meta, backend)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits (N, V) for hidden states (N, E)."""
        return self.lm_head(hidden).float()
