"""The weights a decode step streams, moved onto transparent huge pages.

A batch-1 decode step reads every weight once, so its speed is the rate at which the weights
stream in. On 4 KiB pages each 4 KiB of weight needs its own address translation, and on a
virtual machine (a page walk through the guest's and the host's tables) that rate can fall well
below the machine's and vary from one allocation to the next (benchmarks/quantization.py
measures the GEMVs' rate). On 2 MiB pages it does not. Linux backs memory
with huge pages where it was marked MADV_HUGEPAGE before it was first touched (THP "madvise", a
common default, or "always"); torch's allocator marks its own blocks only under
THP_MEM_ALLOC_ENABLE=1, read once at its first allocation, before a library is imported. So the
weights are copied, one after another in the order a step reads them, into one anonymous mapping
marked before the copy.
"""

from __future__ import annotations

import mmap
import sys

import torch

ALIGN = 64  # each tensor starts on a cache line


def huge_pages_available() -> bool:
    """Linux with transparent huge pages that madvise can ask for."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def to_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous copies of `tensors` (CPU tensors), in order in one mapping marked MADV_HUGEPAGE;
    `tensors` themselves where huge pages are not available or the mapping fails. The mapping lives
    while any copy does."""
    if not tensors or not huge_pages_available():
        return tensors
    offsets, size = [], 0
    for t in tensors:
        offsets.append(size)
        size += -(-t.nbytes // ALIGN) * ALIGN
    try:
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # no room for a second copy, or a kernel refusing the advice: keep the originals
        return tensors
    flat = torch.frombuffer(region, dtype=torch.uint8)  # holds `region` alive
    copies = []
    for t, off in zip(tensors, offsets):
        copy = flat[off:off + t.nbytes].view(t.dtype).view(t.shape)
        copies.append(copy.copy_(t))
    return copies
