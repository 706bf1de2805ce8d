"""GPTQ (Frantar et al., 2022) for one linear layer, and round-to-nearest (RTN) for comparison.

Both return GPTQ v1 tensors (the format every loader reads) plus the dequantized float weight, so a
model-level driver can put the quantized weight back and let later layers see its effect.
Memory: one float32 Hessian [K, K] per input space (a fused q/k/v shares one), plus a copy of the
weight being quantized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .gptq_format import GPTQTensors, default_g_idx, pack_gptq

MAXQ = 15  # int4
_SYM_ZERO = (MAXQ + 1) // 2  # 8, as auto-gptq and GPTQModel store symmetric zeros
_FP16_MIN = 2.0**-24  # smallest positive fp16 (subnormal): scales are stored in fp16
_FP16_MAX = 65504.0


@dataclass(frozen=True)
class QuantizedWeight:
    """One quantized weight: its GPTQ v1 tensors and what they dequantize to."""

    tensors: GPTQTensors  # qweight, qzeros (v1), scales (fp16), g_idx
    dequantized: torch.Tensor  # float32 [N, K], equal to dequantize_gptq(*tensors)
    loss: float  # GPTQ's objective: sum of squared rounding errors weighted by 1/Hinv_kk^2, halved


def _check_group_size(group_size: int, in_features: int) -> int:
    """Effective group size (-1 -> all of K)."""
    if group_size == -1:
        return in_features
    if group_size <= 0:
        raise ValueError(f"group_size must be -1 or positive, got {group_size}")
    return group_size


def group_params(w: torch.Tensor, *, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row scale and integer zero for the columns w [N, C], as the GPTQ reference code finds them.

    The range always includes 0. Scales are rounded to fp16 here, since that is what a checkpoint
    stores, so the rounding (and GPTQ's error feedback) sees the weights a loader will compute.
    Asymmetric zeros lie in 1..15, never 0, because GPTQ v1 stores zero - 1 in a nibble: when the
    range starts at 0 the scale grows so that [-scale, 14 * scale] still covers it.
    Symmetric: zero 8 and scale 2 * max|w| / 15, the reference convention.
    """
    w = w.float()
    xmin = torch.clamp(w.min(dim=1).values, max=0.0)
    xmax = torch.clamp(w.max(dim=1).values, min=0.0)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -1.0, xmin)
    xmax = torch.where(empty, 1.0, xmax)
    scale = _to_fp16_grid((xmax - xmin) / MAXQ)
    if sym:
        zero = torch.full_like(scale, float(_SYM_ZERO))
        return scale, zero
    zero = torch.clamp(torch.round(-xmin / scale), 0, MAXQ)
    at_zero = zero == 0
    scale = torch.where(at_zero, _to_fp16_grid(torch.maximum(scale, xmax / (MAXQ - 1))), scale)
    zero = torch.where(at_zero, 1.0, zero)
    return scale, zero


def _to_fp16_grid(scale: torch.Tensor) -> torch.Tensor:
    return scale.clamp(_FP16_MIN, _FP16_MAX).to(torch.float16).float().clamp_min(_FP16_MIN)


def quantize_columns(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Integer codes 0..15 for w [N, C] (or [N]) with per-row scale/zero [N]."""
    if w.dim() == 2:
        scale, zero = scale[:, None], zero[:, None]
    return torch.clamp(torch.round(w / scale) + zero, 0, MAXQ)


def quantize_rtn(
    weight: torch.Tensor, *, group_size: int = 128, sym: bool = True
) -> QuantizedWeight:
    """Round-to-nearest with the same grid as GPTQ (for comparison, and calibration-free quantization)."""
    w = weight.detach().float()
    num_out, num_in = w.shape
    size = _check_group_size(group_size, num_in)
    q = torch.empty_like(w)
    scales, zeros = [], []
    for start in range(0, num_in, size):
        cols = slice(start, start + size)
        scale, zero = group_params(w[:, cols], sym=sym)
        q[:, cols] = quantize_columns(w[:, cols], scale, zero)
        scales.append(scale)
        zeros.append(zero)
    return _finish(
        q, torch.stack(scales), torch.stack(zeros), default_g_idx(num_in, size, w.device), 0.0
    )


class GPTQ:
    """Hessian accumulator and GPTQ solver for one input space.

    >>> gptq = GPTQ(layer.weight)          # or GPTQ(in_features=K) for a shared input
    >>> for x in calibration_inputs: gptq.add_batch(x)   # x [..., K], the layer's input
    >>> result = gptq.quantize(group_size=128, act_order=True)
    Several weights reading the same input (q/k/v, gate/up) share one Hessian: call
    `quantize(weight)` once per weight; the accumulated Hessian is never modified.
    """

    def __init__(
        self,
        layer_weight: torch.Tensor | None = None,
        *,
        in_features: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if layer_weight is None and in_features is None:
            raise ValueError("GPTQ needs layer_weight or in_features")
        if layer_weight is not None:
            if layer_weight.dim() != 2:
                raise ValueError(
                    f"layer_weight must be [out_features, in_features], got {tuple(layer_weight.shape)}"
                )
            in_features = layer_weight.shape[1]
            device = device if device is not None else layer_weight.device
        assert in_features is not None
        self.weight = layer_weight
        self.in_features = in_features
        self.hessian = torch.zeros(in_features, in_features, dtype=torch.float32, device=device)
        self.num_samples = 0

    @torch.no_grad()
    def add_batch(self, x: torch.Tensor) -> None:
        """Fold in calibration activations x [..., K]: H = 2 X^T X / n over all rows seen so far."""
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"add_batch: expected last dim {self.in_features}, got {tuple(x.shape)}"
            )
        rows = x.reshape(-1, self.in_features).to(device=self.hessian.device, dtype=torch.float32)
        count = rows.shape[0]
        if count == 0:
            return
        # Running mean, as the reference code keeps it, so H stays O(1) however many rows come in.
        self.hessian *= self.num_samples / (self.num_samples + count)
        self.num_samples += count
        rows = rows * math.sqrt(2.0 / self.num_samples)
        self.hessian.addmm_(rows.t(), rows)

    def quantize(
        self,
        weight: torch.Tensor | None = None,
        *,
        group_size: int = 128,
        sym: bool = True,
        act_order: bool = False,
        static_groups: bool = False,
        percdamp: float = 0.01,
        block_size: int = 128,
    ) -> QuantizedWeight:
        """Quantize `weight` [N, K] (default: the layer weight given at construction) with this Hessian."""
        weight = self.weight if weight is None else weight
        if weight is None:
            raise ValueError("quantize: no weight given and none at construction")
        if weight.dim() != 2 or weight.shape[1] != self.in_features:
            raise ValueError(
                f"quantize: weight must be [N, {self.in_features}], got {tuple(weight.shape)}"
            )
        if self.num_samples == 0:
            raise ValueError(
                "quantize: no calibration data; call add_batch first (or use quantize_rtn)"
            )
        return gptq_quantize(
            weight,
            self.hessian,
            group_size=group_size,
            sym=sym,
            act_order=act_order,
            static_groups=static_groups,
            percdamp=percdamp,
            block_size=block_size,
        )

    def free(self) -> None:
        """Drop the Hessian (a model-level driver calls this once a layer is done)."""
        self.hessian = torch.empty(0)
        self.weight = None


@torch.no_grad()
def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    *,
    group_size: int = 128,
    sym: bool = True,
    act_order: bool = False,
    static_groups: bool = False,
    percdamp: float = 0.01,
    block_size: int = 128,
) -> QuantizedWeight:
    """GPTQ on weight [N, K] with Hessian [K, K]; follows the paper's reference `fasterquant`.

    Columns are rounded one at a time, each rounding error spread over the not-yet-rounded columns
    through the upper Cholesky factor of H^-1 (lazy batch updates per `block_size` columns).
    With `act_order` columns go in order of decreasing H_kk; groups are then formed in that order
    (g_idx is a permutation of k // group_size) unless `static_groups`, which fixes the groups on the
    original column order first (g_idx = k // group_size, friendlier to kernels).
    Group scale/zero are found when the group's first column comes up, on the columns' current
    (error-updated) values. The reference code reads them from W, which misses the current block's
    pending lazy update when a group starts inside a block; we apply it, so the result equals the
    plain column-by-column algorithm for any block_size (the two agree when blocks align with groups).
    """
    if not 0.0 <= percdamp < 1.0:
        raise ValueError(f"percdamp must be in [0, 1), got {percdamp}")
    w = weight.detach().to(device=hessian.device, dtype=torch.float32).clone()
    num_out, num_in = w.shape
    size = _check_group_size(group_size, num_in)
    h = hessian.to(torch.float32).clone()

    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0

    static_params: list[tuple[torch.Tensor, torch.Tensor]] = []
    if static_groups:
        static_params = [group_params(w[:, s : s + size], sym=sym) for s in range(0, num_in, size)]

    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(h), descending=True, stable=True)
        w = w[:, perm]
        h = h[perm][:, perm]

    hinv = _inverse_cholesky_upper(h, percdamp)
    # A host copy of the order: no GPU sync per column.
    source_column = perm.tolist() if perm is not None else range(num_in)

    q = torch.zeros_like(w)
    losses = torch.zeros(num_out, device=w.device)
    scales: list[torch.Tensor] = []
    zeros: list[torch.Tensor] = []
    scale = zero = torch.empty(0)
    for i1 in range(0, num_in, block_size):
        i2 = min(i1 + block_size, num_in)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if static_groups:
                scale, zero = static_params[source_column[col] // size]
            elif col % size == 0:
                # Current values of the group's columns: this block's are in w1; later ones are in
                # w, still missing this block's pending (lazy) update, which we apply here.
                ahead = w[:, i2 : col + size]
                if ahead.shape[1]:
                    ahead = ahead - err1[:, :i] @ hinv[i1 : i1 + i, i2 : col + size]
                current = torch.cat([w1[:, i : i + size], ahead], dim=1)
                scale, zero = group_params(current, sym=sym)
                scales.append(scale)
                zeros.append(zero)
            wcol = w1[:, i]
            d = hinv1[i, i]
            qcol = quantize_columns(wcol, scale, zero)
            q[:, col] = qcol
            deq = scale * (qcol - zero)
            losses += (wcol - deq) ** 2 / d**2 / 2
            err = (wcol - deq) / d
            w1[:, i:] -= err[:, None] * hinv1[i, i:][None, :]
            err1[:, i] = err
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]

    if static_groups:
        scales = [p[0] for p in static_params]
        zeros = [p[1] for p in static_params]
        g_idx = default_g_idx(num_in, size, w.device)
    elif perm is not None:
        inv = torch.argsort(perm)
        g_idx = (inv // size).to(torch.int32)
    else:
        g_idx = default_g_idx(num_in, size, w.device)
    if perm is not None:
        q = q[:, torch.argsort(perm)]
    return _finish(q, torch.stack(scales), torch.stack(zeros), g_idx, float(losses.sum()))


def _inverse_cholesky_upper(h: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp I)^-1, raising the damping tenfold while H is not positive definite."""
    mean_diag = torch.mean(torch.diag(h))
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    damp = percdamp
    for _ in range(6):
        chol, info = torch.linalg.cholesky_ex(h + damp * mean_diag * eye)
        if info == 0:
            hinv = torch.cholesky_inverse(chol)
            upper, info = torch.linalg.cholesky_ex(hinv, upper=True)
            if info == 0:
                return upper
        damp = max(damp * 10, 1e-3)
    raise ValueError(
        f"Hessian is not positive definite even with damping {damp:g}; check calibration data"
    )


def _finish(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, loss: float
) -> QuantizedWeight:
    """q [N, K], scales/zeros [G, N] (float), g_idx [K] -> QuantizedWeight with v1 tensors."""
    groups = g_idx.long()
    dequantized = scales[groups].t() * (q - zeros[groups].t())
    tensors = pack_gptq(
        q.to(torch.int32), zeros.to(torch.int32), scales, g_idx, checkpoint_format="gptq"
    )
    return QuantizedWeight(tensors=tensors, dequantized=dequantized, loss=loss)
