"""Figures of lesson 04: the same arrivals served under several scheduling policies, from each
run's step trace (re-exported by course.figures, which the lesson imports)."""

from __future__ import annotations

import numpy as np

from nanoserve.course.annotate import titled as _titled
from nanoserve.measure.figures import device_label, get_axes, plot_timeline


def _device(results: dict) -> str:
    """The device line the runs share: each run's own label starts with its policy's name."""
    label = device_label(next(iter(results.values())))
    return label[label.find("measured on"):] if "measured on" in label else label


def plot_timelines(results: dict):
    """plot_timeline of each result (e.g. each scheduling policy) stacked on one time axis."""
    import matplotlib.pyplot as plt
    n = max(len(r.outputs) for r in results.values())
    fig, axes = plt.subplots(len(results), 1, figsize=(10, len(results) * (0.16 * n + 1.6)),
                             sharex=True, constrained_layout=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results.values()):
        plot_timeline(r, ax)
    return fig


def plot_policies(results: dict):
    """Throughput and latency of each run side by side (bars; latencies' p50 and p90)."""
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.6), constrained_layout=True)
    names = list(results)
    ms = {k: r.metrics() for k, r in results.items()}
    colors = [f"C{i}" for i in range(len(names))]
    a.bar(names, [ms[k].output_throughput for k in names], color=colors)
    a.set_ylabel("output tokens/s")
    a.set_title("Throughput", fontsize=10)
    x = np.arange(len(names))
    for ax, metric, title in ((b, "ttft", "Time to first token"), (c, "e2e", "End-to-end latency")):
        s = [getattr(ms[k], metric) for k in names]
        ax.bar(x - 0.2, [1e3 * v.median for v in s], 0.4, color=colors, label="p50")
        ax.bar(x + 0.2, [1e3 * v.p90 for v in s], 0.4, color=colors, alpha=0.5, label="p90")
        ax.set_xticks(x, names)
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_title(title + " (p50, p90 pale)", fontsize=10)
    for ax in (a, b, c):
        ax.set_xlabel("scheduling policy")
        ax.grid(True, axis="y", alpha=0.3)
    first = next(iter(results.values()))
    fig.suptitle(f"{first.workload.name}, served {len(names)} ways\n{_device(results)}", fontsize=10)
    return fig


def plot_batch_occupancy(results: dict, ax=None):
    """Sequences in each step against time, one line per run: how full each policy keeps the batch."""
    ax = get_axes(ax, (9, 3.2))
    for name, r in results.items():
        ax.step([s.start - r.start for s in r.trace], [len(s.entries) for s in r.trace], where="post",
                label=f"{name}: mean {np.mean([len(s.entries) for s in r.trace]):.2f} per step")
    cap = max(r.config.max_num_seqs for r in results.values())
    ax.axhline(cap, color="grey", ls=":", label=f"max_num_seqs = {cap}")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("sequences in the step")
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count: no 2.5 sequences
    # below the axes: inside, the steps reach every height somewhere along the run
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    ax.grid(True, alpha=0.3)
    _titled(ax, "How full the batch is", _device(results))
    return ax.figure
