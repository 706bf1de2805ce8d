"""Bitmask apply: the fast path equals the plain-torch reference; semantics of bits, rows, padding."""

from __future__ import annotations

import pytest
import torch

from brisklm.constrained import apply as apply_module
from brisklm.constrained import apply_token_bitmask_, apply_token_bitmask_reference
from brisklm.kernels import native


@pytest.fixture(autouse=True, params=["native", "torch"])
def path(request, monkeypatch):
    """Both fast paths: the native kernels' loop (float32 on the CPU) and torch's ops."""
    if request.param == "native" and not native.available():
        pytest.skip("the native CPU kernels do not build here")
    if request.param == "torch":
        monkeypatch.setattr(apply_module, "_apply_natively", lambda logits, bitmask, rows: False)
    return request.param


def random_bitmask(batch: int, width: int, generator: torch.Generator) -> torch.Tensor:
    words = torch.randint(-(2**31), 2**31, (batch, width), generator=generator, dtype=torch.int64)
    return words.to(torch.int32)  # (B, W), every bit pattern incl. the sign bit


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 387, 1000])
@pytest.mark.parametrize("padding", [0, 5, 64])  # model vocab padded past the tokenizer's
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_matches_reference(vocab: int, padding: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(vocab * 7 + padding)
    batch = 4
    bitmask = random_bitmask(batch, (vocab + 31) // 32, generator)
    logits = torch.randn(batch, vocab + padding, generator=generator).to(dtype)  # (B, V)
    expected, actual = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask)
    apply_token_bitmask_(actual, bitmask)
    assert torch.equal(actual, expected)
    assert torch.all(actual[:, 32 * bitmask.shape[1] :] == float("-inf"))


@pytest.mark.parametrize("rows", [[2], [0, 3], [3, 1, 2], []])
def test_rows_limit_the_update(rows: list[int]) -> None:
    generator = torch.Generator().manual_seed(len(rows))
    bitmask = random_bitmask(4, 4, generator)
    logits = torch.randn(4, 130, generator=generator)
    expected, actual = logits.clone(), logits.clone()
    index = torch.tensor(rows, dtype=torch.long)
    apply_token_bitmask_reference(expected, bitmask, index)
    apply_token_bitmask_(actual, bitmask, index)
    assert torch.equal(actual, expected)
    for row in set(range(4)) - set(rows):
        assert torch.equal(actual[row], logits[row])


def test_reference_semantics_bit_order() -> None:
    # Token t is allowed iff bit t % 32 of word t // 32 is set; the sign bit is token 31.
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    allowed = [0, 5, 31, 32, 40]
    for t in allowed:
        bitmask[0, t // 32] |= torch.tensor(1 << (t % 32)).to(torch.int32)
    for apply in (apply_token_bitmask_reference, apply_token_bitmask_):
        logits = torch.zeros(1, 70)
        logits[0, 1] = float("inf")  # a disallowed +inf logit must be masked too
        logits[0, 5] = float("inf")  # an allowed one stays
        apply(logits, bitmask)
        assert (logits[0] > float("-inf")).nonzero().flatten().tolist() == allowed
        assert logits[0, 1] == float("-inf") and logits[0, 5] == float("inf")


@pytest.mark.parametrize("vocab", [4096, 32000, 32064])
def test_rows_of_a_wider_tensor_and_whole_words(vocab: int) -> None:
    # Logits as a view (a row stride past the vocabulary), words all set or all clear, NaN and
    # +inf logits: a masked token is -inf whatever its logit was (torch's minimum, used before,
    # left a masked NaN NaN, which greedy decoding then picked).
    generator = torch.Generator().manual_seed(vocab)
    words = (32000 + 31) // 32
    bitmask = random_bitmask(3, words, generator)
    bitmask[0, :10] = -1  # every token of the word allowed
    bitmask[1, :10] = 0  # none
    wide = torch.randn(3, vocab + 7, generator=generator)
    wide[:, ::97] = float("nan")
    wide[:, 3::89] = float("inf")
    logits = wide[:, :vocab]
    expected = logits.clone()
    apply_token_bitmask_reference(expected, bitmask, torch.tensor([0, 2]))
    before = wide.clone()
    apply_token_bitmask_(logits, bitmask, torch.tensor([0, 2]))
    assert torch.equal(logits.isnan(), expected.isnan())
    assert torch.equal(logits.nan_to_num(0.0), expected.nan_to_num(0.0))
    assert torch.equal(wide[:, vocab:].nan_to_num(0.0), before[:, vocab:].nan_to_num(0.0))


def test_checks_shapes_and_dtype() -> None:
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask_(torch.zeros(1, 8), torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="batch mismatch"):
        apply_token_bitmask_(torch.zeros(2, 8), torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\(B, V\)"):
        apply_token_bitmask_reference(torch.zeros(8), torch.zeros(1, 1, dtype=torch.int32))


@pytest.mark.gpu
def test_fast_matches_reference_on_cuda() -> None:
    generator = torch.Generator().manual_seed(0)
    bitmask = random_bitmask(8, (32000 + 31) // 32, generator)
    logits = torch.randn(8, 32064, generator=generator).to("cuda", torch.bfloat16)
    expected, actual = logits.clone(), logits.clone()
    rows = torch.tensor([1, 5, 6])
    apply_token_bitmask_reference(expected, bitmask, rows)
    apply_token_bitmask_(actual, bitmask.pin_memory(), rows)
    assert torch.equal(actual, expected)
