"""GPTQMergedLinear: the int4 counterpart of models.layers.Linear, filled shard by shard from a GPTQ checkpoint.

The model merges q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``; a GPTQ checkpoint
stores each of them as its own quantized layer. qweight is packed along K and qzeros along N, so
shards concatenate along N (qweight, qzeros and scales on dim 1, bias on dim 0) into one int4
matmul, provided they share one g_idx. They do whenever the shards were quantized with one Hessian
(every GPTQ tool quantizes q/k/v from the same inputs, so act-order sorts their columns alike).
When they do not, each shard keeps its own kernel and the outputs are concatenated: correct,
just one matmul per shard.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from .gptq_format import PACK_FACTOR, default_g_idx
from .int4_linear import GPTQLinear

logger = logging.getLogger(__name__)

_TENSOR_NAMES = ("qweight", "qzeros", "scales", "g_idx", "bias")


class GPTQMergedLinear(nn.Module):
    """One or more GPTQ int4 layers on the same input, run as one concatenated output.

    Lifecycle (driven by the loader): built on the meta device with no tensors -> ``load_tensor``
    for each checkpoint tensor of each shard -> ``finalize()`` converts everything to the kernel
    layout of ``device`` (``GPTQLinear.prepare``) and drops the checkpoint tensors.
    ``g_idx`` is optional (a checkpoint without act-order may omit it: default order) unless
    ``g_idx_required`` (act-order groups, which no default reproduces), and so is
    ``bias`` on a layer without one: auto-gptq writes zero biases for every layer (used if non-zero,
    as auto-gptq's own layer would).
    """

    def __init__(
        self,
        in_features: int,
        out_features: Sequence[int],
        bias: bool,
        *,
        group_size: int,
        checkpoint_format: str,
        name: str,
        device: torch.device | str,
        backend: str = "auto",
        compute_dtype: torch.dtype | None = None,
        g_idx_required: bool = False,
        activation_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.shard_sizes = tuple(out_features)
        self.out_features = sum(self.shard_sizes)
        bad = [size for size in (in_features, *self.shard_sizes) if size <= 0 or size % PACK_FACTOR]
        if bad:
            raise ValueError(
                f"{name}: GPTQ int4 needs in/out features that are positive multiples of "
                f"{PACK_FACTOR}, got in_features={in_features}, out_features={list(self.shard_sizes)}"
            )
        self.has_bias = bias
        self.group_size = group_size
        self.num_groups = 1 if group_size == -1 else -(-in_features // group_size)
        self.checkpoint_format = checkpoint_format
        self.name = name
        self.device = torch.device(device)
        self.backend = backend
        self.compute_dtype = compute_dtype
        self.activation_dtype = activation_dtype  # the model's dtype (the CUDA kernels' probe)
        self.g_idx_required = g_idx_required
        self._pending: dict[tuple[str, int], torch.Tensor] = {}
        self.parts = nn.ModuleList()  # filled by finalize(): one GPTQLinear, or one per shard

    # ------------------------------------------------------------------ loading

    def expected_tensors(self) -> list[str]:
        required = ["g_idx"] if self.g_idx_required else []
        return ["qweight", "qzeros", "scales", *required] + (["bias"] if self.has_bias else [])

    def optional_tensors(self) -> list[str]:
        return ([] if self.g_idx_required else ["g_idx"]) + ([] if self.has_bias else ["bias"])

    def _expected_shape(self, name: str, shard: int) -> tuple[tuple[int, ...], str]:
        size = self.shard_sizes[shard]
        return {
            "qweight": ((self.in_features // PACK_FACTOR, size), "int32"),
            "qzeros": ((self.num_groups, size // PACK_FACTOR), "int32"),
            "scales": ((self.num_groups, size), "float"),
            "g_idx": ((self.in_features,), "int"),
            "bias": ((size,), "float"),
        }[name]

    def load_tensor(self, name: str, tensor: torch.Tensor, shard: int | None, source: str) -> None:
        """Keep one checkpoint tensor of one shard until ``finalize``; shapes and dtypes are checked now."""
        if self.parts:
            raise RuntimeError(f"{source}: {self.name} is already finalized")
        if name not in _TENSOR_NAMES:
            raise ValueError(f"{source}: unexpected tensor {name!r} for a GPTQ int4 layer")
        index = 0 if shard is None else shard
        shape, kind = self._expected_shape(name, index)
        dtype_ok = {
            "int32": tensor.dtype == torch.int32,
            "int": not tensor.dtype.is_floating_point and tensor.dtype != torch.bool,
            "float": tensor.dtype.is_floating_point,
        }[kind]
        if tuple(tensor.shape) != shape or not dtype_ok:
            hint = ""
            if name in ("qzeros", "scales") and tensor.dim() == 2 and tensor.shape[0] != shape[0]:
                hint = (
                    f" ({tensor.shape[0]} groups where group_size={self.group_size} over "
                    f"{self.in_features} inputs gives {shape[0]}: does the quantization config "
                    "match the tensors?)"
                )
            raise ValueError(
                f"{source}: expected {kind} {shape} for a GPTQ layer of {self.in_features} inputs "
                f"and {self.shard_sizes[index]} outputs, got {tensor.dtype} {tuple(tensor.shape)}{hint}"
            )
        if (
            name == "g_idx"
            and tensor.numel()
            and not (0 <= int(tensor.min()) and int(tensor.max()) < self.num_groups)
        ):
            raise ValueError(
                f"{source}: g_idx values must lie in [0, {self.num_groups}) (the groups of "
                f"group_size={self.group_size} over {self.in_features} inputs), got "
                f"[{int(tensor.min())}, {int(tensor.max())}]: does the quantization config "
                "match the tensors?"
            )
        self._pending[(name, index)] = tensor

    @torch.no_grad()
    def finalize(self) -> None:
        """Concatenate the shards and convert them to the kernel layout of ``self.device``."""
        if self.parts:
            return
        try:
            self._build()
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None
        self._pending.clear()

    def _build(self) -> None:
        num_shards = len(self.shard_sizes)
        shards = range(num_shards)
        group = self.in_features if self.group_size == -1 else self.group_size
        g_idx = [self._pending.get(("g_idx", i)) for i in shards]
        g_idx = [
            default_g_idx(self.in_features, group) if g is None else g.to(torch.int32)
            for g in g_idx
        ]
        bias = self._merged_bias()
        common = dict(
            checkpoint_format=self.checkpoint_format,
            device=self.device,
            backend=self.backend,
            compute_dtype=self.compute_dtype,
            activation_dtype=self.activation_dtype,
        )
        if all(torch.equal(g_idx[0], g) for g in g_idx[1:]):
            qweight, qzeros, scales = (
                torch.cat([self._pending[(name, i)] for i in shards], dim=1)
                for name in ("qweight", "qzeros", "scales")
            )
            self.parts.append(
                GPTQLinear.from_gptq_tensors(qweight, qzeros, scales, g_idx[0], bias, **common)
            )
            return
        logger.info(
            "%s: the %d shards have different g_idx; running one int4 matmul per shard",
            self.name,
            num_shards,
        )
        offsets = [0]
        for size in self.shard_sizes:
            offsets.append(offsets[-1] + size)
        for i in shards:
            part_bias = None if bias is None else bias[offsets[i] : offsets[i + 1]]
            self.parts.append(
                GPTQLinear.from_gptq_tensors(
                    self._pending[("qweight", i)],
                    self._pending[("qzeros", i)],
                    self._pending[("scales", i)],
                    g_idx[i],
                    part_bias,
                    **common,
                )
            )

    def _merged_bias(self) -> torch.Tensor | None:
        biases = [self._pending.get(("bias", i)) for i in range(len(self.shard_sizes))]
        if all(b is None for b in biases):
            return None
        merged = torch.cat(
            [
                torch.zeros(size, dtype=torch.float32) if b is None else b.float()
                for b, size in zip(biases, self.shard_sizes)
            ]
        )
        if not self.has_bias and not bool(merged.any()):
            return None  # auto-gptq's placeholder zeros: nothing to add
        return merged

    # ------------------------------------------------------------------ running

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.parts:
            raise RuntimeError(f"{self.name}: GPTQ layer used before its tensors were loaded")
        if len(self.parts) == 1:
            return self.parts[0](x)
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={list(self.shard_sizes)}, "
            f"group_size={self.group_size}, format={self.checkpoint_format}"
        )
