"""Sampling: validated SamplingParams, per-batch metadata, the pure sampler, logprobs, stop strings."""

from brisklm.sampling.params import MAX_LOGPROBS, SamplingParams
from brisklm.sampling.stop import StopMatch, StopStringMatcher, find_stop_string, hold_back_length

__all__ = [
    "MAX_LOGPROBS",
    "SamplingParams",
    "StopMatch",
    "StopStringMatcher",
    "find_stop_string",
    "hold_back_length",
]
