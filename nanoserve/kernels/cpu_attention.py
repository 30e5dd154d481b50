"""Paged decode attention in C++ for CPUs: read K/V where they sit in the paged cache.

The torch reference gathers each decode sequence's K/V blocks into a contiguous copy, then runs
SDPA on it: every K/V byte crosses memory three times (read, write, read again). The kernel in
cpu_attention.cpp reads each byte once. On a 2-core AMD EPYC (AVX2), llama-120m's attention of
64 sequences x 320 tokens took about half the reference's time per layer in fp32 and about 40%
in bf16 (benchmarks/cpu_attention.py prints the side-by-side figures for the machine it runs on).

`paged_attention` has the reference's contract; decode rows go to the C++ op, prefill rows
(SDPA's flash kernel reads them once already) to the reference. The op is built on first use
with the machine's C++ compiler against the installed torch's headers, into a cache folder
keyed by source, torch version, compiler and CPU, so later processes just load it:
about 20 s once per machine. Where that cannot happen (no compiler, or not Linux: macOS's
clang has no OpenMP, which the op's threading needs), `available()` is False with the reason in
`unavailable_reason()`, and the CPU backend is the torch reference. `NANOSERVE_KERNELS=reference`
chooses the reference anyway.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch

from nanoserve.kernels import reference
from nanoserve.kernels.metadata import AttentionMetadata

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_attention.cpp")
_why_not: list[str] = []


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nanoserve", "kernels")


def _cpu_id() -> str:
    """The CPU's model and flags: -march=native code built on one CPU may not run on another."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def _build(cxx: str, out: str) -> None:
    torch_dir = os.path.dirname(torch.__file__)
    lib = os.path.join(torch_dir, "lib")
    cmd = [cxx, "-O3", "-march=native", "-std=c++20", "-fopenmp", "-shared", "-fPIC", "-w",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           "-I", os.path.join(torch_dir, "include"), SOURCE, "-o", out,
           "-L", lib, f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{done.stderr[-2000:]}")


@functools.cache
def available() -> bool:
    """Is torch.ops.nanoserve_cpu.decode_attention loaded (building it now if need be)?"""
    if not sys.platform.startswith("linux"):
        _why_not.append(f"built on Linux only (OpenMP with the system compiler), not {sys.platform}")
        return False
    import fcntl  # POSIX only: imported past the Linux check, so Windows can import this module
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        _why_not.append("no C++ compiler (c++, g++ or $CXX) on PATH")
        return False
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + "|".join(
            [torch.__version__, torch.__file__, cxx, _cpu_id()]).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir(), f"nanoserve_cpu_{key}.so")
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        with open(path + ".lock", "w") as lock:  # one build when several processes start at once
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(path):
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir())
                os.close(fd)
                print(f"nanoserve: building the CPU decode-attention kernel into {path} "
                      "(once per machine and torch, about 20 s)", file=sys.stderr, flush=True)
                try:  # built under a temporary name, then renamed: never a half-written file
                    _build(cxx, tmp)
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.remove(tmp)
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as e:
        _why_not.append(f"building or loading {path} failed: {e}")
        warnings.warn(f"nanoserve: CPU decode attention falls back to the torch reference: {e}")
        return False
    return True


def unavailable_reason() -> str | None:
    return None if available() else _why_not[-1]


def decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale) -> None:
    """reference._decode_attention's contract: qd (D, kvh, g, hd) -> od, in one C++ call."""
    D, kvh, g, hd = qd.shape
    if hd % 8 or k_cache.dtype != qd.dtype or not k_cache.is_contiguous():
        # the op's rows are whole 8-float vectors, in the model's dtype, in the default layout
        return reference._decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale)
    q = qd.reshape(D, kvh * g, hd)  # a view for rows of the fused qkv output
    if q.stride(2) != 1 or q.stride(1) != hd:
        q = q.contiguous()
    out = od.view(D, kvh * g, hd) if od.is_contiguous() else torch.empty_like(q)
    torch.ops.nanoserve_cpu.decode_attention(q, out, k_cache, v_cache, tables.int().contiguous(),
                                             d_lens.int(), scale)
    if out.data_ptr() != od.data_ptr():
        od.copy_(out.view_as(od))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float) -> torch.Tensor:
    """reference.paged_attention with its decode rows computed by the C++ op."""
    return reference.paged_attention(q, k_cache, v_cache, attn, scale, decode_attention=decode_attention)
