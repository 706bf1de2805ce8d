"""The native forward pass's greedy tokens (team_argmax in cpu_forward.c) against torch's."""

from __future__ import annotations

import ctypes

import pytest
import torch

from brisklm.kernels import native
from brisklm.sampling.sampler import greedy_tokens
from tests.models.conftest import BUILDS

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")


def native_argmax(lib: ctypes.CDLL, x: torch.Tensor, columns: int, threads: int) -> list[int]:
    assert x.dtype == torch.float32 and x.is_contiguous()
    out = (ctypes.c_int64 * x.shape[0])()
    status = lib.brisk_test_argmax(
        x.data_ptr(), x.shape[1], x.shape[0], columns, ctypes.addressof(out), threads
    )
    assert status == 0
    return list(out)


def rows_with_special_values(columns: int, generator: torch.Generator) -> torch.Tensor:
    """Rows that tell a first-largest, NaN-largest argmax from others: ties, NaN, infinities, -0.0."""
    rows = [torch.randn(columns, generator=generator) for _ in range(3)]
    coarse = torch.randint(-3, 4, (columns,), generator=generator).float()  # many ties of the max
    rows.append(coarse)
    rows.append(torch.full((columns,), float("-inf")))  # all equal: the first
    zeros = torch.zeros(columns)
    zeros[torch.rand(columns, generator=generator) < 0.5] = -0.0  # -0.0 equals 0.0: the first
    rows.append(zeros)
    for count in (1, 3):  # NaN counts as the largest; the first of several
        row = torch.randn(columns, generator=generator)
        row[torch.randperm(columns, generator=generator)[:count]] = float("nan")
        row[torch.randint(columns, (1,), generator=generator)] = float("inf")
        rows.append(row)
    late = torch.randn(columns, generator=generator)
    late[-1] = 100.0  # the largest in the last, lone column
    rows.append(late)
    infs = torch.randn(columns, generator=generator)
    infs[torch.randperm(columns, generator=generator)[:2]] = float("inf")
    rows.append(infs)
    return torch.stack(rows)


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize("columns", [1, 2, 15, 16, 17, 32, 33, 95, 4096, 32000])
def test_greedy_tokens_match_torch_under_any_team(request, build, columns):
    lib = request.getfixturevalue("native_build")(build)
    generator = torch.Generator().manual_seed(columns)
    x = rows_with_special_values(columns, generator)
    expected = greedy_tokens(x).tolist()
    for threads in (1, 2, 3, 5, 8):
        assert native_argmax(lib, x, columns, threads) == expected, threads


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_columns_past_the_limit_are_not_read(request, build):
    """A model's padding ids (past the tokenizer's): larger values there are not chosen."""
    lib = request.getfixturevalue("native_build")(build)
    generator = torch.Generator().manual_seed(5)
    x = rows_with_special_values(300, generator)
    x[:, 291:] = float("nan")
    expected = greedy_tokens(x[:, :291]).tolist()
    for threads in (1, 2, 7):
        assert native_argmax(lib, x, 291, threads) == expected
