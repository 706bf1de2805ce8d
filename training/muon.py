"""Muon: momentum SGD whose update for each weight matrix is orthogonalised by Newton-Schulz.

Muon (Keller Jordan et al., 2024) replaces the update of a 2-D hidden weight by the nearest
semi-orthogonal matrix to its Nesterov momentum (``U V^T`` of its SVD, approximated by five
Newton-Schulz iterations in bfloat16, or float32 where the CPU has no native bfloat16), which
spreads the step over all of the matrix's directions instead of the few that dominate the
gradient. Embeddings, the (tied) output head and the norm gains are not hidden matrices and stay
with AdamW.

The update is scaled by ``0.2 * sqrt(max(rows, cols))`` (Moonlight, Liu et al., 2025), which makes
its RMS match a typical AdamW update's, so the same learning rate and weight decay serve both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

# The quintic Newton-Schulz coefficients from Muon's reference implementation: they push every
# singular value of the normalised matrix into about [0.7, 1.2] in five steps.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def orthogonalize(
    g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with ``g``'s singular vectors, computed in ``dtype``
    (bfloat16 where the CPU multiplies it natively; float32 elsewhere, see ``train.py --precision``).
    ``g`` may be a stack of matrices of one shape: each is orthogonalised on its own."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters (lr, decoupled weight decay, Nesterov momentum)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        ns_steps: int = 5,
        ns_dtype: torch.dtype = torch.bfloat16,
        stacked: bool = False,
    ) -> None:
        super().__init__(
            params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, ns_steps=ns_steps)
        )
        self.ns_dtype = ns_dtype
        self.stacked = stacked
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes 2-D matrices only, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            beta = group["momentum"]
            params = [p for p in group["params"] if p.grad is not None]
            updates = []
            for p in params:
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - beta)
                updates.append(p.grad.lerp(buf, beta))
            if self.stacked:
                # On a GPU a step is bound by kernel launches: the matrices of one shape (a layer's
                # q, k, v and o; every layer's gate and up; every down) go through Newton-Schulz as
                # one batch. On a CPU stacked bfloat16 matmuls measured 1.5x slower: one at a time.
                by_shape: dict[torch.Size, list[int]] = {}
                for i, u in enumerate(updates):
                    by_shape.setdefault(u.shape, []).append(i)
                for idx in by_shape.values():
                    stack = orthogonalize(
                        torch.stack([updates[i] for i in idx]), group["ns_steps"], self.ns_dtype
                    )
                    for j, i in enumerate(idx):
                        updates[i] = stack[j]
            else:
                updates = [orthogonalize(u, group["ns_steps"], self.ns_dtype) for u in updates]
            for p, update in zip(params, updates, strict=True):
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-group["lr"] * 0.2 * max(p.shape) ** 0.5)


class Optimizers:
    """Several optimizers driven as one: shared ``param_groups`` view, step, zero_grad, state."""

    def __init__(self, *opts: torch.optim.Optimizer) -> None:
        self.opts = opts

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.opts for g in o.param_groups]

    def step(self) -> None:
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> list[dict[str, Any]]:
        return [o.state_dict() for o in self.opts]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        for o, s in zip(self.opts, states, strict=True):
            o.load_state_dict(s)
