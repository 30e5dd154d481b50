"""Lesson 13's figures: batch-1 decode per weight format against its floor, and what an fp8 KV
cache changes on a memory-limited engine (blocks, most requests running, goodput)."""

from __future__ import annotations

from collections.abc import Sequence

from nanoserve.course.setup import slo_text
from nanoserve.measure.figures import MEASURED_COLOR, MODELLED_COLOR
from nanoserve.measure.metrics import parse_slo


def plot_weight_formats(rows: Sequence, device: str, ax=None):
    """Measured batch-1 ITL per weight format, its roofline floor beside it."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [1e3 * r.itl_s for r in rows], 0.4, color=MEASURED_COLOR,
           label="measured ITL")
    ax.bar([i + 0.2 for i in x], [1e3 * r.floor_s for r in rows], 0.4, color=MODELLED_COLOR,
           label="floor (modelled): bytes / measured bandwidth")
    for i, r in enumerate(rows):
        ax.text(i - 0.2, 1e3 * r.itl_s, f"{r.share_of_floor:.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [r.weight_format for r in rows])
    ax.set_xlabel("weight format (the 8-bit ones: bf16 activations)")
    ax.set_ylabel("batch-1 decode step (ms)")
    ax.set_title(f"Fewer bytes per weight\n{device}", fontsize=10)
    ax.margins(y=0.15)  # room for the notes above the bars
    # a bare "36%" above a bar says nothing of what it is a share of
    ax.legend(fontsize=8, title="% above a bar: floor / measured ITL", title_fontsize=8)
    return ax


def plot_kv_dtype(capacity_rows: Sequence, saturated: Sequence, runs: Sequence, slo: str, device: str,
                  axes=None):
    """Left: blocks in the same memory and the largest batch that fits; right: goodput at the SLO
    against the offered rate per kv_cache_dtype, each engine's served rate with every request at
    once dashed (all measured; kv_dtype.load_sweep)."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    ax, bx = axes
    names = [r.kv_cache_dtype for r in capacity_rows]
    ax.bar(names, [r.num_kv_blocks for r in capacity_rows], color=MEASURED_COLOR)
    for i, r in enumerate(capacity_rows):
        ax.text(i, r.num_kv_blocks, f"max batch {r.max_batch}", ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("kv_cache_dtype")
    ax.set_ylabel("KV blocks in the same memory")
    ax.set_title("Capacity", fontsize=10)
    ax.margins(y=0.15)  # room for the notes above the bars
    for sat, color, marker in zip(saturated, (MEASURED_COLOR, "tab:green"), "os"):
        mine = [r for r in runs if r.kv_cache_dtype == sat.kv_cache_dtype]
        bx.plot([r.rate for r in mine], [r.goodput for r in mine], marker=marker, color=color,
                label=f"{sat.kv_cache_dtype}: goodput")
        bx.axhline(sat.served_rate, color=color, linestyle="--", linewidth=1,
                   label=f"{sat.kv_cache_dtype}: served with all at once ({sat.served_rate:.3g} req/s)")
    rates = sorted({r.rate for r in runs})
    bx.plot(rates, rates, ":", color="gray", label="offered: every request within the SLO")
    bx.set_xlabel("offered rate (req/s, Poisson)")
    bx.set_ylabel("goodput (req/s)")
    bx.set_ylim(bottom=0)
    bx.legend(fontsize=8)
    bx.set_title(f"Goodput within {slo_text(parse_slo(slo))}\n{device}", fontsize=10)
    return axes
