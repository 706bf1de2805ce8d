"""training/muon.py against plain-torch references: the Newton-Schulz iteration against the SVD's
``U V^T``, one Muon step against the update written out by hand, and the optimizer bundle's state
round trip (a resumed run must continue with the same momentum)."""

from __future__ import annotations

import copy

import pytest
import torch

from training.muon import Muon, Optimizers, orthogonalize


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(32, 32), (48, 16), (16, 48)])
def test_orthogonalize_approximates_the_polar_factor(
    shape: tuple[int, int], dtype: torch.dtype
) -> None:
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    x = orthogonalize(g, dtype=dtype)
    assert x.dtype == dtype
    x = x.float()
    assert x.shape == g.shape
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    polar = u @ vh
    # Five quintic steps leave every singular value in about [0.7, 1.2] (by design, not exactly 1),
    # with the singular vectors of g.
    sv = torch.linalg.svdvals(x)
    assert sv.min() > 0.6 and sv.max() < 1.3, sv
    cos = (x * polar).sum() / (x.norm() * polar.norm())
    assert cos > 0.97, cos
    # A random matrix's own singular values spread far wider than that.
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 3


def test_muon_step_matches_the_written_out_update() -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(24, 40))
    w0 = w.detach().clone()
    opt = Muon([w], lr=0.01, weight_decay=0.1, momentum=0.9)
    grads = [torch.randn(24, 40), torch.randn(24, 40)]
    buf = torch.zeros(24, 40)
    ref = w0.clone()
    for g in grads:
        w.grad = g.clone()
        opt.step()
        buf = 0.9 * buf + 0.1 * g
        nesterov = 0.1 * g + 0.9 * buf
        ref = ref * (1 - 0.01 * 0.1) - 0.01 * 0.2 * 40**0.5 * orthogonalize(nesterov).float()
    torch.testing.assert_close(w.detach(), ref, atol=1e-5, rtol=1e-5)
    assert not torch.equal(w.detach(), w0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_stacked_muon_takes_the_steps_of_one_matrix_at_a_time(dtype: torch.dtype) -> None:
    """The GPU path (matrices of one shape orthogonalised as one batch) moves every matrix as the
    one-at-a-time path does, tall, wide and square ones, over steps that build momentum."""
    gen = torch.Generator().manual_seed(3)
    shapes = [(16, 16), (40, 16), (16, 16), (16, 40), (40, 16), (16, 16)]
    start = [torch.randn(*s, generator=gen) for s in shapes]
    grads = [[torch.randn(*s, generator=gen) for s in shapes] for _ in range(3)]
    ends = []
    for stacked in (False, True):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        opt = Muon(params, lr=0.05, weight_decay=0.1, ns_dtype=dtype, stacked=stacked)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            opt.step()
        ends.append([p.detach() for p in params])
    for one, stack, w in zip(*ends, start, strict=True):
        assert not torch.equal(one, w)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        assert torch.allclose(one, stack, atol=tol, rtol=0), (one - stack).abs().max()
    orth = orthogonalize(torch.stack([grads[0][0], grads[0][2]]), dtype=dtype)
    for j, i in enumerate((0, 2)):
        single = orthogonalize(grads[0][i], dtype=dtype)
        assert torch.allclose(orth[j].float(), single.float(), atol=tol, rtol=0)


def test_muon_rejects_non_matrices() -> None:
    with pytest.raises(ValueError, match="2-D matrices only"):
        Muon([torch.nn.Parameter(torch.zeros(5))], lr=0.1)


def test_muon_lowers_a_least_squares_loss() -> None:
    torch.manual_seed(1)
    a = torch.randn(64, 16)
    b = a @ torch.randn(16, 8)  # exactly solvable: the minimum is 0
    w = torch.nn.Parameter(torch.zeros(16, 8))
    opt = Muon([w], lr=0.1)
    first = None
    for _ in range(60):
        loss = ((a @ w - b) ** 2).mean()
        first = loss.item() if first is None else first
        loss.backward()
        opt.step()
        w.grad = None
    assert loss.item() < 0.1 * first


def test_optimizers_bundle_round_trips_its_state() -> None:
    def make() -> tuple[torch.nn.Linear, Optimizers]:
        torch.manual_seed(2)
        lin = torch.nn.Linear(8, 6)
        return lin, Optimizers(Muon([lin.weight], lr=0.02), torch.optim.AdamW([lin.bias], lr=0.02))

    def train(lin: torch.nn.Linear, opt: Optimizers, steps: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            loss = lin(torch.randn(4, 8, generator=g)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

    lin_a, opt_a = make()
    train(lin_a, opt_a, 3, seed=0)
    assert [g["lr"] for g in opt_a.param_groups] == [0.02, 0.02]
    lin_b, opt_b = make()
    lin_b.load_state_dict(lin_a.state_dict())
    # Deep copies, as a checkpoint read back from disk is: the loaded momentum must not alias opt_a's.
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    train(lin_a, opt_a, 2, seed=1)
    train(lin_b, opt_b, 2, seed=1)
    for p, q in zip(lin_a.parameters(), lin_b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0)
