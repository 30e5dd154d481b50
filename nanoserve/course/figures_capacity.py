"""Lesson 03's figures of KV traffic: decode step time over batch x context (measured, the
roofline floor beside it) and the KV-capacity explorer's memory and step-time bars (modelled)."""

from __future__ import annotations

from collections.abc import Sequence

from nanoserve.measure.figures import MEASURED_COLOR, MODELLED_COLOR, plain_log_ticks


def plot_batch_context(points: Sequence, ceilings, dtype: str, crossover: float, device: str,
                       axes=None):
    """Left: measured step time against batch, one line per context, each with its roofline
    floor (dashed). Right: the same steps against B x context, the KV tokens the step reads,
    with the point where the KV read equals the weight read."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    ax, bx = axes
    contexts = sorted({p.context_len for p in points})
    colors = plt.cm.viridis([i / max(1, len(contexts) - 1) * 0.85 for i in range(len(contexts))])
    for ctx, color in zip(contexts, colors):
        row = sorted((p for p in points if p.context_len == ctx), key=lambda p: p.batch)
        b = [p.batch for p in row]
        ax.plot(b, [1e3 * p.step_seconds for p in row], "o-", color=color, label=f"context {ctx}")
        ax.plot(b, [1e3 * p.floor(ceilings, dtype) for p in row], "--", color=color, lw=1)
        bx.plot([p.kv_tokens for p in row], [1e3 * p.step_seconds for p in row], "o", color=color,
                label=f"context {ctx}")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        plain_log_ticks(a, "both")
        a.set_ylabel("decode step (ms, log)")
        a.grid(True, which="both", alpha=0.3)
    ax.set_xlabel("batch size B (log)")
    ax.set_title("Step vs batch; dashed: roofline floor", fontsize=10)
    ax.legend(fontsize=9)  # two panels at a notebook's width: 8 points would show as 7 pixels
    # the crossover as a legend entry: a note beside the line could sit on a point; the points
    # rise to the right, so the upper left stays clear
    bx.axvline(crossover, color=MODELLED_COLOR, ls=":", lw=1.2, label="KV read = weight read (modelled)")
    bx.legend(fontsize=9, loc="upper left")
    bx.set_xlabel("B x context: KV tokens read per step (log)")
    bx.set_title("Step vs KV tokens read", fontsize=10)
    ax.figure.suptitle(f"Decode over batch x context, {device}", fontsize=10)
    return ax.figure


def plot_capacity(cap, axes=None):
    """Left: memory split into weights, KV of the largest batch, and what is left. Right: a
    decode step at that batch, weight read vs KV read vs compute (all modelled)."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 2.6), constrained_layout=True)
    ax, bx = axes
    kv = cap.max_batch * cap.kv_bytes_per_request
    left = max(0.0, cap.memory - cap.weight_bytes - kv)
    start = 0.0
    for label, value, color in (("weights", cap.weight_bytes, MEASURED_COLOR),
                                (f"KV, {cap.max_batch} requests", kv, "tab:blue"),
                                ("unused", left, "0.85")):
        ax.barh(0, value / 1e9, left=start / 1e9, color=color, label=label)
        start += value
    ax.set_yticks([])
    ax.set_xlabel("GB")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, frameon=False)
    ax.set_title(f"Memory: max batch {cap.max_batch}", fontsize=10)
    names = ["weights", "KV", "compute"]
    values = [1e3 * cap.weight_read_s, 1e3 * cap.kv_read_s, 1e3 * cap.compute_s]
    bx.barh(names, values, color=[MEASURED_COLOR, "tab:blue", "tab:red"])
    bx.invert_yaxis()
    bx.set_xlabel("ms per decode step")
    bound = "memory" if cap.weight_read_s + cap.kv_read_s >= cap.compute_s else "compute"
    bx.set_title(f"Step floor {1e3 * cap.floor_s:.1f} ms: {bound}-bound", fontsize=10)
    ax.figure.suptitle(f"{cap.model}, context {cap.context_len} (modelled)", fontsize=10)
    return ax.figure
