"""Lesson 00: this device's ceilings, a linear layer timed at growing batch against them, and the
batch-1 weight read per dtype (the roofline's slope is the fp32 one)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanoserve.config import default_device
from nanoserve.course.setup import Table, quick_mode
from nanoserve.kernels import cpu_gemm
from nanoserve.measure import roofline
from nanoserve.measure.roofline import dtype_bytes, dtype_name


def device_ceilings(device: str | None = None, refresh: bool = False) -> roofline.DeviceCeilings:
    """This device's measured ceilings (cached per device; quick sizes in quick mode)."""
    return roofline.load_or_measure_ceilings(device or default_device(), refresh=refresh,
                                             quick=quick_mode())


def _median_time(fn, device: torch.device, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@dataclass
class LinearPoint:
    """One linear layer of a (batch, k) input by a (k, k) weight, timed here."""

    batch: int
    k: int
    dtype: str
    seconds: float = math.nan  # measured; nan when only counting
    kernel: str = "F.linear"

    @property
    def flops(self) -> float:
        return 2 * self.batch * self.k * self.k

    @property
    def bytes(self) -> float:  # weight read once, input read, output written
        return (self.k * self.k + 2 * self.batch * self.k) * dtype_bytes(self.dtype)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def achieved(self) -> float:
        return self.flops / self.seconds


@torch.inference_mode()
def linear_sweep(ceilings: roofline.DeviceCeilings, batches: Sequence[int], k: int,
                 dtype: str | None = None, reps: int = 5) -> list[LinearPoint]:
    """Time a linear layer at growing batch on the ceilings' device: a decode step's inner loop."""
    dev = torch.device(ceilings.device)
    dtype = dtype_name(dtype or ("float32" if dev.type == "cpu" else "bfloat16"))
    w = torch.randn(k, k, device=dev).to(getattr(torch, dtype))  # (out, in)
    kernel, linear = cpu_gemm.linear_for(w)  # what the engine runs on this device
    out = []
    for b in batches:
        x = torch.randn(b, k, device=dev).to(w.dtype)  # (batch, in)
        out.append(LinearPoint(b, k, dtype, _median_time(lambda: linear(x), dev, reps), kernel))
    return out


def linear_table(points: Sequence[LinearPoint], ceilings: roofline.DeviceCeilings) -> Table:
    def roof(p):
        return min(ceilings.bandwidth * p.intensity, ceilings.peak(p.dtype))
    rows = [{"batch": p.batch, "FLOP/byte": round(p.intensity, 2), "ms": round(1e3 * p.seconds, 3),
             "GFLOP/s": round(p.achieved / 1e9, 1), "roofline GFLOP/s": round(roof(p) / 1e9, 1)}
            for p in points]
    p = points[0]
    return Table(rows, f"{p.kernel}, ({p.k} x {p.k}) {p.dtype} weight, measured")


def weight_read_table(ceilings: roofline.DeviceCeilings, k: int,
                      dtypes: Sequence[str] = ("float32", "bfloat16")) -> Table:
    """The batch-1 weight read of a (k, k) linear layer in each dtype, timed here with the engine's
    linear, beside the roofline's slope: measure.ceilings times it in fp32 only, and every
    roofline (bf16 ones included) uses that one slope."""
    rows = []
    for dtype in dtypes:
        p, = linear_sweep(ceilings, [1], k, dtype)
        rows.append({"dtype": p.dtype, "kernel": p.kernel, "ms": 1e3 * p.seconds,
                     "weight-read GB/s": p.bytes / p.seconds / 1e9,
                     "vs the roofline's slope": f"{p.bytes / p.seconds / ceilings.bandwidth:.0%}"})
    return Table(rows, f"Batch-1 ({k} x {k}) linear layer, measured; the roofline's slope is "
                       f"{ceilings.bandwidth / 1e9:.1f} GB/s (fp32)")
