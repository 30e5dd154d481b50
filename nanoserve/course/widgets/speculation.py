"""Lesson 12's explorer: speculative decoding's measured runs over k, batch and task
(course.experiments.speculative.speculation_grid); moving a control measures nothing."""

from __future__ import annotations

import numpy as np

from nanoserve.course.annotate import titled
from nanoserve.course.widgets.common import show_figure
from nanoserve.measure.figures import MEASURED_COLOR


def compute_speculation_view(grid: dict, task: str, batch: int, k: int) -> dict:
    """The selected run's acceptance by position and its numbers, and the speedup over k of every
    batch for the selected task."""
    if (task, batch, k) not in grid:
        raise ValueError(f"no run for task={task!r}, batch={batch}, k={k}; measured: {sorted(grid)}")
    c = grid[(task, batch, k)]
    ks = sorted({kk for t, _, kk in grid if t == task})
    batches = sorted({b for t, b, _ in grid if t == task})
    return {"task": task, "batch": batch, "k": k, "ks": ks,
            "speedup": {b: [grid[(task, b, kk)].speedup for kk in ks] for b in batches},
            "per_position": c.on[0].per_position(), "acceptance": c.on[0].acceptance_rate,
            "length": c.on[0].acceptance_length, "selected_speedup": c.speedup,
            "identical": c.identical}


def plot_speculation_view(data: dict, label: str, axes) -> None:
    """Left: speedup against k, a line per batch, the selection circled; right: the selected run's
    acceptance by draft position."""
    ax_s, ax_a = axes
    for i, (b, ys) in enumerate(data["speedup"].items()):
        sel = b == data["batch"]
        ax_s.plot(data["ks"], ys, "o-", color=f"C{i}", lw=2.2 if sel else 1, alpha=1 if sel else 0.5,
                  label=f"batch {b}")
    ax_s.plot([data["k"]], [data["selected_speedup"]], "o", ms=14, mfc="none", mec="black")
    ax_s.axhline(1.0, color="gray", lw=1)
    ax_s.set_xticks(data["ks"])
    ax_s.set_xlabel("k (drafts checked per verify step)")
    ax_s.set_ylabel("decode speedup (TPOT without / with)")
    ax_s.set_ylim(bottom=0)
    ax_s.grid(True, alpha=0.3)
    ax_s.legend(fontsize=8)
    titled(ax_s, f"{data['task']}: speedup over k", label)
    rates = data["per_position"]
    ax_a.bar(np.arange(1, len(rates) + 1), rates, color=MEASURED_COLOR)
    ax_a.set_xticks(np.arange(1, data["k"] + 1))
    ax_a.set_xlim(0.4, max(data["ks"]) + 0.6)
    ax_a.set_ylim(0, 1.05)
    ax_a.set_xlabel("draft position j")
    ax_a.set_ylabel("share of verify steps accepting draft j")
    ax_a.grid(True, axis="y", alpha=0.3)
    titled(ax_a, f"{data['task']}, batch {data['batch']}, k = {data['k']}: "
                 f"{data['acceptance']:.0%} accepted, {data['length']:.2f} tokens a step, "
                 f"{data['selected_speedup']:.2f}x", label)


def speculation_explorer(grid: dict, label: str):
    """Task and batch buttons and a k slider over the measured grid."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    tasks = list(dict.fromkeys(t for t, _, _ in grid))  # in the order measured: the lesson's first task first
    batches = sorted({b for _, b, _ in grid})
    ks = sorted({k for _, _, k in grid})
    task = W.ToggleButtons(options=tasks, value=tasks[0], description="task")
    batch = W.ToggleButtons(options=batches, value=batches[0], description="batch")
    k = W.SelectionSlider(options=ks, value=ks[(len(ks) - 1) // 2], description="k",  # room to move right
                          layout=W.Layout(width="50%"))
    out = W.Output()

    def draw(_=None):
        def fig():
            fig, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
            plot_speculation_view(compute_speculation_view(grid, task.value, batch.value, k.value),
                                  label, axes)
            return fig
        show_figure(out, fig)
    for w in (task, batch, k):
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([task, batch]), k, out])
