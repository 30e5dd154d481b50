"""Build and load nanoserve's C++ CPU kernels: torch.ops.nanoserve_cpu.

The sources: paged decode attention (cpu_attention.cpp, and cpu_attention_bf16.cpp for bf16
queries over a bf16 or fp8 cache on a CPU with AVX512-BF16; called by cpu_attention.py), a
decoder layer's small ops, RMSNorm, RoPE, the K/V cache write and the MLP's SiLU-and-mul
(cpu_layer_ops.cpp, called by cpu_layer_ops.py), the GEMV of linears of a few rows
(cpu_gemv.cpp, called by cpu_gemm.py), its counterpart over 8-bit weight codes and their
dequantization (cpu_quant_gemv.cpp, called by cpu_quant_gemm.py), greedy sampling's argmax
(cpu_argmax.cpp, called by cpu_argmax.py), and a decode step's decoder layers calling those ops
from C++ (cpu_decode_layer.cpp, cpu_decode_layer.py); cpu_common.h has the helpers they share,
cpu_few_rows.h what the two GEMVs share.
They are built on first use with the machine's C++ compiler against the installed torch's
headers, into one library in a cache folder keyed by the sources, torch, compiler and CPU, so
later processes just load it: about 20 s once per machine. Where that cannot happen (no
compiler, or not Linux: macOS's clang has no OpenMP, which the ops' threading needs),
`available()` is False with the reason in `unavailable_reason()`, and the CPU backend is the
torch reference. `NANOSERVE_KERNELS=reference` chooses the reference anyway.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch

from nanoserve import env

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, name) for name in
           ("cpu_attention.cpp", "cpu_attention_bf16.cpp", "cpu_layer_ops.cpp", "cpu_gemv.cpp",
            "cpu_quant_gemv.cpp", "cpu_argmax.cpp", "cpu_decode_layer.cpp")]
HEADERS = [os.path.join(HERE, h) for h in ("cpu_common.h", "cpu_few_rows.h")]
_why_not: list[str] = []


def cache_dir() -> str:
    return env.cache_dir("kernels")


def march() -> str:
    return env.get("NANOSERVE_CPU_MARCH") or "native"


def _cpu_id() -> str:
    """The CPU's model and flags: -march=native code built on one CPU may not run on another."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def splits_512_bit_ops(cpuinfo: str | None = None) -> bool:
    """Does this CPU (or the /proc/cpuinfo text given) run a 512-bit vector instruction as two
    256-bit halves? AMD's CPU family 25 does; later AMD families and Intel's AVX-512 cores run it
    whole. The CPU family tells, the compiler cannot: -march=native may name two families alike."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    first = cpuinfo.split("\n\n")[0].splitlines()  # the first core's block
    facts = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in first if ":" in ln)}
    return facts.get("vendor_id") == "AuthenticAMD" and facts.get("cpu family") == "25"


def _build(cxx: str, out: str, sources: list[str] | None = None) -> None:
    """Compile the sources (default: SOURCES) side by side (torch's headers make each take most
    of the build's time), then link them into `out`."""
    sources = SOURCES if sources is None else sources
    torch_dir = os.path.dirname(torch.__file__)
    lib = os.path.join(torch_dir, "lib")
    flags = ["-O3", f"-march={march()}", "-std=c++20", "-fopenmp", "-fPIC", "-w",
             *(["-DNANOSERVE_SPLIT512"] if splits_512_bit_ops() else []),
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             "-I", os.path.join(torch_dir, "include")]
    with tempfile.TemporaryDirectory(dir=os.path.dirname(out)) as tmp:
        objects = [os.path.join(tmp, os.path.basename(src) + ".o") for src in sources]
        compiles = [[cxx, *flags, "-c", src, "-o", obj] for src, obj in zip(sources, objects)]
        procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for cmd in compiles]
        errors = [proc.communicate()[1] for proc in procs]  # wait for all before failing
        for cmd, proc, err in zip(compiles, procs, errors):
            if proc.returncode:
                raise RuntimeError(f"{' '.join(cmd)}\n{err[-2000:]}")
        link = [cxx, "-shared", "-fopenmp", *objects, "-o", out,
                "-L", lib, f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu"]
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(link)}\n{done.stderr[-2000:]}")


@functools.cache
def available() -> bool:
    """Are the torch.ops.nanoserve_cpu ops loaded (building them now if need be)?"""
    if not sys.platform.startswith("linux"):
        _why_not.append(f"built on Linux only (OpenMP with the system compiler), not {sys.platform}")
        return False
    import fcntl  # POSIX only: imported past the Linux check, so Windows can import this module
    cxx = env.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        _why_not.append("no C++ compiler (c++, g++ or $CXX) on PATH")
        return False
    code = b"".join(pathlib.Path(src).read_bytes() for src in SOURCES + HEADERS)
    key = hashlib.sha256(code + "|".join(
        [torch.__version__, torch.__file__, cxx, march(), _cpu_id()]).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir(), f"nanoserve_cpu_{key}.so")
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        with open(path + ".lock", "w") as lock:  # one build when several processes start at once
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(path):
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir())
                os.close(fd)
                print(f"nanoserve: building the CPU kernels into {path} "
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
        warnings.warn(f"nanoserve: the CPU kernels fall back to the torch reference: {e}")
        return False
    return True


def unavailable_reason() -> str | None:
    return None if available() else _why_not[-1]
