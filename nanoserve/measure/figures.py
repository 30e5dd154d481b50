"""Figures of a measured run (a bench.BenchResult): who ran when, latency, step times; the label
and colours every figure of the course shares.

Every figure names the device it was measured on in its title, and every axis has a unit.
Each function draws on `ax` (a new figure when None) and returns the Figure. matplotlib is
imported inside the functions so that importing nanoserve never needs a display backend.
Deliberately left out: the roofline plot (roofline.plot_roofline) and the lessons' figures
(nanoserve.course).
"""

from __future__ import annotations

import numpy as np
import torch

from nanoserve.engine import engine_of
from nanoserve.measure.ceilings import device_name, dtype_name
from nanoserve.measure.metrics import completed, itls, ttft

PREFILL_COLOR, DECODE_COLOR = "tab:orange", "tab:blue"
MEASURED_COLOR, MODELLED_COLOR = "black", "tab:purple"


def get_axes(ax, size=(8, 4)):
    """`ax`, or the axes of a new figure of `size` inches."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=size, constrained_layout=True)
    return ax


def plain_log_ticks(ax, axis: str = "y") -> None:
    """Label the log axis "x", "y" or "both" of ax with plain numbers (0.01, 20, 300) instead of
    powers (10^2, 6x10^0, 2^4); minor ticks (2, 3, 5 x a decade) are labelled only when the axis
    spans under two decades, and every one when it spans under 3x (else it might show no label).
    A linear axis is left as it is."""
    from matplotlib.ticker import FuncFormatter
    for a in (ax.xaxis, ax.yaxis) if axis == "both" else (getattr(ax, f"{axis}axis"),):
        if a.get_scale() != "log":
            continue

        def minor(v, _, a=a):
            lo, hi = sorted(a.get_view_interval())
            if lo <= 0 or hi / lo > 100 or (hi / lo > 3 and f"{v:.1e}"[0] not in "235"):
                return ""
            return f"{v:.6g}"
        a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
        a.set_minor_formatter(FuncFormatter(minor))


def _threads(n: int) -> str:
    return f" ({n} thread{'' if n == 1 else 's'})"


def device_label(x) -> str:
    """What a measurement ran on, for figure titles: 'measured on <device> (<threads>), <dtype>,
    <model>' for an LLM or engine (model: its name, or its parameter count); 'measured on
    <device> (<threads>)' for DeviceCeilings; a BenchResult's own label; a string as is."""
    if isinstance(x, str):
        return x
    if hasattr(x, "device_label"):  # a BenchResult
        return x.device_label
    if hasattr(x, "peak_flops"):  # DeviceCeilings
        threads = _threads(x.num_threads) if x.device == "cpu" else ""
        return f"measured on {x.device_name}{threads}"
    engine = engine_of(x)
    dev = torch.device(engine.device)
    threads = _threads(torch.get_num_threads()) if dev.type == "cpu" else ""
    name = engine.model_name or f"{engine.model_config.num_params() / 1e6:.0f}M-param model"
    return f"measured on {device_name(dev)}{threads}, {dtype_name(engine.dtype)}, {name}"


def _title(ax, what: str, result) -> None:
    ax.set_title(f"{what}: {result.workload.name}\n{result.device_label}", fontsize=10)


def plot_timeline(result, ax=None):
    """One row per request: its prefill chunks and decode steps as bars along time, its arrival
    as a tick. Runs of consecutive steps are merged into one bar; a gap is a step it sat out."""
    ax = get_axes(ax, (9, max(3.0, 0.18 * len(result.outputs) + 1.5)))
    row = {o.request_id: i for i, o in enumerate(result.outputs)}
    spans: dict[tuple[int, str], list[list[float]]] = {}
    last: dict[tuple[int, str], int] = {}
    for rec in result.trace:
        t0, t1 = rec.start - result.start, rec.end - result.start
        for rid, kind, *_ in rec.entries:
            key = (row[rid], kind)
            if last.get(key) == rec.step - 1:
                spans[key][-1][1] = t1  # still running: extend the bar
            else:
                spans.setdefault(key, []).append([t0, t1])
            last[key] = rec.step
    for (i, kind), bars in spans.items():
        ax.broken_barh([(a, b - a) for a, b in bars], (i - 0.4, 0.8),
                       color=PREFILL_COLOR if kind == "prefill" else DECODE_COLOR)
    arrivals = [o.metrics.arrival_time - result.start for o in result.outputs]
    ax.plot(arrivals, range(len(arrivals)), "k|", markersize=8)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=PREFILL_COLOR, label="prefill"),
                       Patch(color=DECODE_COLOR, label="decode"),
                       Line2D([], [], color="k", marker="|", ls="", label="arrival")],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside: inside, it hides bars
    ax.set_ylim(len(arrivals) - 0.5, -0.5)  # request 0 on top
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("request (workload order)")
    _title(ax, "Who ran when", result)
    return ax.figure


def _ecdf(ax, values_s, label: str) -> None:
    x = np.sort(np.asarray(values_s, dtype=float)) * 1e3
    if len(x):
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post",
                label=f"{label} (n={len(x)}, median {np.median(x):.1f} ms)")


def plot_latency(result, ax=None):
    """Cumulative distributions of TTFT (per request) and ITL (every gap, pooled), log time."""
    ax = get_axes(ax)
    done = [o for o in result.outputs if completed(o)]
    _ecdf(ax, [ttft(o) for o in done], "TTFT")
    _ecdf(ax, [g for o in done for g in itls(o)], "ITL")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of samples at or below")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    _title(ax, "Latency distributions", result)
    return ax.figure


def plot_step_times(result, ax=None):
    """Each step's duration against its index, coloured by the prefill tokens it carried and
    sized by its decode tokens: prefill-heavy steps stand out above the decode band."""
    ax = get_axes(ax)
    trace = result.trace
    dur = [1e3 * r.duration for r in trace]
    pre = [r.num_prefill_tokens for r in trace]
    size = [8 + 2 * r.num_decode_tokens for r in trace]
    points = ax.scatter(range(len(trace)), dur, c=pre, s=size, cmap="viridis", alpha=0.8)
    ax.figure.colorbar(points, ax=ax, label="prefill tokens in step")
    ax.set_xlabel("step (index in this run); marker size: decode tokens")
    ax.set_ylabel("step time (ms)")
    ax.grid(True, alpha=0.3)
    _title(ax, "Step times", result)
    return ax.figure


def save_bench_figure(result, path: str) -> None:
    """The three figures of a run side by side in one image file."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(20, 5), constrained_layout=True)
    plot_timeline(result, axes[0])
    plot_latency(result, axes[1])
    plot_step_times(result, axes[2])
    fig.savefig(path, dpi=110)
    plt.close(fig)
