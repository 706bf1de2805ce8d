"""The rejection sampler: greedy chains, exact target distributions (with wrong formulas as negative
controls), per-row seeds, degenerate inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from brisklm.speculative import rejection
from brisklm.speculative.rejection import rejection_sample

V = 6  # vocabulary
K = 3  # proposals per row
N = 40_000  # independent rows per statistical run


@pytest.fixture(autouse=True, params=["native pass", "torch ops"])
def sampler_path(request, monkeypatch) -> str:
    """Every test runs through the native kernels' pass (where they build) and the torch ops."""
    if request.param == "torch ops":
        monkeypatch.setattr(rejection, "_native_rows", lambda *args: None)
    elif rejection._native_rows(torch.zeros(1, 1, 1), torch.zeros(1, 0), None) is None:
        pytest.skip("native kernels do not build here")
    return request.param


def _tv(empirical: torch.Tensor, expected: torch.Tensor) -> float:
    return 0.5 * float((empirical - expected).abs().sum())


def tv_bound(num_cells: int, num_samples: int) -> float:
    """Total-variation bound for an empirical law of ``num_samples`` draws over ``num_cells``.

    A correct sampler's expected TV is about 0.4 * sqrt(cells / n), so this bound is ~2.5 times
    the expected noise (0.012 for one token at n = 40k, 0.03 for a pair)."""
    return (num_cells / num_samples) ** 0.5


class Check:
    """One statistical comparison: the TV distance of an empirical law and its bound."""

    def __init__(self, tokens: torch.Tensor, expected: torch.Tensor) -> None:
        self.num_samples = tokens.numel()
        self.tv = _tv(_frequencies(tokens, expected.numel()), expected.double())
        self.bound = tv_bound(expected.numel(), self.num_samples)

    @property
    def ratio(self) -> float:
        return self.tv / self.bound

    def __repr__(self) -> str:
        return f"TV {self.tv:.4f} (bound {self.bound:.4f}, n={self.num_samples})"


def _frequencies(tokens: torch.Tensor, num_cells: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=num_cells).double() / tokens.numel()


class Chain:
    """A toy target and draft over V tokens where position 1 depends on the token at position 0.

    Target: p0, then P1[t0] (a table), then p2 and p3. Draft: q0, Q1[x0], q2. Each row proposes
    ``num_draft`` in {0..3} tokens (chosen at random), so bonus tokens come from every position."""

    def __init__(self, seed: int, deterministic: bool, truncated: bool = False) -> None:
        rng = np.random.default_rng(seed)

        def dirichlet(*shape: int) -> torch.Tensor:
            probs = torch.from_numpy(rng.dirichlet([0.4] * V, size=shape)).float()
            if truncated:  # like top-k = V - 2: zero mass outside each law's support
                kth = probs.topk(V - 2, dim=-1).values[..., -1:]
                probs = torch.where(probs >= kth, probs, 0.0)
                probs = probs / probs.sum(dim=-1, keepdim=True)
            return probs

        self.p0, self.p2, self.p3 = dirichlet(), dirichlet(), dirichlet()
        self.P1 = dirichlet(V)  # (V, V): row a = target at position 1 after token a
        # q0 is unrelated to p0, so wrong formulas show strongly on the first token; later drafts
        # lie half-way between target and noise, so long accepted runs exercise later positions.
        self.q0 = dirichlet()
        self.q2 = 0.5 * self.p2 + 0.5 * dirichlet()
        self.Q1 = 0.5 * self.P1 + 0.5 * dirichlet(V)
        self.deterministic = deterministic

    def run(self, num_rows: int = N) -> dict[str, Check]:
        """Sample a batch, return TV distances of the emitted prefix against the target's law."""
        if self.deterministic:
            # n-gram style guesses that ignore q: the target's argmax with probability 0.7, else
            # uniform (a real lookup is often right), and at position 1 the argmax shifted by one
            # otherwise. Uniform guesses alone would hide a residual that forgets to remove them.
            def guess(best: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
                return torch.where(torch.rand(num_rows) < 0.7, best, wrong)

            x0 = guess(self.p0.argmax().expand(num_rows), torch.randint(V, (num_rows,)))
            best1 = self.P1[x0].argmax(dim=-1)
            x1 = guess(best1, (best1 + 1) % V)
            x2 = guess(self.p2.argmax().expand(num_rows), torch.randint(V, (num_rows,)))
            draft_probs = None
        else:
            x0 = torch.multinomial(self.q0, num_rows, replacement=True)
            x1 = torch.multinomial(self.Q1[x0], 1).squeeze(1)
            x2 = torch.multinomial(self.q2, num_rows, replacement=True)
            draft_probs = torch.stack(
                [self.q0.expand(num_rows, V), self.Q1[x0], self.q2.expand(num_rows, V)], dim=1
            )
        target = torch.stack(
            [
                self.p0.expand(num_rows, V),
                self.P1[x0],
                self.p2.expand(num_rows, V),
                self.p3.expand(num_rows, V),
            ],
            dim=1,
        )  # (N, K+1, V)
        num_draft = torch.randint(K + 1, (num_rows,))
        out, num_accepted = rejection_sample(
            target,
            torch.stack([x0, x1, x2], dim=1),
            num_draft,
            draft_probs,
            [False] * num_rows,
            [None] * num_rows,
        )
        assert torch.all(num_accepted <= num_draft)
        emitted = num_accepted + 1
        assert torch.all((out >= 0).sum(dim=1) == emitted)
        # Continue each row past what this step emitted with the target itself, so every row has
        # four tokens whose law under the target is known.
        t0 = out[:, 0]
        fresh1 = torch.multinomial(self.P1[t0], 1).squeeze(1)
        t1 = torch.where(emitted >= 2, out[:, 1], fresh1)
        t2 = torch.where(emitted >= 3, out[:, 2], torch.multinomial(self.p2, num_rows, True))
        t3 = torch.where(emitted >= 4, out[:, 3], torch.multinomial(self.p3, num_rows, True))
        joint = (self.p0[:, None] * self.P1).flatten()
        # Rows that got past position j drew the token there from the target's conditional law
        # given the accepted prefix (the laws at positions 2 and 3 do not depend on the prefix).
        past0, past1, past2 = num_accepted >= 1, num_accepted >= 2, num_accepted >= 3
        first_past0 = _frequencies(t0[past0], V).float()
        pair = t0 * V + t1
        return {
            "first": Check(t0, self.p0),
            "pair": Check(pair, joint),
            "pair|accepted first": Check(pair[past0], (first_past0[:, None] * self.P1).flatten()),
            "third|accepted 2": Check(t2[past1], self.p2),
            "fourth|accepted 3": Check(t3[past2], self.p3),
        }


def _run_chain(deterministic: bool, seed: int = 0, truncated: bool = False) -> dict[str, Check]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Chain(seed, deterministic, truncated).run()


def _residual_from_p(p, q, rejected):  # the classic mistake: resample from p after a rejection
    return p


def _residual_q_minus_p(p, q, rejected):  # sign error in the residual
    residual = (q - p).clamp_min(0.0)
    ok = rejected & (residual.sum(dim=-1) > 0)
    return torch.where(ok[:, None], residual, p)


def _accept_ignoring_q(u, p_x, q_x):  # accept with probability p(x), as if the draft were fixed
    return u < p_x


def _accept_by_q_over_p(u, p_x, q_x):  # ratio upside down
    return u * p_x < q_x


@pytest.mark.parametrize("truncated", [False, True], ids=["full-support", "truncated"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["draft-probs", "deterministic"])
def test_output_follows_target_distribution(deterministic, truncated):
    """The emitted tokens follow the target's law: first token, pairs, and later positions."""
    checks = _run_chain(deterministic, truncated=truncated)
    assert all(c.tv < c.bound for c in checks.values()), checks


MUTANTS = {
    "residual_from_p": ("_recovery_distribution", _residual_from_p),
    "residual_q_minus_p": ("_recovery_distribution", _residual_q_minus_p),
    "accept_ignoring_q": ("_accept", _accept_ignoring_q),
    "accept_q_over_p": ("_accept", _accept_by_q_over_p),
}
# Which mutants are wrong for which proposals: with deterministic proposals q is one-hot, so
# accepting with probability p(x) is the right rule there.
MUTANT_CASES = [
    ("residual_from_p", False),
    ("residual_q_minus_p", False),
    ("accept_ignoring_q", False),
    ("accept_q_over_p", False),
    ("residual_from_p", True),
    ("residual_q_minus_p", True),
    ("accept_q_over_p", True),
]


@pytest.mark.parametrize(("mutant", "deterministic"), MUTANT_CASES)
def test_wrong_formulas_fail_the_bound(monkeypatch, mutant, deterministic, sampler_path):
    """Negative controls: the same statistical check catches each deliberately wrong variant (of
    the torch ops; the native pass is held to the torch ops' decisions below)."""
    if sampler_path == "native pass":
        pytest.skip("the mutants replace torch ops")
    name, replacement = MUTANTS[mutant]
    monkeypatch.setattr(rejection, name, replacement)
    checks = _run_chain(deterministic)
    assert max(c.ratio for c in checks.values()) > 2, checks


# ---------------------------------------------------------------------------------------- greedy
def _one_hot_chain(argmaxes: list[list[int]]) -> torch.Tensor:
    """(B, K+1, V) one-hot target distributions from per-position argmax ids."""
    ids = torch.tensor(argmaxes)
    return torch.nn.functional.one_hot(ids, V).float()


def _greedy(target, drafts, num_draft, draft_probs=None):
    batch = target.shape[0]
    return rejection_sample(
        target, torch.tensor(drafts), num_draft, draft_probs, [True] * batch, [None] * batch
    )


def test_greedy_accepts_matching_prefix_then_target_argmax():
    target = _one_hot_chain([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = [[1, 2, 3], [1, 5, 3], [0, 2, 3], [1, 2, 0]]
    out, num_accepted = _greedy(target, drafts, [3, 3, 3, 2])
    assert num_accepted.tolist() == [3, 1, 0, 2]
    assert out.tolist() == [
        [1, 2, 3, 4],  # all accepted, then the bonus
        [1, 2, -1, -1],  # mismatch at 1: the target's own token there
        [1, -1, -1, -1],
        [1, 2, 3, -1],  # proposed 2 of 3: bonus from position 2
    ]


def test_greedy_uses_argmax_of_soft_target_and_ignores_draft_probs():
    torch.manual_seed(0)
    target = torch.softmax(torch.randn(5, K + 1, V) * 3, dim=-1)
    argmax = target.argmax(dim=-1)
    draft_probs = torch.softmax(torch.randn(5, K, V), dim=-1)
    out, num_accepted = _greedy(target, argmax[:, :K].tolist(), [K] * 5, draft_probs)
    assert num_accepted.tolist() == [K] * 5
    assert torch.equal(out, argmax)


def test_greedy_draft_that_always_disagrees_still_emits_one_token():
    target = _one_hot_chain([[3, 1, 4, 1], [5, 0, 2, 2]])
    wrong = [[(3 + 1) % V, 1, 4], [(5 + 1) % V, 0, 2]]
    out, num_accepted = _greedy(target, wrong, [3, 3])
    assert num_accepted.tolist() == [0, 0]
    assert out.tolist() == [[3, -1, -1, -1], [5, -1, -1, -1]]


def test_greedy_output_equals_target_greedy_chain_over_many_random_cases():
    """Greedy output is always the target's argmax along the emitted prefix."""
    gen = torch.Generator().manual_seed(1)
    batch = 2000
    target = torch.softmax(torch.randn(batch, K + 1, V, generator=gen) * 2, dim=-1)
    argmax = target.argmax(dim=-1)
    # Drafts agree with the argmax with probability 0.7 per position.
    agree = torch.rand(batch, K, generator=gen) < 0.7
    drafts = torch.where(agree, argmax[:, :K], (argmax[:, :K] + 1) % V)
    num_draft = torch.randint(K + 1, (batch,), generator=gen)
    out, num_accepted = rejection_sample(
        target, drafts, num_draft, None, [True] * batch, [None] * batch
    )
    for b in range(batch):
        n = int(num_accepted[b])
        expected_run = 0
        while expected_run < int(num_draft[b]) and bool(agree[b, expected_run]):
            expected_run += 1
        assert n == expected_run
        assert out[b, : n + 1].tolist() == argmax[b, : n + 1].tolist()
        assert out[b, n + 1 :].eq(-1).all()


# ----------------------------------------------------------------------------------------- seeds
def _random_case(gen: torch.Generator, batch: int, width: int):
    target = torch.softmax(torch.randn(batch, width + 1, V, generator=gen), dim=-1)
    draft = torch.softmax(torch.randn(batch, width, V, generator=gen), dim=-1)
    drafts = torch.multinomial(draft.reshape(-1, V), 1, generator=gen).reshape(batch, width)
    return target, drafts, draft


def test_seeded_row_is_reproducible_whatever_the_batch():
    gen = torch.Generator().manual_seed(2)
    target, drafts, draft = _random_case(gen, 1, K)

    def seeded(seed: int = 1234) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    results = []
    for _ in range(20):  # a few trials: acceptance patterns differ, each must replay exactly
        alone = rejection_sample(target, drafts, [2], draft, [False], [seeded()])
        # The same row amid others, with a wider K, unseeded and greedy neighbours.
        width = K + 2
        big_t, big_d, big_q = _random_case(gen, 4, width)
        big_t[2, : K + 1] = target[0]
        big_d[2, :K] = drafts[0]
        big_q[2, :K] = draft[0]
        mixed = rejection_sample(
            big_t,
            big_d,
            [width, 1, 2, 0],
            big_q,
            [False, True, False, False],
            [None, None, seeded(), seeded(99)],
        )
        n = int(alone[1][0])
        assert int(mixed[1][2]) == n
        assert mixed[0][2, : n + 1].tolist() == alone[0][0, : n + 1].tolist()
        results.append(alone[0][0, : n + 1].tolist())
    # A different seed gives (at least sometimes) a different result: the seed is really used.
    others = {
        tuple(rejection_sample(target, drafts, [2], draft, [False], [seeded(s)])[0][0].tolist())
        for s in range(30)
    }
    assert len(others) > 1


def test_seeded_and_greedy_rows_leave_the_default_generator_alone():
    gen = torch.Generator().manual_seed(3)
    target, drafts, draft = _random_case(gen, 3, K)
    before = torch.get_rng_state()
    rejection_sample(
        target,
        drafts,
        [3, 2, 1],
        draft,
        [False, True, False],
        [torch.Generator().manual_seed(1), None, torch.Generator().manual_seed(2)],
    )
    assert torch.equal(torch.get_rng_state(), before)


def test_seeded_row_draws_exactly_num_draft_uniforms_then_one_more():
    gen = torch.Generator().manual_seed(4)
    target, drafts, draft = _random_case(gen, 1, K)
    used = torch.Generator().manual_seed(7)
    rejection_sample(target, drafts, [2], draft, [False], [used])
    replay = torch.Generator().manual_seed(7)
    torch.rand(2, generator=replay)
    torch.rand(1, dtype=torch.float64, generator=replay)
    assert torch.equal(used.get_state(), replay.get_state())


# ------------------------------------------------------------------------------------ degenerate
def test_proposal_the_target_forbids_is_always_rejected():
    target = torch.tensor([[[0.5, 0.5, 0.0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0]]]).repeat(500, 1, 1)
    draft = torch.tensor([[[0.2, 0.2, 0.6, 0, 0, 0]]]).repeat(500, 1, 1)
    drafts = torch.full((500, 1), 2)
    out, num_accepted = rejection_sample(
        target, drafts, [1] * 500, draft, [False] * 500, [None] * 500
    )
    assert num_accepted.eq(0).all()
    assert set(out[:, 0].tolist()) == {0, 1}  # residual max(0, p - q) = (0.3, 0.3, 0, ...)


def test_empty_residual_falls_back_to_target():
    # q >= p everywhere (as rounding can make it) with q(x) > p(x): every proposal is rejected
    # and max(0, p - q) is all zeros, so the drawn token must come from p itself.
    p = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    q = torch.tensor([0.5, 0.5, 0.3, 0.0, 0.0, 0.0])
    batch = 400
    target = torch.stack([p, p]).expand(batch, 2, V)
    out, num_accepted = rejection_sample(
        target,
        torch.full((batch, 1), 2),
        [1] * batch,
        q.expand(batch, 1, V),
        [False] * batch,
        [None] * batch,
    )
    assert num_accepted.eq(0).all()
    assert set(out[:, 0].tolist()) == {0, 1}


def test_deterministic_proposal_rejected_is_resampled_without_it():
    p = torch.tensor([0.4, 0.3, 0.3, 0.0, 0.0, 0.0])
    batch = 3000
    target = p.expand(batch, 2, V)
    out, num_accepted = rejection_sample(
        target,
        torch.zeros((batch, 1), dtype=torch.int64),
        [1] * batch,
        None,
        [False] * batch,
        [None] * batch,
    )
    rejected = num_accepted == 0
    assert set(out[rejected, 0].tolist()) <= {1, 2}
    assert abs(float(rejected.float().mean()) - 0.6) < 0.05


def test_no_proposals_samples_from_the_first_position():
    with torch.random.fork_rng():
        torch.manual_seed(5)
        p = torch.softmax(torch.randn(V), dim=-1)
        batch = 20_000
        out, num_accepted = rejection_sample(
            p.expand(batch, 1, V),
            torch.zeros((batch, 0), dtype=torch.int64),
            [0] * batch,
            None,
            [False] * batch,
            [None] * batch,
        )
    assert out.shape == (batch, 1) and num_accepted.eq(0).all()
    check = Check(out[:, 0], p)
    assert check.tv < check.bound, check


def test_shape_errors_are_clear():
    target = torch.full((2, K + 1, V), 1.0 / V)
    with pytest.raises(ValueError, match="draft_token_ids"):
        rejection_sample(
            target, torch.zeros((2, K + 1), dtype=torch.int64), [1, 1], None, [True] * 2, [None] * 2
        )
    with pytest.raises(ValueError, match="num_draft"):
        rejection_sample(
            target, torch.zeros((2, K), dtype=torch.int64), [K + 1, 1], None, [True] * 2, [None] * 2
        )
    with pytest.raises(ValueError, match="generator"):
        rejection_sample(
            target, torch.zeros((2, K), dtype=torch.int64), [1, 1], None, [True] * 2, [None]
        )


def test_the_native_pass_decides_as_the_torch_ops(monkeypatch, sampler_path):
    """On 300 random batches (seeded, greedy and default rows; draft probabilities or none; tokens
    the target forbids; K from 0 to 4) the native pass returns the torch ops' tokens and counts."""
    if sampler_path == "torch ops":
        pytest.skip("compares the two paths")
    gen = torch.Generator().manual_seed(9)
    native_path = rejection._native_rows
    for case in range(300):
        batch, width = int(torch.randint(1, 5, (1,), generator=gen)), case % 5
        target, drafts, draft = _random_case(gen, batch, width)
        target[target < 0.05] = 0.0  # forbidden tokens, as top-k or a grammar leaves them
        greedy = (torch.rand(batch, generator=gen) < 0.3).tolist()
        target[greedy] = torch.nn.functional.one_hot(target[greedy].argmax(-1), V).float()
        num_draft = torch.randint(width + 1, (batch,), generator=gen).tolist()
        q = draft if case % 2 else None
        seeds = [int(s) if s % 3 else None for s in torch.randint(100, (batch,), generator=gen)]
        results = []
        for native_rows in (native_path, lambda *args: None):
            monkeypatch.setattr(rejection, "_native_rows", native_rows)
            generators = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
            torch.manual_seed(case)
            out, accepted = rejection_sample(target, drafts, num_draft, q, greedy, generators)
            results.append((out.tolist(), accepted.tolist()))
        assert results[0] == results[1], case


def test_transposed_proposals_are_read_as_their_rows():
    """A column-major (B, K) tensor of proposals: each row's own proposals are tested (the native
    pass read its memory as row-major once, a review found)."""
    target = torch.zeros(2, 3, 4)
    target[0, :, 1] = 1.0
    target[1, :, 2] = 1.0
    proposals = torch.tensor([[1, 2], [1, 2]]).t()  # rows [1, 1] and [2, 2]
    out, accepted = rejection_sample(target, proposals, [2, 2], None, [True, True], [None, None])
    assert accepted.tolist() == [2, 2]
    assert out.tolist() == [[1, 1, 1], [2, 2, 2]]


def test_proposals_outside_the_vocabulary_are_refused():
    target = torch.full((1, 3, 8), 1 / 8)
    for bad in (8, -1):
        with pytest.raises(ValueError, match=r"proposed token ids must be in \[0, V=8\)"):
            rejection_sample(target, torch.tensor([[3, bad]]), [2], None, [False], [None])
    # Padding past a row's proposals may hold anything.
    out, _ = rejection_sample(target, torch.tensor([[3, 99]]), [1], None, [False], [None])
    assert 0 <= out[0, 1].item() < 8 or out[0, 1].item() == -1


def test_a_nan_inside_a_row_is_decided_as_torch_decides_it():
    """A NaN in the residual makes it unusable (its sum is NaN): the draw falls back to p; a
    greedy row whose distribution holds a NaN has nothing to take (-1: its request fails), where
    torch's argmax would take the NaN as the largest and go on."""
    nan = float("nan")
    # Row 0 rejects its proposal (p(x) = 0); its residual holds the NaN: p has it too, so the
    # fallback has nothing to draw. Row 1: q holds the NaN, p is clean: the draw is from p.
    target = torch.tensor([[[0.0, nan, 0.5, 0.5], [0.25] * 4], [[0.0, 1.0, 0.0, 0.0], [0.25] * 4]])
    draft = torch.tensor([[[1.0, 0.0, 0.0, 0.0]], [[0.5, nan, 0.0, 0.5]]])
    out, accepted = rejection_sample(
        target, torch.tensor([[0], [0]]), [1, 1], draft, [False, False], [None, None]
    )
    assert accepted.tolist() == [0, 0]
    assert out[:, 0].tolist() == [-1, 1]
    greedy = torch.tensor([[[0.1, nan, 0.5, 0.4], [0.1, 0.2, 0.3, 0.4]]])
    out, accepted = rejection_sample(greedy, torch.tensor([[1]]), [1], None, [True], [None])
    assert accepted.tolist() == [0] and out[0, 0].item() == -1
    clean = torch.tensor([[[0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]])
    out, accepted = rejection_sample(clean, torch.tensor([[1]]), [1], None, [True], [None])
    assert accepted.tolist() == [1] and out.tolist() == [[1, 3]]
