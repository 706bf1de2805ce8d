"""GPTQLinear: an int4 linear layer over GPTQ tensors, converted at load to the kernel layout of its device.

Kernels (backend names):
  "native"         brisklm's native CPU kernels (brisklm.kernels.native: float32 products, the
                   bits of the float32 product over the dequantized weight; the whole forward
                   pass then runs through them too: brisklm.models.native_forward)
  "cpu"            torch's _weight_int4pack_mm_for_cpu (fast in bf16: the default compute dtype)
  "triton"         our fused Triton kernel (CUDA; triton_int4.py)
  "cuda_int4pack"  torch's _weight_int4pack_mm (CUDA, bf16): the baseline, and the fallback without triton
  "dense"          dequantized weight + F.linear: any device, any shape (the fallback of last resort)
"auto" takes "native" on CPU where the native kernels build (and no compute dtype but float32 is
asked for), else "cpu"; on CUDA the first of triton, cuda_int4pack and dense whose probe (one
small checked product in the model's dtype, once per device, compute dtype and model dtype)
passes, warning of each that fails.

Act-order: "native" looks up each input's group (g_idx) as it reads the input's weights, so the
activations stay in order. For the torch and Triton kernels the kernel columns are the input
columns sorted by group (argsort of g_idx); the
activations are permuted the same way at run time. The torch kernels take groups of 32..256 columns:
a GPTQ group maps onto the largest of those sizes whose blocks each lie in one GPTQ group, repeating
the group's scale (group_size -1 = one group over K becomes K/256 blocks of 256 with the same scale,
for K a multiple of 256). Shapes no kernel group fits (K not a multiple of 32, uneven groups) use
"dense", with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from brisklm.kernels import native
from brisklm.models import packed_weights

from . import triton_int4
from .gptq import quantize_rtn
from .gptq_format import (
    PACK_FACTOR,
    check_gptq_tensors,
    default_g_idx,
    dequantize_gptq,
    g_idx_or_default,
    unpack_qweight,
    unpack_qzeros,
)

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "native", "cpu", "triton", "cuda_int4pack", "dense")
KERNEL_GROUP_SIZES = (256, 128, 64, 32)  # what torch's int4 kernels accept, largest first
_GPTQ_BUFFERS = ("qweight", "qzeros", "scales", "g_idx")
_NATIVE_BUFFERS = ("codes", "zs", "group_at")  # native.Int4Weight's tensors


@dataclass(frozen=True)
class KernelLayout:
    """A GPTQ weight re-expressed for the int4 kernels: sorted columns, equal groups of 32..256."""

    q: torch.Tensor  # int32 [K, N] codes 0..15, rows in kernel column order
    scales: torch.Tensor  # float32 [K / group_size, N]
    zeros: torch.Tensor  # int32 [K / group_size, N], true zero points 0..15
    perm: torch.Tensor | None  # int64 [K]: kernel column j is input perm[j]; None = identity
    group_size: int


def kernel_layout(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    *,
    checkpoint_format: str = "gptq",
    group_sizes: tuple[int, ...] = KERNEL_GROUP_SIZES,
) -> KernelLayout | None:
    """Map GPTQ tensors onto equal kernel groups; None when no size in `group_sizes` fits."""
    num_in, _, num_groups = check_gptq_tensors(qweight, qzeros, scales, g_idx)
    groups = g_idx_or_default(g_idx, num_in, num_groups, device=qweight.device).long()
    q = unpack_qweight(qweight)  # (K, N)
    perm = None
    if bool((groups[1:] < groups[:-1]).any()):
        perm = torch.argsort(groups, stable=True)
        groups = groups[perm]
        q = q[perm]
    for size in group_sizes:
        if num_in % size:
            continue
        blocks = groups.view(-1, size)
        if bool((blocks == blocks[:, :1]).all()):
            block_group = blocks[:, 0]
            zeros = unpack_qzeros(qzeros, checkpoint_format=checkpoint_format)
            return KernelLayout(
                q=q,
                scales=scales.float()[block_group].contiguous(),
                zeros=zeros[block_group].contiguous(),
                perm=perm,
                group_size=size,
            )
    return None


# (device, compute dtype, model dtype) -> the first CUDA backend whose probe passed, or "dense"
# (see _working_backend).
_PROBED: dict[tuple[str, torch.dtype | None, torch.dtype], str] = {}


def _probe_backend(
    backend: str,
    device: torch.device,
    compute_dtype: torch.dtype | None,
    activation_dtype: torch.dtype = torch.bfloat16,
) -> None:
    """One small product through `backend` on `device`, of activations in the model's dtype,
    checked against the dequantized weight; raises (any exception) where the kernel cannot
    build, launch or compute it right."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 128, generator=generator)
    layer = GPTQLinear.from_float(
        weight,
        group_size=32,
        device=device,
        backend=backend,
        compute_dtype=compute_dtype,
        keep_gptq_tensors=True,
    )
    x = torch.randn(3, 128, generator=generator).to(device, activation_dtype)
    got = layer(x).float()
    want = F.linear(x.float(), layer.dequantize())
    error = (got - want).abs().max().item()
    if not error <= 0.05 * want.abs().max().item():  # NaN fails too
        raise RuntimeError(f"its product differs from the dequantized weight's by {error:.3g}")


def _working_backend(
    candidates: tuple[str, ...],
    device: torch.device,
    compute_dtype: torch.dtype | None,
    activation_dtype: torch.dtype = torch.bfloat16,
) -> str:
    """The first of `candidates` whose probe passes on `device` ("dense" when none does), probed
    once per device, compute dtype and activation dtype: triton may be installed yet unable to
    build or launch its kernel (no compiler for its launcher; bfloat16 products before Ampere,
    where float16 ones work), and torch's int4 CUDA kernel needs Ampere too."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (str(device), compute_dtype, activation_dtype)
    if key not in _PROBED:
        chosen = "dense"
        for backend in candidates:
            try:
                _probe_backend(backend, device, compute_dtype, activation_dtype)
            except Exception as error:  # a kernel that cannot run on this device: try the next
                logger.warning(
                    "GPTQ int4 backend %r does not work on %s (%s: %s); trying the next",
                    backend,
                    device,
                    type(error).__name__,
                    str(error).splitlines()[0][:200] if str(error) else "",
                )
                continue
            chosen = backend
            break
        _PROBED[key] = chosen
    return _PROBED[key]


_WARNED_SLOW: set[torch.dtype] = set()


def _warn_of_slow_cpu_kernel(compute_dtype: torch.dtype | None) -> None:
    """Once per dtype: torch's CPU int4 kernel in float16 or float32 is an order of magnitude
    slower than in bfloat16 (one 4096x4096 row: 20 and 18 ms against 1.6 ms)."""
    if compute_dtype not in (torch.float16, torch.float32) or compute_dtype in _WARNED_SLOW:
        return
    _WARNED_SLOW.add(compute_dtype)
    instead = (
        "leave int4_compute_dtype unset for brisklm's native kernels (float32, exact)"
        if compute_dtype == torch.float16 and native.available()
        else "int4_compute_dtype='bfloat16' is ~10x faster"
    )
    logger.warning(
        "GPTQ int4 on CPU computing in %s runs torch's int4 kernel, ~10x slower than in "
        "bfloat16; %s",
        str(compute_dtype).removeprefix("torch."),
        instead,
    )


def native_backend_chosen(
    requested: str, device: torch.device, compute_dtype: torch.dtype | None
) -> bool:
    """Whether a layer asking for backend ``requested`` on ``device`` computing in
    ``compute_dtype`` runs on the "native" backend (a request it cannot take raises at prepare)."""
    if requested not in ("auto", "native") or torch.device(device).type != "cpu":
        return False
    return compute_dtype in (None, torch.float32) and native.available()


def _select_backend(
    requested: str,
    device: torch.device,
    compute_dtype: torch.dtype | None = None,
    activation_dtype: torch.dtype | None = None,
) -> str:
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    if requested == "auto":
        if device.type == "cpu":
            if native_backend_chosen(requested, device, compute_dtype):
                return "native"
            _warn_of_slow_cpu_kernel(compute_dtype)
            return "cpu"
        if device.type == "cuda":
            candidates = ("triton",) if triton_int4.triton_available() else ()
            return _working_backend(
                (*candidates, "cuda_int4pack"),
                device,
                compute_dtype,
                activation_dtype or torch.bfloat16,  # CUDA's default model dtype
            )
        return "dense"
    if requested in ("cpu", "native") and device.type != "cpu":
        raise ValueError(f"backend {requested!r} needs a CPU device, got {device}")
    if requested == "native":
        if compute_dtype not in (None, torch.float32):
            raise ValueError(
                f"backend 'native' computes in float32, got compute_dtype {compute_dtype}"
            )
        if not native.available():
            raise RuntimeError(
                "backend 'native' needs brisklm's native CPU kernels, which are not available "
                "here (a C compiler, and BRISKLM_NATIVE_KERNELS not 0: see the log)"
            )
    if requested == "cuda_int4pack" and device.type != "cuda":
        raise ValueError(f"backend 'cuda_int4pack' needs a CUDA device, got {device}")
    if requested == "triton" and not triton_int4.triton_available():
        raise ImportError(
            "backend 'triton' needs triton: pip install 'brisklm[gpu]' (or pip install triton)"
        )
    return requested


class GPTQLinear(nn.Module):
    """y = x W^T + b with W stored as GPTQ int4 (qweight, qzeros, scales, g_idx; HF buffer names).

    Lifecycle: construct (meta device is fine) -> fill the buffers (load_state_dict(..., assign=True)
    or the from_* constructors) -> `prepare(device)` converts them to the chosen kernel's layout.
    By default `prepare` then drops the GPTQ tensors to keep int4 memory (about 4x less than bf16);
    pass keep_gptq_tensors=True to keep them for `forward_reference`, `dequantize` and state_dict.
    `forward` prepares on the activations' device if that has not been done.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group_size: int = 128,
        *,
        checkpoint_format: str = "gptq",
        device: torch.device | str | None = None,
        params_dtype: torch.dtype = torch.float16,
    ) -> None:
        super().__init__()
        if (
            in_features <= 0
            or in_features % PACK_FACTOR
            or out_features <= 0
            or out_features % PACK_FACTOR
        ):
            raise ValueError(
                f"in_features ({in_features}) and out_features ({out_features}) must be positive multiples of 8"
            )
        if group_size != -1 and group_size <= 0:
            raise ValueError(f"group_size must be -1 or positive, got {group_size}")
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(
                f"checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = group_size
        self.checkpoint_format = checkpoint_format
        size = in_features if group_size == -1 else group_size
        num_groups = -(-in_features // size)
        self.register_buffer(
            "qweight", torch.zeros(in_features // 8, out_features, dtype=torch.int32, device=device)
        )
        self.register_buffer(
            "qzeros", torch.zeros(num_groups, out_features // 8, dtype=torch.int32, device=device)
        )
        self.register_buffer(
            "scales", torch.zeros(num_groups, out_features, dtype=params_dtype, device=device)
        )
        self.register_buffer("g_idx", default_g_idx(in_features, size, device=device))
        if bias:
            self.register_buffer(
                "bias", torch.zeros(out_features, dtype=params_dtype, device=device)
            )
        else:
            self.bias: torch.Tensor | None = None
        self.backend: str | None = None  # set by prepare()
        self.int4: native.Int4Weight | None = None  # the "native" backend's weight
        self.kernel_group_size: int | None = None
        self.compute_dtype: torch.dtype | None = None
        self._device: torch.device | None = None
        self._num_out_padded = out_features

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_gptq_tensors(
        cls,
        qweight: torch.Tensor,
        qzeros: torch.Tensor,
        scales: torch.Tensor,
        g_idx: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        *,
        checkpoint_format: str = "gptq",
        device: torch.device | str | None = None,
        backend: str = "auto",
        compute_dtype: torch.dtype | None = None,
        keep_gptq_tensors: bool = False,
        group_size: int | None = None,
        activation_dtype: torch.dtype | None = None,
    ) -> GPTQLinear:
        """A prepared layer from one layer's checkpoint tensors (g_idx None = no act-order).

        ``group_size``: the checkpoint's, needed without ``g_idx`` when the last group is short.
        """
        num_in, num_out, num_groups = check_gptq_tensors(qweight, qzeros, scales, g_idx)
        g_idx = g_idx_or_default(g_idx, num_in, num_groups, group_size, qweight.device)
        if group_size is None:
            group_size = -1 if num_groups == 1 else -(-num_in // num_groups)
        layer = cls(
            num_in,
            num_out,
            bias is not None,
            group_size,
            checkpoint_format=checkpoint_format,
            device="meta",
            params_dtype=scales.dtype,
        )
        layer.qweight, layer.qzeros, layer.scales = qweight, qzeros, scales
        layer.g_idx = g_idx
        if bias is not None:
            if tuple(bias.shape) != (num_out,):
                raise ValueError(f"bias must be [{num_out}], got {tuple(bias.shape)}")
            layer.bias = bias
        target = device if device is not None else qweight.device
        return layer.prepare(
            target,
            backend=backend,
            compute_dtype=compute_dtype,
            keep_gptq_tensors=keep_gptq_tensors,
            activation_dtype=activation_dtype,
        )

    @classmethod
    def from_float(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        group_size: int = 128,
        sym: bool = True,
        device: torch.device | str | None = None,
        backend: str = "auto",
        compute_dtype: torch.dtype | None = None,
        keep_gptq_tensors: bool = False,
    ) -> GPTQLinear:
        """Quantize a float weight [N, K] with round-to-nearest (calibration-free) and prepare it."""
        result = quantize_rtn(weight, group_size=group_size, sym=sym)
        return cls.from_gptq_tensors(
            *result.tensors,
            bias=None if bias is None else bias.detach(),
            device=device if device is not None else weight.device,
            backend=backend,
            compute_dtype=compute_dtype,
            keep_gptq_tensors=keep_gptq_tensors,
        )

    # ------------------------------------------------------------------ conversion

    @torch.no_grad()
    def prepare(
        self,
        device: torch.device | str | None = None,
        *,
        backend: str = "auto",
        compute_dtype: torch.dtype | None = None,
        keep_gptq_tensors: bool = False,
        activation_dtype: torch.dtype | None = None,
    ) -> GPTQLinear:
        """Convert the GPTQ tensors to `backend`'s layout on `device` (default: where they are).

        compute_dtype: what the kernel computes in. "native" computes in float32 (exact products
        of the dequantized weight: the same bits as a float32 product over it). "cpu" and
        "cuda_int4pack" default to bfloat16
        (the CPU kernel is ~50x slower in fp32/fp16; the CUDA one only takes bf16); "cpu" also takes
        float32/float16, exact but slow (tests use float32 to check the layout exactly). "triton"
        computes in the activations' dtype unless given one (float32: exact products); "dense"
        defaults to bfloat16. `activation_dtype`: the model's, which "auto" tries the CUDA
        kernels in (default bfloat16).
        """
        if self.backend is not None:
            raise RuntimeError("GPTQLinear.prepare was already called")
        if self.qweight.device.type == "meta":
            raise RuntimeError(
                "GPTQLinear: load the GPTQ tensors (they are on the meta device) before prepare"
            )
        device = torch.device(device) if device is not None else self.qweight.device
        chosen = _select_backend(backend, device, compute_dtype, activation_dtype)
        for name in (*_GPTQ_BUFFERS, "bias"):
            tensor = getattr(self, name)
            if tensor is not None:
                setattr(self, name, tensor.to(device))
        layout = None
        if chosen not in ("native", "dense"):  # native reads g_idx as it is
            layout = kernel_layout(
                self.qweight,
                self.qzeros,
                self.scales,
                self.g_idx,
                checkpoint_format=self.checkpoint_format,
            )
        if layout is None and chosen not in ("native", "dense"):
            logger.warning(
                "GPTQLinear(%d -> %d): no int4 kernel group fits g_idx (in_features a multiple of 32 "
                "with groups aligned to 32 columns is needed); using a dequantized dense weight",
                self.in_features,
                self.out_features,
            )
            chosen = "dense"

        if chosen == "native":
            self._prepare_native()
        elif chosen == "cpu":
            self._prepare_cpu(layout, compute_dtype or torch.bfloat16)
        elif chosen == "cuda_int4pack":
            self._prepare_cuda_int4pack(layout, compute_dtype or torch.bfloat16)
        elif chosen == "triton":
            self._prepare_triton(layout, compute_dtype)
        else:
            self._prepare_dense(compute_dtype or torch.bfloat16)
        use_perm = layout is not None and layout.perm is not None and chosen != "dense"
        self.register_buffer(
            "_perm", layout.perm.to(device) if use_perm else None, persistent=False
        )
        # Added in float32: Qwen2's q/k/v biases reach ~100 while the products are ~1, and a
        # bfloat16 bias added to a bfloat16 product lost up to 0.8 (a float32 sum: 0.008).
        self.register_buffer(
            "_bias", None if self.bias is None else self.bias.float(), persistent=False
        )
        self.backend = chosen
        self._device = self.qweight.device  # concrete (cuda -> cuda:0), to compare with inputs
        if not keep_gptq_tensors:
            for name in _GPTQ_BUFFERS:
                setattr(self, name, None)
        return self

    def _padded_codes(
        self, layout: KernelLayout, multiple: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q as [N', K] and scales/zeros as [G, N'] with N' padded to `multiple` (padding rows give 0)."""
        q_nk = layout.q.t()
        scales, zeros = layout.scales, layout.zeros
        pad = -self.out_features % multiple
        if pad:
            q_nk = F.pad(q_nk, (0, 0, 0, pad), value=8)
            scales = F.pad(scales, (0, pad), value=0.0)
            zeros = F.pad(zeros, (0, pad), value=8)
        self._num_out_padded = self.out_features + pad
        return q_nk.contiguous(), scales, zeros

    @staticmethod
    def _scales_and_zeros(
        scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        # torch's int4 kernels compute w = (q - 8) * scale + zero_f; GPTQ's w = (q - z) * scale,
        # so zero_f = (8 - z) * scale.
        zero_f = (8 - zeros).float() * scales
        return torch.stack([scales, zero_f], dim=-1).to(dtype).contiguous()  # (G, N, 2)

    def _prepare_cpu(self, layout: KernelLayout, dtype: torch.dtype) -> None:
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"backend 'cpu' computes in bf16, fp16 or fp32, not {dtype}")
        q_nk, scales, zeros = self._padded_codes(layout, 16)  # the CPU packer needs N % 16 == 0
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q_nk, 1)
        self.register_buffer("_packed", packed, persistent=False)
        self.register_buffer(
            "_scales_zeros", self._scales_and_zeros(scales, zeros, dtype), persistent=False
        )
        self.kernel_group_size = layout.group_size
        self.compute_dtype = dtype

    def _prepare_native(self) -> None:
        g_idx = g_idx_or_default(
            self.g_idx, self.in_features, self.scales.shape[0], device=self.qweight.device
        )
        self.int4 = native.pack_int4(
            unpack_qweight(self.qweight),
            unpack_qzeros(self.qzeros, checkpoint_format=self.checkpoint_format),
            self.scales,
            g_idx,
        )
        # Buffers too (what the module holds, for state and memory accounting; _apply follows them).
        for name in _NATIVE_BUFFERS:
            self.register_buffer(f"_int4_{name}", getattr(self.int4, name), persistent=False)
        self.compute_dtype = torch.float32

    def _prepare_cuda_int4pack(self, layout: KernelLayout, dtype: torch.dtype) -> None:
        if dtype != torch.bfloat16:
            raise ValueError("backend 'cuda_int4pack' computes in bfloat16 only")
        inner_k_tiles = next((t for t in (8, 4, 2) if self.in_features % (t * 16) == 0), None)
        if inner_k_tiles is None:
            raise ValueError(
                f"backend 'cuda_int4pack' needs in_features % 32 == 0, got {self.in_features}"
            )
        q_nk, scales, zeros = self._padded_codes(layout, 16)
        # Since torch 2.5 the CUDA packer takes uint8 [N, K/2] with input 2i in the high nibble.
        q_u8 = ((q_nk[:, ::2] << 4) | q_nk[:, 1::2]).to(torch.uint8)
        packed = torch.ops.aten._convert_weight_to_int4pack(q_u8, inner_k_tiles)
        self.register_buffer("_packed", packed, persistent=False)
        self.register_buffer(
            "_scales_zeros", self._scales_and_zeros(scales, zeros, dtype), persistent=False
        )
        self.kernel_group_size = layout.group_size
        self.compute_dtype = dtype

    def _prepare_triton(self, layout: KernelLayout, dtype: torch.dtype | None) -> None:
        # The kernel reads scales as stored (fp16 in checkpoints): no precision lost at load.
        scales = layout.scales.to(self.scales.dtype)
        weight = triton_int4.make_triton_weight(
            layout.q, scales, layout.zeros, layout.perm, layout.group_size
        )
        self._triton_weight = weight
        self.kernel_group_size = layout.group_size
        self.compute_dtype = dtype  # None: the activations' dtype

    def _prepare_dense(self, dtype: torch.dtype) -> None:
        weight = self.dequantize(dtype)
        self._dense_packed = None
        if weight.device.type == "cpu" and packed_weights.packing_supported(dtype):
            # oneDNN's packed product gives each row the same bits whatever the row count (MKL's
            # F.linear does not), which keeps seeded sampling independent of the batch.
            self._dense_packed = packed_weights.pack(weight)
            weight = None
        self.register_buffer("_dense_weight", weight, persistent=False)
        self.compute_dtype = dtype

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        # model.to(dtype) / .half() must not recast this layer's tensors: fp16 scales would lose bits
        # in bf16, and the kernels' scales must stay in their compute dtype. Follow device moves only.
        def move_only(tensor: torch.Tensor) -> torch.Tensor:
            moved = fn(tensor)
            return moved if moved.dtype == tensor.dtype else tensor.to(moved.device)

        result = super()._apply(move_only, recurse)
        if self.int4 is not None:  # the C side's struct over the buffers as they now are
            tensors = [getattr(self, f"_int4_{name}") for name in _NATIVE_BUFFERS]
            if any(t is not getattr(self.int4, name) for t, name in zip(tensors, _NATIVE_BUFFERS)):
                self.int4 = native.Int4Weight(*tensors, self.out_features)
        return result

    # ------------------------------------------------------------------ running

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend is None:
            self.prepare(x.device, activation_dtype=x.dtype)  # (auto's CUDA probe runs in it)
        if x.device != self._device:
            raise RuntimeError(
                f"GPTQLinear was prepared for {self._device}, got input on {x.device}"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected last dim {self.in_features}, got {tuple(x.shape)}")
        rows = x.reshape(-1, self.in_features)  # (M, K)
        if self.backend == "native":
            assert self.int4 is not None
            y = native.linear_int4(rows.float(), self.int4, self._bias)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.backend == "dense":
            if self._dense_packed is not None:
                y = packed_weights.packed_linear(
                    rows.to(self.compute_dtype), self._dense_packed, None
                )
            else:
                y = F.linear(rows.to(self.compute_dtype), self._dense_weight)
        elif self.backend == "triton":
            # The kernel computes in its input's dtype (float32: exact products of the weight).
            if self.compute_dtype is not None:
                xk = rows.to(self.compute_dtype)
            elif rows.dtype in (torch.float16, torch.bfloat16, torch.float32):
                xk = rows
            else:
                xk = rows.float()
            y = triton_int4.int4_matmul(xk, self._triton_weight)
        else:
            xk = rows.to(self.compute_dtype)
            # index_select returns a contiguous copy, which the torch kernels require.
            xk = xk.index_select(1, self._perm) if self._perm is not None else xk.contiguous()
            if self.backend == "cpu":
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                    xk, self._packed, self.kernel_group_size, self._scales_zeros
                )
            else:
                y = torch.ops.aten._weight_int4pack_mm(
                    xk, self._packed, self.kernel_group_size, self._scales_zeros
                )
            if self._num_out_padded != self.out_features:
                y = y[:, : self.out_features]
        if self._bias is not None:
            y = y.float() + self._bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def _require_gptq_tensors(self, what: str) -> None:
        if self.qweight is None:
            raise RuntimeError(
                f"GPTQLinear.{what} needs the GPTQ tensors: prepare(..., keep_gptq_tensors=True)"
            )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [N, K] the int4 tensors stand for (plain-torch reference)."""
        self._require_gptq_tensors("dequantize")
        return dequantize_gptq(
            self.qweight,
            self.qzeros,
            self.scales,
            self.g_idx,
            checkpoint_format=self.checkpoint_format,
            dtype=dtype,
        )

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize, then F.linear in float32: the reference every kernel is tested against."""
        self._require_gptq_tensors("forward_reference")
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.dequantize(), bias).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"group_size={self.group_size}, backend={self.backend}, kernel_group_size={self.kernel_group_size}"
        )
