"""The roofline: measure the device's ceilings, count a step's FLOPs and bytes, plot both.

Three parts:
- `measure_ceilings` times a large copy (memory bandwidth), a batch-1 matrix-vector product
  on a large weight (weight-read bandwidth: the best a decode step can do) and square matmuls
  (peak FLOP/s per dtype), each the best of F.linear and, on CPU, oneDNN's packed weights;
  `load_or_measure_ceilings` caches them per device in a small JSON.
- `step_cost` counts the FLOPs and the compulsory bytes of one model step from a ModelConfig
  and a batch given as (query_len, context_len) per sequence, split by term.
- `roofline_time`, `decode_step_floor`, `ridge_point`, `critical_batch_size`, `mbu`, `mfu`
  and `plot_roofline` turn the two into floors, efficiencies and a figure.

Units are SI throughout: bytes, FLOPs, seconds, bytes/s, FLOP/s (1 GB = 1e9 bytes).
Left out on purpose: elementwise work (RMSNorm, RoPE, SiLU*mul, residual adds), the embedding
gather and sampling. They are a few percent of a step's bytes and far less of its FLOPs;
leaving them out keeps the count checkable by hand. Bytes are compulsory traffic (each weight
and each KV entry read once per step), so real kernels move at least this much, never less.
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

from nanoserve.config import ModelConfig
from nanoserve.kernels import cpu_gemm

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


# --- Measuring the ceilings ---

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


def _device_name(device: torch.device) -> str:
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
    """The ways this device can multiply by weight w: F.linear, and on CPU oneDNN's packed
    layout when it supports the dtype (what the engine runs, kernels/cpu_gemm.py)."""
    fns = [lambda x: F.linear(x, w)]
    if w.device.type == "cpu" and cpu_gemm.supported(w.dtype):
        packed = cpu_gemm.pack(w)
        fns.append(lambda x: cpu_gemm.linear(x, packed))
    return fns


def _weight_read_bandwidth(device: torch.device, k: int, reps: int) -> float:
    """Batch-1 fp32 matrix-vector product, decode's inner loop: weight bytes per second.
    The best of the available implementations, so that a floor is one no kernel beat."""
    w = torch.randn(k, k, dtype=torch.float32, device=device)  # (out, in)
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
        device=device.type, device_name=_device_name(device),
        num_threads=torch.get_num_threads(), torch_version=torch.__version__,
        date=datetime.now().isoformat(timespec="seconds"), quick=quick,
        copy_bandwidth=_copy_bandwidth(device, mib * 2**20, reps),
        weight_read_bandwidth=_weight_read_bandwidth(device, k, 2 * reps),
        peak_flops={dtype_name(dt): _matmul_flops(device, dtype_name(dt), m, reps)
                    for dt in dtypes}, load_before=load)


CEILINGS_VERSION = 2  # bumped when the way of measuring changes: older caches are not read


def ceilings_cache_path(device: str | torch.device = "cpu") -> str:
    """~/.cache/nanoserve/ceilings-<devicekey>.json ($NANOSERVE_CACHE_DIR replaces the folder).

    The key names the device model, and on CPU the thread count, which the ceilings depend on.
    """
    device = torch.device(device)
    key = f"{device.type}-{_device_name(device)}"
    if device.type == "cpu":
        key += f"-{torch.get_num_threads()}t"
    key = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    folder = os.environ.get("NANOSERVE_CACHE_DIR") or os.path.expanduser("~/.cache/nanoserve")
    return os.path.join(folder, f"ceilings-v{CEILINGS_VERSION}-{key}.json")


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


def format_ceilings(c: DeviceCeilings) -> str:
    """A small table of the ceilings, with the ridge point and critical batch per dtype."""
    lines = [
        f"device   {c.device_name} ({c.device}, {c.num_threads} threads)",
        f"torch    {c.torch_version}, measured {c.date}{' (quick)' if c.quick else ''}",
        f"copy bandwidth, read + written         {c.copy_bandwidth / 1e9:8.1f} GB/s",
        f"weight-read bandwidth, fp32 batch 1    {c.weight_read_bandwidth / 1e9:8.1f} GB/s",
        f"{'matmul':<10}{'GFLOP/s':>10}{'ridge FLOP/B':>14}{'critical batch':>16}",
    ]
    for name, flops in c.peak_flops.items():
        lines.append(f"{name:<10}{flops / 1e9:10.1f}{ridge_point(c, name):14.1f}"
                     f"{critical_batch_size(c, name):16.1f}")
    if c.load_before is not None and c.load_before > c.num_threads / 2:
        lines.append(f"warning: load average {c.load_before:.1f} before measuring; other work "
                     "was running, so these ceilings may be low (refresh when idle)")
    return "\n".join(lines)


# --- Counting one step ---

@dataclass
class StepCost:
    """FLOPs and compulsory bytes of one step, split by term: "linear", "attention", "lm_head"."""

    flops: dict[str, float]
    bytes: dict[str, float]
    num_tokens: int  # query tokens in the step (prefill + decode)
    num_logits: int  # tokens that go through lm_head

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values())

    @property
    def intensity(self) -> float:
        """Arithmetic intensity of the whole step, FLOP/byte."""
        return self.total_flops / self.total_bytes

    def intensity_of(self, term: str) -> float:
        """Arithmetic intensity of one term, FLOP/byte."""
        return self.flops[term] / self.bytes[term]


def decode_batch(batch_size: int, context_len: int) -> list[tuple[int, int]]:
    """batch_size sequences decoding one token each, attending to context_len tokens."""
    return [(1, context_len)] * batch_size


def prefill_batch(prompt_len: int, num_prompts: int = 1) -> list[tuple[int, int]]:
    """num_prompts whole prompts of prompt_len tokens, prefilled from scratch."""
    return [(prompt_len, prompt_len)] * num_prompts


def step_cost(cfg: ModelConfig, batch: Iterable[tuple], dtype_bytes: int = 4,
              kv_dtype_bytes: int | None = None) -> StepCost:
    """Count the FLOPs and bytes of one step over `batch`.

    batch: one tuple per sequence, (query_len, context_len) or (query_len, context_len,
    produces_logits). query_len tokens are computed this step; context_len is the KV length
    they attend to *including* themselves (num_computed_tokens + query_len). Decode: (1, ctx);
    a whole prompt: (P, P); a chunk of a prompt: (chunk, done + chunk, is_last_chunk).
    dtype_bytes: bytes per weight and activation; kv_dtype_bytes: per KV entry (default: same).

    - linear (q/k/v, o, gate/up, down of every layer): FLOPs 2 * tokens * in * out (+ tokens *
      out per bias); bytes = every weight once per step + inputs read and outputs written
      (q/k/v and gate/up counted as fused projections: their input is read once).
    - attention: causal, so query i of a chunk (0-based) sits at position ctx - q + i and sees
      ctx - q + i + 1 keys; summed, q * (ctx - q) + q * (q + 1) / 2 query-key pairs (q * ctx
      minus the masked triangle: about half of q * ctx for a whole prompt). Each pair costs
      2 * head_dim FLOPs in QK^T and 2 * head_dim in PV, per query head. Bytes: the whole K and
      V of the context read once, the new K and V written, Q read and the output written.
      Kernels that compute the masked triangle anyway do more FLOPs than this useful count.
    - lm_head: 2 * vocab * hidden FLOPs per logit-producing token (the last of each sequence
      unless told otherwise); bytes: the vocab x hidden weight once (if any token needs it),
      hidden states in, logits out.
    """
    kvb = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    q_dim, kv_dim = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    tokens = pairs = ctx_total = logits = 0
    for seq in batch:
        q, ctx = int(seq[0]), int(seq[1])
        if not 1 <= q <= ctx:
            raise ValueError(f"batch entry {tuple(seq)}: need 1 <= query_len <= context_len")
        tokens += q
        pairs += q * (ctx - q) + q * (q + 1) // 2
        ctx_total += ctx
        logits += bool(seq[2]) if len(seq) > 2 else 1

    # (in, out) of each projection of one layer; qkv and gate_up fused
    projections = [(h, q_dim + 2 * kv_dim), (q_dim, h), (h, 2 * inter), (inter, h)]
    weights = sum(i * o for i, o in projections)  # per layer
    bias = q_dim + 2 * kv_dim if cfg.attention_bias else 0  # per layer, on q/k/v
    acts = sum(i + o for i, o in projections)  # per token per layer, elements in + out
    flops = {
        "linear": layers * (2 * tokens * weights + tokens * bias),
        "attention": layers * 4 * pairs * q_dim,  # q_dim = num_heads * head_dim
        "lm_head": 2 * logits * cfg.vocab_size * h,
    }
    nbytes = {
        "linear": layers * ((weights + bias) * dtype_bytes + tokens * acts * dtype_bytes),
        "attention": layers * (2 * ctx_total * kv_dim * kvb  # K and V of the context, read
                               + 2 * tokens * kv_dim * kvb  # this step's K and V, written
                               + 2 * tokens * q_dim * dtype_bytes),  # Q read, output written
        "lm_head": (cfg.vocab_size * h * dtype_bytes if logits else 0)
                   + logits * (h + cfg.vocab_size) * dtype_bytes,
    }
    return StepCost(flops=flops, bytes=nbytes, num_tokens=tokens, num_logits=logits)


# --- Floors, efficiencies, the plot ---

def ridge_point(ceilings: DeviceCeilings, dtype: str | torch.dtype) -> float:
    """Arithmetic intensity (FLOP/byte) where the bandwidth slope meets the compute roof."""
    return ceilings.peak(dtype) / ceilings.bandwidth


def critical_batch_size(ceilings: DeviceCeilings, dtype: str | torch.dtype) -> float:
    """Decode batch at which the linear layers reach the ridge point.

    A decode step over B sequences does 2 * B FLOPs per weight and reads each weight's
    dtype_bytes once, so its intensity is 2 * B / dtype_bytes; equal to the ridge at
    B = ridge * dtype_bytes / 2. Below it, a bigger batch is nearly free.
    """
    return ridge_point(ceilings, dtype) * dtype_bytes(dtype) / 2


def roofline_time(cost: StepCost, ceilings: DeviceCeilings, dtype: str | torch.dtype) -> float:
    """The roofline floor of a step, seconds: max(bytes / bandwidth, FLOPs / peak)."""
    return max(cost.total_bytes / ceilings.bandwidth, cost.total_flops / ceilings.peak(dtype))


def decode_step_floor(cfg: ModelConfig, batch_size: int, context_len: int,
                      ceilings: DeviceCeilings, dtype: str | torch.dtype) -> float:
    """Roofline floor, seconds, of one decode step of batch_size sequences at context_len."""
    cost = step_cost(cfg, decode_batch(batch_size, context_len), dtype_bytes(dtype))
    return roofline_time(cost, ceilings, dtype)


def mbu(cost: StepCost, seconds: float, ceilings: DeviceCeilings) -> float:
    """Model bandwidth utilisation: achieved bytes/s over the measured bandwidth (0..~1)."""
    return cost.total_bytes / seconds / ceilings.bandwidth


def mfu(cost: StepCost, seconds: float, ceilings: DeviceCeilings,
        dtype: str | torch.dtype) -> float:
    """Model FLOP/s utilisation: achieved FLOP/s over the measured matmul peak (0..~1)."""
    return cost.total_flops / seconds / ceilings.peak(dtype)


def roofline_point(label: str, cost: StepCost, seconds: float) -> tuple[str, float, float]:
    """A measured step as a plot point: (label, FLOP/byte, achieved FLOP/s)."""
    return label, cost.intensity, cost.total_flops / seconds


def plot_roofline(ceilings: DeviceCeilings, dtype: str | torch.dtype,
                  points: Iterable[tuple[str, float, float]] = (), ax=None):
    """Log-log roofline of one device and dtype, with measured points placed on it.

    points: (label, intensity in FLOP/byte, achieved FLOP/s), e.g. from roofline_point.
    Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt  # plotting stays out of the engine's import path
    import numpy as np

    name, points = dtype_name(dtype), list(points)
    bw, peak, ridge = ceilings.bandwidth, ceilings.peak(dtype), ridge_point(ceilings, dtype)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    xs = [ridge] + [p[1] for p in points]
    x = np.logspace(np.log10(min(xs) / 10), np.log10(max(xs) * 10), 200)  # FLOP/byte
    ax.loglog(x, np.minimum(bw * x, peak) / 1e9, color="k", lw=2)
    ax.loglog(x[x < ridge], bw * x[x < ridge] / 1e9, color="tab:blue", lw=2,
              label=f"memory: {bw / 1e9:.1f} GB/s (batch-1 weight read)")
    ax.axhline(peak / 1e9, color="tab:red", ls="--", lw=1,
               label=f"compute: {peak / 1e9:.0f} GFLOP/s ({name} matmul)")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.1f} FLOP/B", (ridge, peak / 1e9), textcoords="offset points",
                xytext=(5, -15), fontsize=9, color="grey")
    for label, intensity, achieved in points:
        ax.plot(intensity, achieved / 1e9, "o")
        ax.annotate(label, (intensity, achieved / 1e9), textcoords="offset points",
                    xytext=(5, 4), fontsize=9)
    threads = f", {ceilings.num_threads} threads" if ceilings.device == "cpu" else ""
    ax.set_title(f"Roofline ({name}), measured on {ceilings.device_name}{threads}")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable performance (GFLOP/s)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure
