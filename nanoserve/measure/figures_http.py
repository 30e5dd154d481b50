"""Figures of a server measured from outside (loadgen runs): latency against request rate, and
what HTTP adds over in-process calls.

As measure/figures.py: every figure names where it was measured in its title, every axis has a
unit, each function draws on `ax` (a new figure when None) and returns the Figure.
"""

from __future__ import annotations

import textwrap

from nanoserve.measure.figures import DECODE_COLOR, PREFILL_COLOR, get_axes


def plot_latency_vs_rate(sweep, label: str, axes=None):
    """TTFT (left) and ITL (right) against the achieved request rate: median (line) and p99
    (dashed) of a rate_sweep's runs. Under light load both are flat; near capacity the queue
    grows and TTFT climbs first (requests wait to be admitted), ITL later (bigger batches)."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    # joined in order of achieved rate: near capacity it need not rise with the offered rate
    ms = sorted((res.metrics() for _, res in sweep), key=lambda m: m.request_throughput)
    rates = [m.request_throughput for m in ms]
    for ax, name, color in ((axes[0], "ttft", PREFILL_COLOR), (axes[1], "itl", DECODE_COLOR)):
        ax.plot(rates, [1e3 * getattr(m, name).median for m in ms], "o-", color=color, label="median")
        ax.plot(rates, [1e3 * getattr(m, name).p99 for m in ms], "s--", color=color, label="p99")
        ax.set_xlabel("achieved request rate (req/s)")
        ax.set_ylabel(f"{name.upper()} (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        # two panels side by side: a long device label on one line runs into the other's title
        ax.set_title(f"{name.upper()} seen by the client vs load\n{textwrap.fill(label, 60)}", fontsize=10)
    return axes[0].figure


def plot_http_overhead(batch1, agreement, label: str, ax=None):
    """Median TTFT and ITL in-process and over HTTP, side by side (bars, ms)."""
    import numpy as np
    ax = get_axes(ax, (7, 4))
    names = ["TTFT, one at a time", "TTFT under load", "ITL under load"]
    local = [batch1.in_process_ttft, agreement.in_process.ttft.median, agreement.in_process.itl.median]
    http = [batch1.http_ttft, agreement.http.ttft.median, agreement.http.itl.median]
    x = np.arange(len(names))
    ax.bar(x - 0.2, [1e3 * v for v in local], 0.4, label="in-process (engine clock)", color="tab:gray")
    ax.bar(x + 0.2, [1e3 * v for v in http], 0.4, label="over HTTP (client clock)", color="tab:green")
    ax.set_xticks(x, names)
    ax.set_ylabel("median (ms)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"What HTTP adds\n{label}", fontsize=10)
    return ax.figure
