"""Lesson 05: decoders' ITL over time, the budget trade-off, and the budget slider."""

from __future__ import annotations

import math

import numpy as np

from nanoserve.course.widgets.common import log_axis, plot_ccdf, show_figure
from nanoserve.measure.figures import DECODE_COLOR, PREFILL_COLOR, get_axes
from nanoserve.measure.metrics import completed, itls


def plot_itl_timeline(run, ax=None):
    """Each decoder's inter-token latency against time; shaded: a long prompt waiting for its
    first token (arrival to first token)."""
    ax = get_axes(ax, (9, 3.6))
    res = run.result
    for o in res.outputs:
        if o.request_id in run.long_ids or not completed(o):
            continue
        t = np.asarray(o.metrics.token_times[1:]) - res.start
        ax.plot(t, 1e3 * np.asarray(itls(o)), ".", ms=3, color=DECODE_COLOR, alpha=0.6)
    for o in res.outputs:
        if o.request_id in run.long_ids and completed(o):
            a, f = o.metrics.arrival_time - res.start, o.metrics.first_token_time - res.start
            ax.axvspan(a, f, color=PREFILL_COLOR, alpha=0.25, lw=0)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    ax.legend(handles=[Line2D([], [], ls="", marker=".", color=DECODE_COLOR, label="decoder token gap"),
                       Patch(color=PREFILL_COLOR, alpha=0.25, label="long prompt: arrival to first token")],
              loc="upper right", fontsize=8)
    log_axis(ax, "y")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("inter-token latency (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Decoders' ITL while long prompts arrive: {run.label}\n{res.device_label}", fontsize=10)
    return ax.figure


def _ordered(runs):
    """Chunked runs by budget, then the run without chunking (the largest 'budget')."""
    return sorted(runs, key=lambda r: math.inf if r.budget is None else r.budget)


def plot_budget_tradeoff(runs, ax=None, reference=None):
    """Worst decoder stall and the long prompts' TTFT at each token budget. reference:
    course.reference's (label, [(run label, worst ITL ms, p99 ITL ms, median TTFT ms)]) of
    another machine, or a list of them (reference.all_series: every device recorded), each drawn
    in its own grey at the runs of the same label."""
    ax = get_axes(ax, (9.5, 3.8))
    runs = _ordered(runs)
    x = np.arange(len(runs))
    spike = [1e3 * r.decoder_itls().max() for r in runs]
    p99 = [1e3 * np.percentile(r.decoder_itls(), 99) for r in runs]
    first = [1e3 * np.median(r.long_ttfts()) for r in runs]
    ax.plot(x, spike, "o-", color=DECODE_COLOR, label="decoders: worst ITL (ms)")
    ax.plot(x, p99, "o:", color=DECODE_COLOR, alpha=0.6, label="decoders: p99 ITL (ms)")
    ax.plot(x, first, "s-", color=PREFILL_COLOR, label="long prompts: median TTFT (ms)")
    refs = [] if reference is None else [reference] if isinstance(reference[0], str) else list(reference)
    at = {r.label: i for i, r in enumerate(runs)}
    for k, (name, points) in enumerate(refs):
        ref = [row for row in points if row[0] in at]
        grey = str(0.35 + 0.4 * k / max(1, len(refs) - 1))  # one shade per device
        for col, marker in ((1, "o"), (3, "s")):
            ax.plot([at[row[0]] for row in ref], [row[col] for row in ref], marker + "--", color=grey,
                    ms=5, mfc="none", lw=0.8, label=f"reference: {name}" if col == 1 else None)
    ax.set_xticks(x, ["no\nchunking" if r.budget is None else str(r.budget) for r in runs])
    log_axis(ax, "y")
    ax.set_xlabel("token budget per step, max_num_batched_tokens (tokens)")
    ax.set_ylabel("latency (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside: inside, it hid points
    ax.set_title(f"Chunk size trades TTFT against ITL\n{runs[0].result.device_label}", fontsize=10)
    return ax.figure


def compute_interference_view(runs, selected: str) -> dict:
    """Decoder ITLs and long-prompt TTFTs (ms) of every run, and which one is selected."""
    runs = _ordered(runs)
    labels = [r.label for r in runs]
    if selected not in labels:
        raise ValueError(f"no run labelled {selected!r}; runs: {labels}")
    return {"labels": labels, "selected": selected, "device": runs[0].result.device_label,
            "itl_ms": {r.label: 1e3 * r.decoder_itls() for r in runs},
            "ttft_ms": {r.label: 1e3 * r.long_ttfts() for r in runs}}


def plot_interference_view(data: dict, axes) -> None:
    """Left: tail of the decoders' ITL; right: the long prompts' TTFT; selected run in colour."""
    ax_itl, ax_ttft = axes
    for i, lab in enumerate(data["labels"]):
        sel = lab == data["selected"]
        kw = dict(color=DECODE_COLOR if sel else "0.75", lw=2.2 if sel else 1, zorder=3 if sel else 1,
                  label=lab if sel else None)
        plot_ccdf(ax_itl, data["itl_ms"][lab], **kw)
        t = data["ttft_ms"][lab]
        ax_ttft.plot(t, np.full(len(t), i), "o", ms=8 if sel else 5,
                     color=PREFILL_COLOR if sel else "0.7", zorder=3 if sel else 1)
    log_axis(ax_itl, "x")
    log_axis(ax_itl, "y")
    ax_itl.set_xlabel("decoder inter-token latency x (ms, log)")
    ax_itl.set_ylabel("fraction of gaps longer than x (log)")
    ax_itl.grid(True, which="both", alpha=0.3)
    ax_itl.legend(fontsize=8, loc="lower left")
    ax_itl.set_title(f"Decoders' ITL tail: {data['selected']}\n{data['device']}", fontsize=10)
    ax_ttft.set_yticks(range(len(data["labels"])), data["labels"])
    log_axis(ax_ttft, "x")
    ax_ttft.set_xlabel("long prompt TTFT (ms, log)")
    ax_ttft.set_ylabel("run")
    ax_ttft.grid(True, which="both", alpha=0.3)
    ax_ttft.set_title(f"Long prompts' time to first token\n{data['device']}", fontsize=10)


def interference_explorer(runs):
    """A slider over the measured token budgets (precomputed runs; moving it measures nothing)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    labels = [r.label for r in _ordered(runs)]
    slider = W.SelectionSlider(options=labels, value=labels[0], description="budget",
                               layout=W.Layout(width="70%"), style={"description_width": "initial"})
    out = W.Output()

    def draw(_=None):
        def fig():
            fig, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
            plot_interference_view(compute_interference_view(runs, slider.value), axes)
            return fig
        show_figure(out, fig)
    slider.observe(draw, names="value")
    draw()
    return W.VBox([slider, out])
