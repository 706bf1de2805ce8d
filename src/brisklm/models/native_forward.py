"""The forward pass of a Llama-family model on CPU (float32, or bfloat16 or float16 weights)
through the native kernels.

``brisklm.kernels.cpu_forward`` runs a whole forward pass (every layer, the final norm and the LM
head) in one call and one OpenMP parallel region. It serves rows of up to ``MAX_QUERY_LEN`` tokens:
decode steps, speculative verification and short prompts; longer rows (prefill) go through the
model's torch ops (SDPA's attention), whose linear layers run the same native product. Which path
a row takes depends only on its own length, and each path computes a row the same way whatever else
is in the batch, so a row's logits do not depend on its batch (see ``ForwardBatch.row_invariant``).

A model uses it when it is a plain ``LlamaForCausalLM`` on CPU, every linear layer dense or GPTQ
int4 through the kernels (``GPTQLinear``'s "native" backend, the default on CPU, its shards merged
into one product), and the kernels build on this machine, in one of two forms:

- float32: every parameter float32;
- half-precision weights, float32 arithmetic: the embedding table and the linear weights
  bfloat16 or float16, the norms, biases and hidden states float32 (``compute_dtype``), the KV
  cache in the weights' dtype (``kv_cache_dtype``: rounded to nearest even as it is written,
  widened as it is read). The loader gives a bfloat16 or float16 model on CPU this form
  (``compute_in_float32``): the kernels widen each weight as they read it, so a decode step reads
  half the bytes of a float32 one, and a row's logits are the bits the float32 form computes from
  the same (half-precision) values. On an AVX2 CPU, which emulates bfloat16 arithmetic, torch's
  bfloat16 ops had run the 125M benchmark model at 34.5 tokens/s at batch 1 and prefilled 102
  tokens/s, against 87-90 and 375-400 this way; float16 ops at 55.8 and 152, against 126 and 753
  (docs/benchmarks.md).

Such a model's linear weights are packed at load into the kernels' panel layout
(``use_native_layout``, called by the loader before it lays the weights out) instead of oneDNN's.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from brisklm.cache.contiguous import KVCache
from brisklm.kernels import native
from brisklm.kernels.team_size import TEAM
from brisklm.models.layers import GatedMLP, Linear, RMSNorm
from brisklm.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

if TYPE_CHECKING:
    from brisklm.sampling import SamplingMetadata

# Longest row (in tokens) the native pass takes; longer rows run through torch's ops (SDPA's
# attention; their products through the same native kernel). With attention reading shared keys
# together (session 36) the native pass is the faster up to 512 tokens but for long rows late in
# a long context (one prompt, 2 threads, AVX2 Zen 3, native pass against torch's ops): 125M model
# 0.86x / 0.87x / 0.90x / 0.91x at 64 / 128 / 256 / 512 tokens from position 0, 0.90x / 0.96x /
# 0.96x at 64 / 256 / 512 from position 512, 0.97x / 1.02x at 128 / 512 from position 1,024; the
# bundled 11M model 0.67-0.83x from position 0 and 0.75-0.89x from 500. (Before, torch's ops
# overtook it from about 128 tokens, and the limit was 64.)
MAX_QUERY_LEN = 512
assert MAX_QUERY_LEN <= native.MAX_TOKENS


_CPU = torch.device("cpu")


def supports(model: torch.nn.Module) -> bool:
    """Whether ``model`` can run through the native kernels (before or after its weights are laid out)."""
    if not supports_structure(model) or not _on_cpu(model):
        return False
    assert isinstance(model, LlamaForCausalLM)
    weights = _weights(model)
    weight_dtype = weights[0].dtype
    if weight_dtype not in native.WEIGHT_TYPES or any(w.dtype != weight_dtype for w in weights):
        return False
    if any(p.dtype != torch.float32 for p in _other_parameters(model)):
        return False
    return model.activation_dtype == torch.float32 and native.available()


def compute_in_float32(model: torch.nn.Module) -> bool:
    """Give a loaded bfloat16 or float16 CPU model the native kernels' half-precision form (see the
    module's docstring): norms and biases to float32, ``compute_dtype`` float32, the embedding
    table and linear weights left as they are. Returns whether it did; a model the kernels cannot
    run (or whose linear layers would not be packed for them) is left as it is."""
    if not supports_structure(model) or not _on_cpu(model) or not native.available():
        return False
    assert isinstance(model, LlamaForCausalLM)
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1 or dtypes.pop() not in native.HALF_TYPES:
        return False
    if not all(
        _packs_natively(linear) or _int4_runs_natively(linear) for linear in _linears(model)
    ):
        return False
    half = model.model.embed_tokens.weight.dtype
    for param in _other_parameters(model):
        param.data = param.data.float()
    model.compute_dtype = torch.float32
    model.kv_cache_dtype = half
    return True


def _weights(model: LlamaForCausalLM) -> list[torch.Tensor]:
    """The tensors the kernels read as float weights (of ``native.WEIGHT_TYPES``): the embedding
    table and the dense linear layers' weights."""
    dense = [linear.weight for linear in _linears(model) if isinstance(linear, Linear)]
    return [model.model.embed_tokens.weight] + dense


def is_int4(linear: torch.nn.Module | None) -> bool:
    """Whether ``linear`` is a GPTQ int4 layer (loaded or not)."""
    from brisklm.quant.merged_linear import GPTQMergedLinear  # (brisklm.quant imports the loader)

    return type(linear) is GPTQMergedLinear


def _native_int4(linear: torch.nn.Module) -> native.Int4Weight | None:
    """The native kernels' weight of a loaded GPTQ int4 layer that runs as one product through
    them (its shards merged: they share one g_idx), else None."""
    parts = getattr(linear, "parts", None) if is_int4(linear) else None
    if not parts or len(parts) != 1 or parts[0].backend != "native":
        return None
    return parts[0].int4


def _int4_runs_natively(linear: torch.nn.Module) -> bool:
    """Whether a GPTQ int4 layer runs (loaded) or will run (not yet: by the backend and compute
    dtype it was built with) through the native kernels, as one product."""
    if not is_int4(linear):
        return False
    if linear.parts:
        return _native_int4(linear) is not None
    from brisklm.quant.int4_linear import native_backend_chosen

    return native_backend_chosen(linear.backend, linear.device, linear.compute_dtype)


def _bias(linear: torch.nn.Module) -> torch.Tensor | None:
    """The float32 bias the kernels add to ``linear``'s product."""
    return linear.parts[0]._bias if is_int4(linear) else linear.bias


def _other_parameters(model: LlamaForCausalLM) -> list[torch.nn.Parameter]:
    """Every other parameter (norms, biases): float32 for the kernels."""
    weights = {id(w) for w in _weights(model)}
    return [p for p in model.parameters() if id(p) not in weights]


def _packs_natively(linear: torch.nn.Module) -> bool:
    """Whether ``use_native_layout`` packs this layer (one built with an explicit layout keeps it)."""
    return isinstance(linear, Linear) and linear.pack_on_cpu and linear.min_pack_bytes is None


def supports_structure(model: torch.nn.Module) -> bool:
    """Whether ``model``'s modules are ones the kernels run (whatever its dtype or device: also
    a model still on the meta device)."""
    if type(model) is not LlamaForCausalLM:
        return False
    for layer in model.model.layers:
        if (
            type(layer) is not LlamaDecoderLayer
            or type(layer.self_attn) is not LlamaAttention
            or type(layer.mlp) is not GatedMLP
            or type(layer.input_layernorm) is not RMSNorm
            or type(layer.post_attention_layernorm) is not RMSNorm
        ):
            return False
    linears = _linears(model)
    if any(type(linear) is not Linear and not is_int4(linear) for linear in linears):
        return False
    config = model.config
    return config.num_attention_heads % config.num_key_value_heads == 0


def _on_cpu(model: torch.nn.Module) -> bool:
    params = list(model.parameters())
    return bool(params) and all(p.device.type == "cpu" for p in params)


def use_native_layout(model: LlamaForCausalLM) -> None:
    """Have the linear layers packed into the native kernels' panel layout when they are laid out
    (``Linear.finalize``): the native pass reads them, and torch's ops (rows longer than
    ``MAX_QUERY_LEN``, other attention backends) run their products through the same kernel, as
    fast as oneDNN's packed product. Layers built with an explicit layout
    (``Linear(pack_on_cpu=False)`` or ``min_pack_bytes``) keep it."""
    for linear in _linears(model):
        if _packs_natively(linear):
            linear.native_pack = True


def _linears(model: LlamaForCausalLM) -> list[torch.nn.Module]:
    modules: list[torch.nn.Module] = [model.lm_head]
    for layer in model.model.layers:
        modules += [
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        ]
    return modules


def _address(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


@dataclass(frozen=True)
class StepSampling:
    """How ``NativeForward.run_steps`` samples: ``uniforms`` (steps, rows) float64 in [0, 1), a
    row's uniform for each step (``sampler.row_uniforms``'s, drawn ahead); ``sampled`` (rows,)
    bool, the rows that draw (the others take the greedy token); ``filters`` the rows'
    (temperature, top_k, top_p, min_p), as ``SamplingMetadata.filter_rows`` gives them."""

    uniforms: torch.Tensor
    sampled: torch.Tensor
    filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


# The pass's arguments that LogitAdjustments point at (with n_bias).
_ADJUSTMENT_FIELDS = (
    "bias_rows",
    "bias_ids",
    "bias_values",
    "repetition",
    "seen",
    "frequency",
    "presence",
    "counts",
)


@dataclass(frozen=True)
class LogitAdjustments:
    """What ``NativeForward.run_steps`` does to each row's logits before its token is chosen, as
    ``brisklm.sampling.sampler``'s ``_adjust_logits`` does to them (``SamplingMetadata``'s
    fields): ``bias`` (rows, ids, values) entries added, or None; ``repetition`` (rows,) over
    ``seen`` (rows, V) bool, or None; ``frequency`` and ``presence`` (rows,) by ``counts`` (rows,
    V) float32, or None. The steps count their tokens in ``seen`` and ``counts`` (in place), so
    each step's penalties are those of the tokens before it."""

    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    repetition: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    frequency: torch.Tensor | None = None
    presence: torch.Tensor | None = None
    counts: torch.Tensor | None = None

    @classmethod
    def of(cls, md: SamplingMetadata) -> LogitAdjustments | None:
        """``md``'s bias and penalties (None: it has neither), on copies the steps may count in."""
        if md.no_logit_bias and md.no_penalties:
            return None
        bias = None
        if md.logit_bias_rows is not None:
            bias = (md.logit_bias_rows, md.logit_bias_ids, md.logit_bias_values)
        seen = counts = None
        if md.repetition_penalty is not None:
            assert md.seen_mask is not None
            seen = md.seen_mask.clone()
        if md.frequency_penalty is not None:
            assert md.output_counts is not None
            counts = md.output_counts.clone()
        return cls(
            bias, md.repetition_penalty, seen, md.frequency_penalty, md.presence_penalty, counts
        )


def adjustment_arguments(
    args: native.ForwardArgs, adjustments: LogitAdjustments | None, rows: int
) -> list[torch.Tensor] | None:
    """Point ``args``' bias and penalty fields at ``adjustments``' tensors for ``rows`` logits
    rows of ``args.vocab`` (None: clear them); returns the tensors, to be kept alive through the
    call. Every tensor is checked before any field is set: a refused one leaves them clear."""
    args.n_bias = 0
    for name in _ADJUSTMENT_FIELDS:
        setattr(args, name, None)
    if adjustments is None:
        return None
    pointed: dict[str, torch.Tensor] = {}

    def point(name: str, tensor: torch.Tensor, dtype: torch.dtype, shape: tuple) -> None:
        if tuple(tensor.shape) != shape or tensor.device.type != "cpu" or tensor.dtype != dtype:
            raise ValueError(
                f"logit adjustment {name} must be a CPU {dtype} tensor of shape {shape}, got "
                f"{tensor.dtype} {tuple(tensor.shape)} on {tensor.device}"
            )
        if not tensor.is_contiguous():
            raise ValueError(f"logit adjustment {name} must be contiguous")
        pointed[name] = tensor

    vocab = args.vocab
    if adjustments.bias is not None:
        bias_rows, ids, values = (t.contiguous() for t in adjustments.bias)
        entries = (bias_rows.numel(),)
        point("bias_rows", bias_rows, torch.int64, entries)
        point("bias_ids", ids, torch.int64, entries)
        point("bias_values", values, torch.float32, entries)
    if adjustments.repetition is not None:
        assert adjustments.seen is not None
        point("repetition", adjustments.repetition, torch.float32, (rows,))
        point("seen", adjustments.seen.view(torch.uint8), torch.uint8, (rows, vocab))
    if adjustments.frequency is not None:
        assert adjustments.presence is not None and adjustments.counts is not None
        point("frequency", adjustments.frequency, torch.float32, (rows,))
        point("presence", adjustments.presence, torch.float32, (rows,))
        point("counts", adjustments.counts, torch.float32, (rows, vocab))
    for name, tensor in pointed.items():
        setattr(args, name, tensor.data_ptr())
    args.n_bias = len(pointed["bias_rows"]) if "bias_rows" in pointed else 0
    return list(pointed.values())


class NativeForward:
    """Runs ``model`` over ``kv_cache`` through the native kernels; see ``forward``.

    Not thread-safe: one call at a time (its arguments and scratch buffers are shared between
    calls), as the engine's single thread makes them.
    """

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        config = model.config
        self.lib = native.library()
        assert self.lib is not None
        # Nanoseconds the kernels' threads have slept at barriers (see kernels/team_size.py).
        self._slept_ns = ctypes.c_int64.in_dll(self.lib, "brisk_barrier_sleep_ns")
        layers = model.model.layers
        eps = {m.eps for m in model.modules() if isinstance(m, RMSNorm)}
        if len(eps) != 1:
            raise ValueError("the native forward pass needs one RMSNorm eps for the whole model")

        def pointers(tensors: list[torch.Tensor | None]) -> ctypes.Array:
            return (ctypes.c_void_p * len(tensors))(*[_address(t) for t in tensors])

        attn = [layer.self_attn for layer in layers]
        mlp = [layer.mlp for layer in layers]
        # Keep the tensors alive as long as their addresses are in use.
        self._tensors = [p for p in model.parameters()]
        # An int4 product's weight is its Int4Weight's q4_weight (kept alive with the model).
        self._int4 = [w for w in map(_native_int4, _linears(model)) if w is not None]

        def weights(linears: list[torch.nn.Module]) -> ctypes.Array:
            int4 = [_native_int4(linear) for linear in linears]
            addresses = [
                w.address if w is not None else linear.weight.data_ptr()
                for w, linear in zip(int4, linears)
            ]
            return (ctypes.c_void_p * len(addresses))(*addresses)

        self._tables = {
            "in_norm": pointers([layer.input_layernorm.weight for layer in layers]),
            "qkv_w": weights([a.qkv_proj for a in attn]),
            "qkv_b": pointers([_bias(a.qkv_proj) for a in attn]),
            "o_w": weights([a.o_proj for a in attn]),
            "o_b": pointers([_bias(a.o_proj) for a in attn]),
            "post_norm": pointers([layer.post_attention_layernorm.weight for layer in layers]),
            "gu_w": weights([m.gate_up_proj for m in mlp]),
            "gu_b": pointers([_bias(m.gate_up_proj) for m in mlp]),
            "down_w": weights([m.down_proj for m in mlp]),
            "down_b": pointers([_bias(m.down_proj) for m in mlp]),
        }
        if config.qk_norm:  # (else the kernels see NULL: no norm)
            self._tables["q_norm"] = pointers([a.q_norm.weight for a in attn])
            self._tables["k_norm"] = pointers([a.k_norm.weight for a in attn])
        # 0: no window (also for a window no shorter than the cache, which then never applies).
        windows = list(config.sliding_windows) or [None] * len(layers)
        self._windows = (ctypes.c_int * len(layers))(
            *[w if w is not None and 0 < w < kv_cache.max_seq_len else 0 for w in windows]
        )
        self._cache_identity: tuple[int, int, int] | None = None
        self._space: dict[str, torch.Tensor] = {}
        self._space_size = (0, 0, 0)
        # The per-call arguments, in arrays the C side always reads from (filled by _run).
        int64s = ctypes.c_int64 * native.MAX_TOKENS
        self._ids, self._slots, self._positions = int64s(), int64s(), int64s()
        self._logit_tokens, self._rope_rows, self._argmax = int64s(), int64s(), int64s()
        self._step_tokens = int64s()
        self._steps_done = ctypes.c_int(0)
        self._greedy_logits = torch.empty(0, config.vocab_size, dtype=torch.float32)
        # The shapes, as the C side reads them (also read back here: args.hidden, ...).
        args = native.ForwardArgs(
            n_layers=len(layers),
            hidden=config.hidden_size,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            inter=config.intermediate_size,
            vocab=config.vocab_size,
            max_seq_len=kv_cache.max_seq_len,
            eps=float(eps.pop()),
            scale=1.0 / math.sqrt(config.head_dim),
        )
        for name, table in self._tables.items():
            setattr(args, name, ctypes.addressof(table))
        args.window = ctypes.addressof(self._windows)
        args.embed = model.model.embed_tokens.weight.data_ptr()
        args.final_norm = model.model.norm.weight.data_ptr()
        args.head_w = weights([model.lm_head])[0]
        args.weight_type = native.WEIGHT_TYPES[model.model.embed_tokens.weight.dtype]
        # Each product's weight type: int4, or the dense weights' (one dtype: see ``supports``).
        dense = args.weight_type

        def weight_type(linear: torch.nn.Module) -> int:
            return native.WT_INT4 if is_int4(linear) else dense

        products = [[a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj] for a, m in zip(attn, mlp)]
        types = [weight_type(linear) for four in products for linear in four]
        self._layer_types = (ctypes.c_int * max(len(types), 1))(*types)
        args.layer_types = ctypes.addressof(self._layer_types)
        args.head_type = weight_type(model.lm_head)
        args.cache_type = native.WEIGHT_TYPES[kv_cache.keys.dtype]
        args.token_ids = ctypes.addressof(self._ids)
        args.slots = ctypes.addressof(self._slots)
        args.positions = ctypes.addressof(self._positions)
        args.logit_tokens = ctypes.addressof(self._logit_tokens)
        args.argmax = ctypes.addressof(self._argmax)
        args.step_tokens = ctypes.addressof(self._step_tokens)
        args.steps_done = ctypes.addressof(self._steps_done)
        self.args = args

    @classmethod
    def create(cls, model: torch.nn.Module, kv_cache: KVCache) -> NativeForward | None:
        """A native forward pass for ``model`` when it qualifies (see ``supports``) and its linear
        weights were packed for the kernels (``use_native_layout``), else None."""
        if not isinstance(model, LlamaForCausalLM) or not supports(model):
            return None
        linears = _linears(model)
        for linear in linears:
            if is_int4(linear):
                if _native_int4(linear) is None:
                    return None
            elif not linear.is_native_packed:
                return None
            bias = _bias(linear)
            if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
                return None
        if not model.model.embed_tokens.weight.is_contiguous():
            return None
        if kv_cache.keys.dtype not in native.WEIGHT_TYPES or not kv_cache.keys.is_contiguous():
            return None
        return cls(model, kv_cache)

    def _cache_pointers(self) -> None:
        """Point the C side at the cache's layers (again if the cache tensors were replaced)."""
        keys, values = self.kv_cache.keys, self.kv_cache.values
        identity = (keys.data_ptr(), values.data_ptr(), self.kv_cache.max_seq_len)
        if identity == self._cache_identity:
            return
        if native.WEIGHT_TYPES.get(keys.dtype) != self.args.cache_type or not (
            keys.is_contiguous() and values.is_contiguous() and values.dtype == keys.dtype
        ):
            raise ValueError(
                "the native forward pass needs a contiguous KV cache of the dtype it was made for"
            )
        num_layers = keys.shape[0]
        self._k_table = (ctypes.c_void_p * num_layers)(
            *[keys[i].data_ptr() for i in range(num_layers)]
        )
        self._v_table = (ctypes.c_void_p * num_layers)(
            *[values[i].data_ptr() for i in range(num_layers)]
        )
        self.args.k_cache = ctypes.addressof(self._k_table)
        self.args.v_cache = ctypes.addressof(self._v_table)
        self.args.max_seq_len = self.kv_cache.max_seq_len
        self._cache_identity = identity
        self._space = {}  # the scores buffer is sized by max_seq_len

    def _workspace(self, num_tokens: int, num_logits: int, threads: int) -> None:
        """Point the C side at scratch buffers for a call of ``num_tokens`` tokens: one set, grown
        to the largest call seen (the C side indexes only the rows it is given)."""
        need = (num_tokens, num_logits, threads)
        have = self._space_size
        if self._space and all(n <= h for n, h in zip(need, have)):
            return
        tokens, logits, threads = (max(n, h) for n, h in zip(need, have))
        a = self.args
        empty = lambda *shape: torch.empty(*shape, dtype=torch.float32)  # noqa: E731
        self._space = {
            "hidden_states": empty(tokens, a.hidden),
            "xn": empty(tokens, a.hidden),
            "qkv": empty(tokens, (a.n_heads + 2 * a.n_kv_heads) * a.head_dim),
            "attn": empty(tokens, a.n_heads * a.head_dim),
            "gate_up": empty(tokens, 2 * a.inter),
            "act": empty(tokens, a.inter),
            "scores": empty(threads, native.attention_space(a.max_seq_len, a.head_dim)),
            "normed": empty(max(logits, 1), a.hidden),
        }
        self._space_size = (tokens, logits, threads)
        for name, tensor in self._space.items():
            setattr(a, name, tensor.data_ptr())

    def forward(
        self,
        token_ids: list[list[int]],
        slots: list[int],
        start_positions: list[int],
        num_logits: list[int],
    ) -> torch.Tensor:
        """Float32 logits (sum(num_logits), V) for rows that each append ``token_ids[b]`` to cache
        slot ``slots[b]`` at ``start_positions[b]``; the last ``num_logits[b]`` tokens of a row
        get logits, rows in order. Rows may be ragged; at most ``native.MAX_TOKENS`` tokens."""
        logits = torch.empty(sum(num_logits), self.args.vocab, dtype=torch.float32)
        self._run(token_ids, slots, start_positions, num_logits, logits, 0)
        return logits

    def forward_greedy(
        self,
        token_ids: list[list[int]],
        slots: list[int],
        start_positions: list[int],
        num_logits: list[int],
        columns: int,
    ) -> list[int]:
        """``forward``'s pass, returning each logits row's greedy token over its first ``columns``
        logits (``brisklm.sampling.sampler.greedy_tokens`` of ``logits[:, :columns]``) instead of
        the logits: the kernels' threads find them in the parts of the rows each computed, and
        the logits go to a buffer kept between calls. The caller reads no logits, which after a
        pass that streamed the weights are in no cache of its own (a row of 32,000 took the
        engine thread ~65 us to scan, against ~15 us warm)."""
        if not 0 < columns <= self.args.vocab:
            raise ValueError(f"columns must be in [1, {self.args.vocab}], got {columns}")
        total = sum(num_logits)
        if self._greedy_logits.shape[0] < total:
            self._greedy_logits = torch.empty(total, self.args.vocab, dtype=torch.float32)
        self._run(token_ids, slots, start_positions, num_logits, self._greedy_logits, columns)
        return self._argmax[:total]

    def run_steps(
        self,
        token_ids: list[int],
        slots: list[int],
        start_positions: list[int],
        steps: int,
        columns: int,
        sampling: StepSampling | None = None,
        adjustments: LogitAdjustments | None = None,
        step_logits: torch.Tensor | None = None,
    ) -> list[list[int]] | None:
        """``steps`` one-token passes in one call: row b feeds ``token_ids[b]`` to slot ``slots[b]``
        at ``start_positions[b]``, then each pass's token one position on: its greedy token (over
        the first ``columns`` logits), or with ``sampling`` a sampled row's draw (``StepSampling``),
        from logits with ``adjustments`` (a logit bias and penalties). Each pass computes the logits
        ``forward_greedy`` of that one token would (the same bits), a draw what
        ``sampler.native_draws`` would draw from those logits with the columns past ``columns`` at
        -inf (as the engine masks them); the Python around a pass runs once for them all. Returns
        each pass's tokens, ``[step][row]``: fewer steps than asked where a sampled row had nothing
        to draw (a NaN or +inf logit, or none finite), the steps before it (none: that step is the
        caller's to run); None where a row's rotary tables depend on its length (dynamic NTK past
        the trained context), which takes one pass a call. ``step_logits``, a contiguous CPU
        float32 tensor (steps, rows, vocab), gets each pass's raw logits (before the adjustments
        and the sampling's masks: those a pass of ``forward`` would return), for logprobs."""
        rows = len(token_ids)
        if steps < 1 or rows < 1 or steps * rows > native.MAX_TOKENS:
            raise ValueError(
                f"steps x rows must be in [1, {native.MAX_TOKENS}], got {steps} x {rows}"
            )
        if not 0 < columns <= self.args.vocab:
            raise ValueError(f"columns must be in [1, {self.args.vocab}], got {columns}")
        if len(set(slots)) != rows:
            raise ValueError(f"each row of decode steps needs a slot of its own, got {slots}")
        longest = max(start_positions) + steps
        if longest > self.kv_cache.max_seq_len:
            raise ValueError(
                f"{steps} steps from position {max(start_positions)} pass the cache's "
                f"{self.kv_cache.max_seq_len} positions"
            )
        if step_logits is not None and (
            tuple(step_logits.shape) != (steps, rows, self.args.vocab)
            or step_logits.dtype != torch.float32
            or step_logits.device.type != "cpu"
            or not step_logits.is_contiguous()
        ):
            raise ValueError(
                f"step_logits must be a contiguous CPU float32 tensor of shape "
                f"{(steps, rows, self.args.vocab)}, got {step_logits.dtype} "
                f"{tuple(step_logits.shape)} on {step_logits.device}"
            )
        if self.model.rotary.tables(_CPU, torch.float32, longest) is None:
            return None
        if self._greedy_logits.shape[0] < rows:
            self._greedy_logits = torch.empty(rows, self.args.vocab, dtype=torch.float32)
        kept = adjusting = None
        try:  # (arguments refused half set are cleared too)
            kept = self._sampling_arguments(sampling, steps, rows)
            adjusting = adjustment_arguments(self.args, adjustments, rows)
            self.args.step_logits = None if step_logits is None else step_logits.data_ptr()
            self._run(
                [[t] for t in token_ids],
                slots,
                start_positions,
                [1] * rows,
                self._greedy_logits,
                columns,
                steps,
            )
        finally:
            del kept, adjusting
            self.args.step_uniforms = self.args.step_logits = None
            adjustment_arguments(self.args, None, rows)
        if (
            steps == 1 and sampling is None and adjustments is None and step_logits is None
        ):  # one pass: its tokens are forward_greedy's
            return [self._argmax[:rows]]
        done = self._steps_done.value
        flat = self._step_tokens[: done * rows]
        return [flat[s * rows : (s + 1) * rows] for s in range(done)]

    def _sampling_arguments(
        self, sampling: StepSampling | None, steps: int, rows: int
    ) -> list[torch.Tensor] | None:
        """Point the call's sampling arguments at ``sampling``'s tensors (checked, converted);
        returns them, to be kept alive through the call."""
        if sampling is None:
            self.args.step_uniforms = None
            return None
        uniforms = sampling.uniforms.to(torch.float64).contiguous()
        sampled = sampling.sampled.to(torch.uint8).contiguous()
        temperature, top_k, top_p, min_p = sampling.filters
        kept = [
            uniforms,
            sampled,
            temperature.to(torch.float32).contiguous(),
            top_k.to(torch.int64).contiguous(),
            top_p.to(torch.float32).contiguous(),
            min_p.to(torch.float32).contiguous(),
        ]
        if uniforms.shape != (steps, rows) or any(t.shape != (rows,) for t in kept[1:]):
            raise ValueError(
                f"sampled steps need uniforms of shape ({steps}, {rows}) and filters of ({rows},), "
                f"got {[tuple(t.shape) for t in kept]}"
            )
        if any(t.device.type != "cpu" for t in kept):
            raise ValueError("the native pass samples from CPU tensors")
        names = ("step_uniforms", "sampled_rows", "temperature", "top_k", "top_p", "min_p")
        for name, tensor in zip(names, kept, strict=True):
            setattr(self.args, name, tensor.data_ptr())
        return kept

    def _run(
        self,
        token_ids: list[list[int]],
        slots: list[int],
        start_positions: list[int],
        num_logits: list[int],
        logits: torch.Tensor,
        argmax_columns: int,
        steps: int = 1,
    ) -> None:
        """The pass, its logits into ``logits`` (at least sum(num_logits) rows) and, with
        ``argmax_columns``, its greedy tokens into ``self._argmax``; ``steps`` > 1: that many
        greedy passes (``run_steps``), their tokens into ``self._step_tokens``."""
        query_lens = [len(tokens) for tokens in token_ids]
        num_tokens = sum(query_lens)
        total_logits = sum(num_logits)
        if num_tokens > native.MAX_TOKENS or total_logits > native.MAX_TOKENS:
            raise ValueError(
                f"a native forward pass takes at most {native.MAX_TOKENS} tokens, got {num_tokens}"
            )
        args = self.args
        if num_tokens == len(token_ids) == total_logits:  # one token a row, each with logits
            ids = [tokens[0] for tokens in token_ids]
            positions = start_positions
            token_slots = slots
            logit_tokens = range(num_tokens)
        else:
            ids = [t for tokens in token_ids for t in tokens]
            positions, token_slots, logit_tokens = [], [], []
            for slot, start, length, count in zip(slots, start_positions, query_lens, num_logits):
                first = len(positions)
                positions.extend(range(start, start + length))
                token_slots.extend([slot] * length)
                logit_tokens.extend(range(first + length - count, first + length))
        if min(ids) < 0 or max(ids) >= args.vocab:
            raise ValueError(f"token ids must be in [0, {args.vocab}), got {ids}")
        # Kept ctypes arrays the C side points at, not tensors: at one token a step's Python work
        # is what is left, and after a pass every object it touches is out of the caches.
        self._ids[:num_tokens] = ids
        self._slots[:num_tokens] = token_slots
        self._positions[:num_tokens] = positions
        self._logit_tokens[:total_logits] = logit_tokens
        longest = max(s + n for s, n in zip(start_positions, query_lens)) + steps - 1
        tables = self.model.rotary.tables(_CPU, torch.float32, longest)
        if tables is None:  # computed per row: dynamic NTK scaling past the trained context
            tables = self.model.rotary(
                torch.tensor(positions),
                torch.float32,
                query_lens,
                [s + n - 1 for s, n in zip(start_positions, query_lens)],
            )
            tables = (tables[0].contiguous(), tables[1].contiguous())
            self._rope_rows[:num_tokens] = range(num_tokens)
            args.rope_rows = ctypes.addressof(self._rope_rows)
        else:
            args.rope_rows = args.positions
        threads = TEAM.size(torch.get_num_threads())
        self._cache_pointers()
        self._workspace(num_tokens, total_logits, threads)
        args.n_tokens = num_tokens
        args.n_logits = total_logits
        args.n_threads = threads
        args.cos = tables[0].data_ptr()
        args.sin = tables[1].data_ptr()
        args.logits = logits.data_ptr()
        args.argmax_cols = argmax_columns
        args.n_steps = steps
        slept = self._slept_ns.value
        start = time.perf_counter_ns()
        status = self.lib.brisk_forward_f32(ctypes.byref(args))
        TEAM.observe(threads, self._slept_ns.value - slept, time.perf_counter_ns() - start)
        if status != 0:
            raise RuntimeError(f"native forward pass refused its arguments (status {status})")
