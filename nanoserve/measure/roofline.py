"""The roofline: measure the device's ceilings, count a step's FLOPs and bytes, plot both.

Three parts:
- the device's measured ceilings (ceilings.py, re-exported here: `measure_ceilings`,
  `load_or_measure_ceilings`, `DeviceCeilings`), and `format_ceilings` to print them.
- `step_cost` counts the FLOPs and the compulsory bytes of one model step from a ModelConfig
  and a batch given as (query_len, context_len) per sequence, split by term; `stored_step_cost`
  the same with a loaded model's weights at their stored size (8-bit codes).
- `roofline_time`, `decode_step_floor`, `ridge_point`, `critical_batch_size`, `mbu`, `mfu`
  and `plot_roofline` turn the two into floors, efficiencies and a figure.

Units are SI throughout: bytes, FLOPs, seconds, bytes/s, FLOP/s (1 GB = 1e9 bytes).
Left out on purpose: elementwise work (RMSNorm, RoPE, SiLU*mul, residual adds), the embedding
gather and sampling. They are a few percent of a step's bytes and far less of its FLOPs;
leaving them out keeps the count checkable by hand. Bytes are compulsory traffic (each weight
and each KV entry read once per step), so real kernels move at least this much, never less.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from nanoserve.config import ModelConfig
from nanoserve.measure.ceilings import (  # noqa: F401 (the roofline API names them)
    CEILINGS_VERSION,
    DeviceCeilings,
    ceilings_cache_path,
    device_name,
    dtype_bytes,
    dtype_name,
    load_or_measure_ceilings,
    measure_ceilings,
)


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
              kv_dtype_bytes: int | None = None, weight_dtype_bytes: float | None = None,
              lm_head_dtype_bytes: float | None = None) -> StepCost:
    """Count the FLOPs and bytes of one step over `batch`.

    batch: one tuple per sequence, (query_len, context_len) or (query_len, context_len,
    produces_logits). query_len tokens are computed this step; context_len is the KV length
    they attend to *including* themselves (num_computed_tokens + query_len). Decode: (1, ctx);
    a whole prompt: (P, P); a chunk of a prompt: (chunk, done + chunk, is_last_chunk).
    dtype_bytes: bytes per weight and activation; kv_dtype_bytes: per KV entry (default: same);
    weight_dtype_bytes: per weight of the linear layers (default: same), e.g. 1 plus the scales'
    share for 8-bit codes (model/quantization.py); lm_head_dtype_bytes: per weight of the lm_head
    (default: dtype_bytes; 8-bit codes with quantization_lm_head).

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
    wb = dtype_bytes if weight_dtype_bytes is None else weight_dtype_bytes
    hb = dtype_bytes if lm_head_dtype_bytes is None else lm_head_dtype_bytes
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
        "linear": layers * (weights * wb + bias * dtype_bytes + tokens * acts * dtype_bytes),
        "attention": layers * (2 * ctx_total * kv_dim * kvb  # K and V of the context, read
                               + 2 * tokens * kv_dim * kvb  # this step's K and V, written
                               + 2 * tokens * q_dim * dtype_bytes),  # Q read, output written
        "lm_head": (cfg.vocab_size * h * hb if logits else 0)
                   + logits * (h + cfg.vocab_size) * dtype_bytes,
    }
    return StepCost(flops=flops, bytes=nbytes, num_tokens=tokens, num_logits=logits)


# --- Floors, efficiencies, the plot ---

def quantized_weight_bytes(model: torch.nn.Module) -> float | None:
    """Bytes per weight of `model`'s quantized decoder linears, codes and scales together
    (step_cost's weight_dtype_bytes); None where none is quantized."""
    head = getattr(model, "lm_head_quant", None)
    return _code_bytes([m for m in model.modules() if hasattr(m, "qweight") and m is not head])


def lm_head_weight_bytes(model: torch.nn.Module) -> float | None:
    """Bytes per weight of `model`'s quantized lm_head (step_cost's lm_head_dtype_bytes); None
    where the lm_head keeps the model's dtype."""
    head = getattr(model, "lm_head_quant", None)
    return None if head is None else _code_bytes([head])


def stored_step_cost(model: torch.nn.Module, cfg: ModelConfig, batch: Iterable[tuple],
                     dtype_bytes: int = 4, kv_dtype_bytes: int | None = None) -> StepCost:
    """step_cost with `model`'s decoder linears and lm_head at the size they are stored: 8-bit
    codes and their scales where the model holds them, else dtype_bytes."""
    return step_cost(cfg, batch, dtype_bytes, kv_dtype_bytes, quantized_weight_bytes(model),
                     lm_head_weight_bytes(model))


def _code_bytes(layers) -> float | None:
    if not layers:
        return None
    stored = sum(m.qweight.nbytes + m.weight_scale.nbytes for m in layers)
    return stored / sum(m.qweight.numel() for m in layers)


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
    # named in the legend: a label on the plot would sit where the points of a batch sweep cross it
    ax.axvline(ridge, color="grey", ls=":", lw=1, label=f"ridge point: {ridge:.1f} FLOP/byte")
    for label, intensity, achieved in points:
        ax.plot(intensity, achieved / 1e9, "o")
        ax.annotate(label, (intensity, achieved / 1e9), textcoords="offset points",
                    xytext=(5, 4), fontsize=9)
    from nanoserve.measure.figures import device_label, plain_log_ticks
    ax.set_title(f"Roofline ({name}), {device_label(ceilings)}")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable performance (GFLOP/s)")
    plain_log_ticks(ax, "both")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure
