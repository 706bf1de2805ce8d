"""Sampling: validated SamplingParams, per-batch metadata, the pure sampler, logprobs, stop strings."""

from brisklm.sampling.params import MAX_LOGPROBS, SamplingParams

__all__ = ["MAX_LOGPROBS", "SamplingParams"]
