"""Attention backends behind one interface, and the choice among them."""

from __future__ import annotations

import logging

import torch

from brisklm.attention.base import AttentionBackend
from brisklm.attention.metadata import AttentionMetadata
from brisklm.attention.reference import ReferenceAttention
from brisklm.attention.sdpa import SdpaAttention

logger = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("auto", "sdpa", "xformers", "reference")


def select_backend(
    name: str,
    device: torch.device,
    *,
    dtype: torch.dtype = torch.float16,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
) -> AttentionBackend:
    """The backend for ``name`` on ``device``; ``auto`` = xformers on CUDA when it works, else SDPA.

    xformers is probed with one real call of the model's dtype and head layout (the keywords), checked
    against SDPA: an installed wheel whose kernels were built for another torch imports fine but
    fails on every call, and whether an operator takes the call depends on dtype, head size and GPU.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}"
        )
    if name == "reference":
        return ReferenceAttention()
    if name == "sdpa" or (name == "auto" and device.type != "cuda"):
        return SdpaAttention()
    from brisklm.attention.xformers import XformersAttention, probe_xformers

    if device.type != "cuda":
        reason = f"xformers needs a CUDA device, not {device.type}"
    else:
        reason = probe_xformers(device, dtype, num_heads, num_kv_heads, head_dim)
    if reason is None:
        return XformersAttention()
    log = logger.warning if name == "xformers" else logger.info
    log("xformers attention unavailable, using SDPA: %s", reason)
    return SdpaAttention()


__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "ReferenceAttention",
    "SdpaAttention",
    "select_backend",
]
