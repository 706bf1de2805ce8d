"""A preallocated contiguous KV cache: per layer, (slots, kv_heads, max_seq_len, head_dim)."""

from __future__ import annotations

from pathlib import Path

import torch

from brisklm.kernels import huge_pages


class KVCache:
    """Keys and values of every layer for ``num_slots`` sequences of up to ``max_seq_len`` tokens.

    The layout is heads-before-positions so attention reads a slot's keys as a strided view with
    no copy.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        # Zeros, not empty: a reference attention multiplies masked-out values by zero weights, and
        # uninitialised memory can hold NaN. On CPU on huge pages where the machine gives them:
        # attention streams a sequence's keys and values at every step.
        try:
            self.keys = huge_pages.zeros(shape, dtype, device)
            self.values = huge_pages.zeros(shape, dtype, device)
        except (RuntimeError, MemoryError) as exc:  # torch's OutOfMemoryError is a RuntimeError
            if "alloc" not in str(exc) and "out of memory" not in str(exc).lower():
                raise
            per_token = self.bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
            raise MemoryError(
                f"the KV cache for {num_slots} sequence(s) of {max_seq_len} tokens needs "
                f"{cache_size_text(per_token, num_slots * max_seq_len, dtype)}, more than "
                f"{device} could allocate: lower max_seq_len or max_batch_size"
            ) from exc

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]

    def copy_slot(self, source: int, destination: int, length: int) -> None:
        """Copy the first ``length`` positions of a slot to another (all layers)."""
        self.keys[:, destination, :, :length] = self.keys[:, source, :, :length]
        self.values[:, destination, :, :length] = self.values[:, source, :, :length]

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * element


def format_bytes(num_bytes: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} bytes"


def cache_size_text(bytes_per_token: int, num_tokens: int, dtype: torch.dtype) -> str:
    """A cache's size for an error message: "1.0 TB (512 bytes a token in float32)"."""
    return (
        f"{format_bytes(bytes_per_token * num_tokens)} ({bytes_per_token} bytes a token in "
        f"{str(dtype).removeprefix('torch.')})"
    )


def available_memory(device: torch.device) -> int | None:
    """The memory a new allocation on ``device`` could take now: a GPU's free memory; on the
    CPU, Linux's MemAvailable plus free swap (the cache's pages are taken as sequences first write
    them: on huge pages, a slot's whole memory at its first token, as each 2 MB page holds
    positions of every head; so a larger one would bring the out-of-memory killer, which ends a
    process without a word, once they are used; memory other processes take after the check can
    bring it too).
    None where it is not known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:  # not Linux
        return None
    fields = {}
    for line in lines:  # "MemAvailable:   2097148 kB"
        name, _, value = line.partition(":")
        fields[name] = value.split()
    try:
        return (int(fields["MemAvailable"][0]) + int(fields.get("SwapFree", ["0"])[0])) * 1024
    except (KeyError, IndexError, ValueError):
        return None
