"""A device's ceilings, measured on it: memory bandwidth, weight-read bandwidth, matmul FLOP/s.

`measure_ceilings` times a large copy (memory bandwidth), a batch-1 matrix-vector product on a
large weight (weight-read bandwidth: the best a decode step can do) and square matmuls (peak
FLOP/s per dtype), each the best of F.linear and, on CPU, oneDNN's packed weights;
`load_or_measure_ceilings` caches them per device in a small JSON. roofline.py turns them into
floors, ridge points and the figure (and re-exports these names).
Units are SI throughout: bytes, seconds, bytes/s, FLOP/s (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime

import torch
import torch.nn.functional as F

from nanoserve import env
from nanoserve.kernels import cpu_gemm
from nanoserve.kernels.cpu_huge_pages import to_huge_pages

_TORCH_DTYPES = {n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16",
                  "fp16": "float16", "half": "float16"}


def dtype_name(dtype: str | torch.dtype) -> str:
    """'float32' for torch.float32, 'fp32' or 'float32'; ValueError for anything else."""
    name = str(dtype).removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _TORCH_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16', 'float16'")
    return name


def dtype_bytes(dtype: str | torch.dtype) -> int:
    """Bytes per element: 4 for float32, 2 for bfloat16/float16."""
    return getattr(torch, dtype_name(dtype)).itemsize


@dataclass
class DeviceCeilings:
    """What one device attains on plain torch ops, measured on it (SI units)."""

    device: str  # torch device type: "cpu", "cuda", ...
    device_name: str  # CPU model or GPU name
    num_threads: int  # torch intra-op threads during the measurement
    torch_version: str
    date: str  # ISO timestamp of the measurement
    quick: bool  # smaller sizes and fewer repetitions
    copy_bandwidth: float  # bytes/s, large copy, bytes read + bytes written
    weight_read_bandwidth: float  # bytes/s, batch-1 fp32 linear: weight bytes / time
    peak_flops: dict[str, float] = field(default_factory=dict)  # dtype name -> FLOP/s (matmul)
    load_before: float | None = None  # CPU: 1-min load average before measuring; high = noisy

    @property
    def bandwidth(self) -> float:
        """The roofline's slope: weight-read bandwidth, the rate a decode step can read weights."""
        return self.weight_read_bandwidth

    def peak(self, dtype: str | torch.dtype) -> float:
        name = dtype_name(dtype)
        if name not in self.peak_flops:
            raise ValueError(f"no matmul ceiling for dtype {name!r} on {self.device_name}; "
                             f"measured: {sorted(self.peak_flops)}")
        return self.peak_flops[name]


def device_name(device: str | torch.device) -> str:
    """CPU model or GPU name."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine() or "cpu"
    return device.type


def _time(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 3) -> float:
    """Median seconds of fn() over reps calls, after warmup calls (first calls run slow)."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":  # events time the GPU, not the launch
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        sync = torch.accelerator.synchronize if device.type != "cpu" else (lambda: None)
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_bandwidth(device: torch.device, nbytes: int, reps: int) -> float:
    """Large copy, bytes read + bytes written per second. Buffers far larger than any cache."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)  # touched: pages exist
    dst = torch.empty_like(src)
    return 2 * nbytes / _time(lambda: dst.copy_(src), device, reps)


def _linears(w: torch.Tensor):
    """F.linear and, where it differs, the linear the engine runs on this device (cpu_gemm)."""
    return list({"F.linear": lambda x: F.linear(x, w), **dict([cpu_gemm.linear_for(w)])}.values())


def _weight_read_bandwidth(device: torch.device, k: int, reps: int) -> float:
    """Batch-1 fp32 matrix-vector product, decode's inner loop: weight bytes per second.
    The best of the available implementations, so that a floor is one no kernel beat."""
    w = torch.randn(k, k, dtype=torch.float32, device=device)  # (out, in)
    if device.type == "cpu":  # on huge pages, as the engine holds a model's weights
        (w,) = to_huge_pages([w])
    x = torch.randn(1, k, dtype=torch.float32, device=device)  # (batch=1, in)
    return max(w.nbytes / _time(lambda: f(x), device, reps) for f in _linears(w))


def _matmul_flops(device: torch.device, dtype: str, m: int, reps: int) -> float:
    """Square (m, m) x (m, m) matmul in dtype, best implementation: 2 * m^3 FLOPs per second."""
    a = torch.randn(m, m, device=device).to(getattr(torch, dtype))
    b = torch.randn(m, m, device=device).to(getattr(torch, dtype))
    return max(2 * m**3 / _time(lambda: f(a), device, reps) for f in _linears(b))


@torch.inference_mode()
def measure_ceilings(device: str | torch.device = "cpu",
                     dtypes: Iterable[str] = ("float32", "bfloat16"),
                     quick: bool = False) -> DeviceCeilings:
    """Measure copy bandwidth, weight-read bandwidth and matmul FLOP/s per dtype (medians).

    quick: 64 MiB buffers and weights and 1024^3 matmuls (about half a second on a 2-core CPU)
    instead of 256 MiB and 2048^3. GPUs get 4x larger matmuls: 2048^3 is too short to fill one.
    """
    device = torch.device(device)
    load = os.getloadavg()[0] if device.type == "cpu" and hasattr(os, "getloadavg") else None
    reps = 3 if quick else 7
    mib, k = (64, 4096) if quick else (256, 8192)  # k * k fp32 weight = mib MiB
    m = (1024 if quick else 2048) * (4 if device.type == "cuda" else 1)
    return DeviceCeilings(
        device=device.type, device_name=device_name(device),
        num_threads=torch.get_num_threads(), torch_version=torch.__version__,
        date=datetime.now().isoformat(timespec="seconds"), quick=quick,
        copy_bandwidth=_copy_bandwidth(device, mib * 2**20, reps),
        # the best of three fresh weights: on a shared machine the reads of one allocation vary by
        # a third from run to run, and a floor below a measured step would be no floor
        weight_read_bandwidth=max(_weight_read_bandwidth(device, k, 2 * reps) for _ in range(3)),
        peak_flops={dtype_name(dt): _matmul_flops(device, dtype_name(dt), m, reps)
                    for dt in dtypes}, load_before=load)


# bumped when the way of measuring changes (4: on huge pages; 5: best of three): older caches
# are not read
CEILINGS_VERSION = 5


def ceilings_cache_path(device: str | torch.device = "cpu") -> str:
    """<cache>/ceilings-<devicekey>.json in nanoserve's cache folder (env.cache_dir).

    The key names the device model, and on CPU the thread count, which the ceilings depend on.
    """
    device = torch.device(device)
    key = f"{device.type}-{device_name(device)}"
    if device.type == "cpu":
        key += f"-{torch.get_num_threads()}t"
    key = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    return env.cache_dir(f"ceilings-v{CEILINGS_VERSION}-{key}.json")


def load_or_measure_ceilings(device: str | torch.device = "cpu", refresh: bool = False,
                             quick: bool = False) -> DeviceCeilings:
    """The cached ceilings of this device, measuring (and caching) them when missing.

    A cached quick measurement does not answer a full request; a full one answers both.
    refresh=True measures again. An unreadable cache file is measured over.
    """
    path = ceilings_cache_path(device)
    if not refresh and os.path.exists(path):
        try:
            with open(path) as f:
                cached = DeviceCeilings(**json.load(f))
            if quick or not cached.quick:
                return cached
        except (OSError, ValueError, TypeError):
            pass
    ceilings = measure_ceilings(device, quick=quick)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(asdict(ceilings), f, indent=1)
    return ceilings
