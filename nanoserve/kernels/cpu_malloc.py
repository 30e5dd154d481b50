"""The CPU backend's setup: keep freed activation memory, so a step does not fault in fresh pages.

torch's CPU tensors come from malloc. glibc's malloc serves a block above its mmap threshold
(128 KiB at first, raised as big blocks are freed) with a fresh mmap, unmaps it when freed, and
hands the top of its heap back to the OS once more than its trim threshold is free. Either way the
next step's activations land on new pages, which the kernel faults in and zeroes 4 KiB at a time:
a long prefill allocates about a hundred activations of several MB each, and the faults show as
the "other" part of a prefill step (benchmarks/cpu_step_profile.py). vLLM's CPU
backend asks for tcmalloc (LD_PRELOAD) for the same reason; a library cannot preload an
allocator, but it can set glibc's two thresholds (mallopt), which is what this does.

The setting is the process's: freed memory up to `TRIM` stays with it instead of going back
to the OS. Only glibc on Linux has these knobs; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP = 64 << 20  # blocks up to this come from the heap (older glibc caps it at 32 MiB)
TRIM = 1 << 30  # free memory at the heap's top kept up to this


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True where that took effect."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP) or libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return bool(mmap_ok and libc.mallopt(M_TRIM_THRESHOLD, TRIM))
