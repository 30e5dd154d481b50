"""cpu_malloc: after an engine starts on a CPU, a freed activation's pages are reused."""

import platform
import resource
import sys

import pytest
import torch

from nanoserve import LLM
from nanoserve.kernels import cpu_malloc

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                           reason="glibc's malloc thresholds only")


def faults_per_allocation(nbytes: int, times: int = 5) -> float:
    """Minor page faults per allocate-fill-free of an nbytes tensor, after a first one."""
    torch.empty(nbytes // 4).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        torch.empty(nbytes // 4).fill_(1.0)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / times


@glibc
def test_a_cpu_engine_keeps_freed_activation_memory():
    LLM("preset:tiny", device="cpu")
    assert cpu_malloc.keep_freed_memory()  # done once: the engine already set it
    # 40 MB: above the 32 MiB that glibc's own threshold stops at, so with its defaults every
    # allocation is a fresh mmap of 10240 pages; here the second round reuses the first's
    faults_per_allocation(40 << 20)
    assert faults_per_allocation(40 << 20) < 100
