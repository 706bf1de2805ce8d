"""Sampling: validated SamplingParams, per-batch metadata, the pure sampler, logprobs, stop strings."""

from brisklm.sampling.metadata import SamplingMetadata, make_generator
from brisklm.sampling.params import MAX_LOGPROBS, SamplingParams
from brisklm.sampling.sampler import LogprobsTensors, compute_logprobs, processed_probs, sample
from brisklm.sampling.stop import StopMatch, StopStringMatcher, find_stop_string, hold_back_length

__all__ = [
    "MAX_LOGPROBS",
    "LogprobsTensors",
    "SamplingMetadata",
    "SamplingParams",
    "StopMatch",
    "StopStringMatcher",
    "compute_logprobs",
    "find_stop_string",
    "hold_back_length",
    "make_generator",
    "processed_probs",
    "sample",
]
