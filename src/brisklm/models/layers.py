"""Building blocks of Llama-family networks: RMSNorm, (merged) linear layers and the gated MLP."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from brisklm.kernels import native
from brisklm.models import packed_weights


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as transformers' LlamaRMSNorm does."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self._shape = (hidden_size,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self._shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self._shape, None, self.eps).to(x.dtype)


class WeightLoadable(Protocol):
    """What the loader needs of a layer whose checkpoint tensors may arrive in several shards."""

    def load_tensor(
        self, name: str, tensor: torch.Tensor, shard: int | None, source: str
    ) -> None: ...


class Linear(nn.Module):
    """A dense linear layer whose output may be the concatenation of several checkpoint layers.

    ``out_features`` lists the output sizes of the shards (e.g. q, k, v). Merging them turns three
    small matmuls into one, which matters at batch 1 where every kernel launch and Python op counts.
    """

    def __init__(
        self,
        in_features: int,
        out_features: Sequence[int],
        bias: bool,
        pack_on_cpu: bool = True,
        min_pack_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.shard_sizes = tuple(out_features)
        self.out_features = sum(self.shard_sizes)
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None
        )
        # False when the weight is shared with an embedding table, whose rows must stay contiguous:
        # finalize then leaves the shared tensor alone (packing makes a separate copy).
        self.relayout_on_cpu = True
        # False where the weight must stay a strided tensor after loading (the quantizer rewrites it).
        self.pack_on_cpu = pack_on_cpu
        # Smallest weight packed; None: packed_weights' default for the dtype (0 packs every size).
        self.min_pack_bytes = min_pack_bytes
        self.is_packed = False
        # Packed at load into the native kernels' panel layout (set for models that run through
        # them: see brisklm.models.native_forward); then every product runs there.
        self.native_pack = False
        self.is_native_packed = False
        offsets = [0]
        for size in self.shard_sizes:
            offsets.append(offsets[-1] + size)
        self._offsets = tuple(offsets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_packed:
            return packed_weights.packed_linear(x, self.weight, self.bias)
        if self.is_native_packed:
            rows = x.reshape(-1, self.in_features)
            out = native.linear(rows, self.weight, self.bias, self.out_features)
            return out.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)

    def __deepcopy__(self, memo: dict[int, object]) -> Linear:
        """A deep copy; a packed weight (opaque to ``copy``) is copied through its strided form."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            if key == "_parameters":
                value = type(value)(
                    (name, self._copy_parameter(param, memo)) for name, param in value.items()
                )
                clone.__dict__[key] = value
            else:
                clone.__dict__[key] = copy.deepcopy(value, memo)
        return clone

    @staticmethod
    def _copy_parameter(param: torch.Tensor | None, memo: dict[int, object]) -> object:
        if param is None or not param.is_mkldnn:
            return copy.deepcopy(param, memo)
        packed = packed_weights.pack(packed_weights.unpack(param))
        return nn.Parameter(packed, requires_grad=False)

    def dense_weight(self) -> torch.Tensor:
        """The (out, in) weight as a strided tensor, whatever layout ``finalize`` chose."""
        if self.is_native_packed:
            return native.unpack(self.weight, self.out_features)
        return packed_weights.unpack(self.weight) if self.is_packed else self.weight

    def shard_rows(self, shard: int | None) -> slice:
        if shard is None:
            return slice(0, self.out_features)
        return slice(self._offsets[shard], self._offsets[shard + 1])

    def load_tensor(self, name: str, tensor: torch.Tensor, shard: int | None, source: str) -> None:
        """Copy a checkpoint tensor (``weight`` or ``bias``) into its rows of the merged parameter."""
        param = getattr(self, name, None)
        if not isinstance(param, torch.Tensor):
            raise ValueError(f"{source}: unexpected tensor {name!r} for a linear layer")
        target = param.data[self.shard_rows(shard)]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"{source}: shape {tuple(tensor.shape)} does not match the model's {tuple(target.shape)}"
            )
        target.copy_(tensor)

    def expected_tensors(self) -> list[str]:
        return ["weight"] + (["bias"] if self.bias is not None else [])

    def finalize(self) -> None:
        """Lay the weight out for the fastest matmul on its device (called once after loading).

        On CPU the weight is packed into oneDNN's blocked layout when this machine supports it for
        the dtype (see ``brisklm.models.packed_weights``: 1.7x faster decode products than MKL in
        float32 at one row, 3x at eight, and each row's result independent of the row count;
        ``min_pack_bytes`` can leave small weights strided). Otherwise a float32 weight is stored column-major, as the
        transposed view of an (in, out) contiguous matrix, which F.linear streams as a plain
        row-major GEMM operand, about 30% faster at decode batch sizes than the (out, in) row
        layout (measured: 23.6 vs 17.9 GB/s over a 125M-parameter model's weights). Half-precision
        weights keep the row layout: column-major halves bfloat16's speed and makes float16 ~100x
        slower (0.4 vs 54 GB/s at one row, 256 MB weight). Values are unchanged either way;
        ``dense_weight()`` gives the strided matrix back.
        """
        weight = self.weight
        if weight.device.type != "cpu" or self.is_packed or self.is_native_packed:
            return
        if self.native_pack and weight.dtype in native.WEIGHT_TYPES:
            # A head tied to the embedding table gets a packed copy, as with oneDNN below.
            self.weight = nn.Parameter(native.pack(weight.data), requires_grad=False)
            self.is_native_packed = True
            return
        if (
            self.pack_on_cpu
            and packed_weights.worth_packing(weight, self.min_pack_bytes)
            and packed_weights.packing_supported(weight.dtype)
        ):
            # Packing makes a new tensor, so a head tied to the embedding table gets a packed copy
            # and the table stays as it is: one more table in memory for a 1.7-2.7x faster head
            # (row-major F.linear reads the table at a third of the packed product's speed).
            self.weight = nn.Parameter(packed_weights.pack(weight.data), requires_grad=False)
            self.is_packed = True
        elif self.relayout_on_cpu and weight.dtype == torch.float32 and weight.is_contiguous():
            weight.data = weight.data.t().contiguous().t()


class LinearFactory(Protocol):
    """Makes the linear layers of a model; quantized checkpoints supply a factory of int4 layers."""

    def __call__(
        self, in_features: int, out_features: Sequence[int], bias: bool, prefix: str
    ) -> nn.Module: ...


def dense_linear(
    in_features: int, out_features: Sequence[int], bias: bool, prefix: str
) -> nn.Module:
    """The default factory: plain dense weights (packed for the CPU's matmul kernels when loaded)."""
    del prefix
    return Linear(in_features, out_features, bias)


def strided_dense_linear(
    in_features: int, out_features: Sequence[int], bias: bool, prefix: str
) -> nn.Module:
    """Dense weights that stay strided tensors after loading, for code that reads or rewrites them."""
    del prefix
    return Linear(in_features, out_features, bias, pack_on_cpu=False)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up merged into one matmul."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        make_linear: LinearFactory,
        prefix: str,
    ) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = make_linear(
            hidden_size, [intermediate_size, intermediate_size], bias, f"{prefix}.gate_up_proj"
        )
        self.down_proj = make_linear(intermediate_size, [hidden_size], bias, f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor, row_invariant: bool = False) -> torch.Tensor:
        """``row_invariant``: each row's result bit for bit as alone (``silu_mul``; a pass that
        holds a seeded request)."""
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        if row_invariant:
            return self.down_proj(silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)


# The most elements torch's CPU elementwise ops take on one thread (at::internal::GRAIN_SIZE).
ELEMENTWISE_GRAIN = 32768


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, each row computed bit for bit as it is alone (what a seeded request's
    row needs: ``ForwardBatch.row_invariant``). Past ``ELEMENTWISE_GRAIN`` elements torch splits
    an elementwise op between its CPU threads at points set by the total, and the elements before
    a split point take its scalar loop, whose exp rounds otherwise than the vectorised one (~1e-6
    on a row's logits): on CPU the rows go in calls of at most that many elements (a row alone
    above it: split alike however many rows run), each on one thread: ~2x the time of one call
    on two threads (512 rows of 11,008: 43 against 20 ms), so only passes that need it. Rows
    laid end to end in both (not the model's halves of one matmul's output) are one run to
    torch's loop, whose vector steps cross rows and whose scalar tail falls in the last row:
    those go a row a call."""
    if gate.device.type != "cpu":
        return F.silu(gate) * up
    shape, width = gate.shape, gate.shape[-1]
    gate, up = gate.reshape(-1, width), up.reshape(-1, width)  # (views: the rows of a pass)
    rows = gate.shape[0]
    one_run = rows > 1 and gate.is_contiguous() and up.is_contiguous()
    step = 1 if one_run else max(1, ELEMENTWISE_GRAIN // width)
    if step >= rows:
        return (F.silu(gate) * up).reshape(shape)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        parts = [F.silu(gate[i : i + step]) * up[i : i + step] for i in range(0, rows, step)]
        return torch.cat(parts).reshape(shape)
    out = torch.empty(rows, width, dtype=torch.result_type(gate, up))
    for i in range(0, rows, step):
        torch.mul(F.silu(gate[i : i + step]), up[i : i + step], out=out[i : i + step])
    return out.reshape(shape)
