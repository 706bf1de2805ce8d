"""The native kernels' logit bias and penalties (brisk_adjust_logits: what the decode steps of
``NativeForward.run_steps`` do to each row's logits) against the sampler's torch ops
(``_adjust_logits``), value for value."""

import ctypes

import pytest
import torch

from brisklm.kernels import native
from brisklm.models.native_forward import LogitAdjustments, adjustment_arguments
from brisklm.sampling import SamplingParams
from brisklm.sampling.sampler import _adjust_logits

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels do not build here")

ADJUSTED = [
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.7, frequency_penalty=0.9, presence_penalty=0.4),
    SamplingParams(frequency_penalty=-1.7, presence_penalty=-0.3, logit_bias={3: 2.5}),
    SamplingParams(logit_bias={0: -100.0, 5: 1e-3, 299: 7.0}),
    SamplingParams(),  # a row without them, beside rows with them
    SamplingParams(repetition_penalty=1e-40, presence_penalty=2.0),  # a divisor clamped to tiny
    SamplingParams(repetition_penalty=1e30, frequency_penalty=0.1, logit_bias={7: -3.0}),
]


def natively(logits: torch.Tensor, adjustments: LogitAdjustments) -> torch.Tensor:
    args = native.ForwardArgs()
    args.n_logits, args.vocab = logits.shape
    kept = adjustment_arguments(args, adjustments, logits.shape[0])
    out = logits.clone()
    status = native.library().brisk_adjust_logits(ctypes.byref(args), out.data_ptr())
    del kept
    assert status == 0
    return out


@pytest.mark.parametrize("vocab", [300, 4096])
def test_bias_and_penalties_are_the_samplers(build_md, vocab: int) -> None:
    """Random logits with zeros, infinities, NaN and values near the largest float; prompts and
    outputs that repeat tokens; every option alone and mixed: the same values (a zero's sign
    aside, where torch subtracts 0 x a penalty)."""
    generator = torch.Generator().manual_seed(vocab)
    rows = len(ADJUSTED)
    logits = torch.randn(rows, vocab, generator=generator) * 4
    logits[:, ::7] = 0.0
    logits[:, 1::11] = -0.0
    logits[:, 2::13] = float("inf")
    logits[:, 3::17] = float("-inf")
    logits[:, 4::19] = float("nan")
    logits[:, 5::23] = 3.0e38
    logits[:, 6::29] = -3.0e38
    ids = lambda n: torch.randint(0, vocab, (n,), generator=generator).tolist()  # noqa: E731
    prompts = [ids(50) + ids(5) * 3 for _ in range(rows)]
    outputs = [ids(30) + ids(4) * 5 for _ in range(rows)]
    md = build_md(ADJUSTED, vocab, prompts=prompts, outputs=outputs)
    want = _adjust_logits(logits, md)
    got = natively(logits, LogitAdjustments.of(md))
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert not torch.equal(want[:4].nan_to_num(), logits[:4].nan_to_num())  # (they changed)


def test_an_adjustment_out_of_range_is_refused(build_md) -> None:
    md = build_md([SamplingParams(logit_bias={5: 1.0})], 10)
    adjustments = LogitAdjustments.of(md)
    args = native.ForwardArgs()
    args.n_logits, args.vocab = 1, 4  # the bias's token 5 is past this vocabulary
    kept = adjustment_arguments(args, adjustments, 1)
    logits = torch.zeros(1, 4)
    assert native.library().brisk_adjust_logits(ctypes.byref(args), logits.data_ptr()) == 1
    del kept
    with pytest.raises(ValueError, match="logit adjustment counts must be"):
        md = build_md([SamplingParams(frequency_penalty=1.0)], 10)
        adjustment_arguments(native.ForwardArgs(vocab=12), LogitAdjustments.of(md), 1)
