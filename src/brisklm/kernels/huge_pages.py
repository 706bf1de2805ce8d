"""CPU tensors on transparent huge pages, for the memory a decode step streams through.

A batch-1 decode step reads every weight once, and on 4 KB pages a 125M-parameter float32 model is
100,000 pages: every one a TLB miss (a core's second-level TLB covers a few thousand pages), and
the hardware prefetchers stop at each page's end. On 2 MB pages the same weights are 200. Linux
gives an anonymous mapping huge pages when it is marked ``MADV_HUGEPAGE`` (the default
``transparent_hugepage`` setting, ``madvise``, gives them to nothing else); torch's allocator
does not mark its memory, so the tensors here come from a mapping of their own. Measured on the
AVX-512 Zen 4 VM (``bench/huge_pages_ab.py``, docs/benchmarks.md): the 125M benchmark model's
one-token step through the native kernels 5-9% faster with its packed weights and cache here, a
streaming read 7-8% faster.

Where there is nothing to ask (not Linux, ``transparent_hugepage`` set to ``never``, or
``BRISKLM_HUGE_PAGES=0`` in the environment) or the kernel refuses, ``empty`` returns torch's own
memory: the values are the same either way, only the page size differs.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

ENV_SWITCH = "BRISKLM_HUGE_PAGES"
HUGE_PAGE = 2 << 20
# Smaller tensors stay with torch's allocator (they would not fill a huge page).
MIN_BYTES = HUGE_PAGE
_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def enabled_by_environment() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def _kernel_offers_them() -> bool:
    """Whether this kernel gives huge pages to a mapping marked MADV_HUGEPAGE (checked once)."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        setting = _SETTING.read_text()
    except OSError:
        return False
    # e.g. "always [madvise] never": the bracketed word is the setting.
    return "[never]" not in setting


def available() -> bool:
    """Whether ``empty`` will ask for huge pages on this machine and in this environment."""
    return enabled_by_environment() and _kernel_offers_them()


def empty(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """An uninitialised contiguous tensor; on the CPU on huge pages where ``available()`` (its
    mapping starts on a huge-page boundary and is marked before any page is touched), else (and on
    other devices) torch's.

    The mapping is anonymous, so its pages read as zeros until written, and it lives as long as
    the tensor (and any view of it) does.
    """
    mapped = _mapped(shape, dtype, device)
    return torch.empty(shape, dtype=dtype, device=device) if mapped is None else mapped


def _mapped(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor | None:
    """``empty``'s tensor on a fresh anonymous mapping marked for huge pages; None where it would
    be torch's memory."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < MIN_BYTES or not available():
        return None
    try:
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as error:
        logger.debug("no mapping of %d bytes for huge pages (%s)", nbytes, error)
        return None
    # The tensor holds a reference to the mapping, which is unmapped when the last view goes.
    whole = torch.frombuffer(region, dtype=torch.uint8)
    offset = -whole.data_ptr() % HUGE_PAGE
    # The whole huge pages the tensor covers from its start, a huge-page boundary; the rest (under
    # one huge page) stays on 4 KB pages, so that no page is allocated beyond the tensor's end.
    span = nbytes // HUGE_PAGE * HUGE_PAGE
    try:
        region.madvise(mmap.MADV_HUGEPAGE, offset, span)
    except OSError as error:
        # Still a valid tensor, on ordinary pages.
        logger.debug("madvise(MADV_HUGEPAGE) refused (%s)", error)
    return whole[offset : offset + nbytes].view(dtype).view(shape)


def zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Like ``empty``, filled with zeros: a fresh anonymous mapping reads as zeros already, and its
    pages are faulted in (zeroed by the kernel) where they are first written, so memory never used
    is never touched (torch's memory, without huge pages, is written with zeros at once). Writing
    the zeros at once cost a KV cache's load seconds: a Qwen3-0.6B shape's 7.5 GB float32 cache (8
    sequences of 4,096 tokens), ~6 s of a 10.6 s load on the Zen 4; a sequence's first use of a slot
    now faults its pages (2 MB each, one per layer, head and keys or values at 4,096 positions of
    128 floats)."""
    mapped = _mapped(shape, dtype, device)
    return torch.zeros(shape, dtype=dtype, device=device) if mapped is None else mapped


def backed_by_huge_pages(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s memory the kernel has placed on huge pages (Linux; 0 elsewhere), read
    from ``/proc/self/smaps``: for tests and benchmarks, not for the hot path."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    total = 0
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    overlap = 0
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and ":" not in head:
            low, high = (int(part, 16) for part in head.split("-"))
            overlap = max(0, min(end, high) - max(start, low))
        elif overlap and line.startswith("AnonHugePages:"):
            # The mapping's huge-page bytes, at most the part the tensor covers.
            total += min(overlap, int(line.split()[1]) * 1024)
    return total
