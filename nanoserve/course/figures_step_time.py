"""Lesson 11's figures: a step's wall time as stacked bars, by kernel family (measure.step_profile,
CPU) or by host phase against the forward (course.experiments.host_time)."""

from __future__ import annotations

from collections.abc import Sequence

from nanoserve.course.annotate import titled
from nanoserve.measure.figures import get_axes


def _stacked(ax, labels: Sequence[str], parts: Sequence[str], values: Sequence[dict], colors):
    bottom = [0.0] * len(labels)
    for part, color in zip(parts, colors):
        heights = [v[part] for v in values]
        ax.bar(labels, heights, bottom=bottom, color=color, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("ms per step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # clear of the bars
    ax.grid(True, axis="y", alpha=0.3)


def plot_step_profile(profiles: Sequence, label: str, ax=None):
    """One bar per StepProfile (measure.step_profile), split into its PARTS."""
    import matplotlib.pyplot as plt

    from nanoserve.measure.step_profile import PARTS
    ax = get_axes(ax)
    _stacked(ax, [p.label.replace(" tokens", "").replace("decode batch ", "batch ") for p in profiles],
             PARTS, [p.parts_ms for p in profiles], plt.cm.tab10(range(len(PARTS))))
    titled(ax, "A decode step by kernel family", label)
    return ax.figure


def plot_host_split(splits: Sequence, label: str, ax=None):
    """One bar per HostSplit: host phases below, the forward on top (on a CPU: its ops, then the
    Python between them); the host share above each."""
    import matplotlib.pyplot as plt

    from nanoserve.course.experiments.host_time import HOST
    ax = get_axes(ax)
    names = [f"batch {s.batch}" + ("\ngraphs" if s.graphs else "\nfused layers" if s.fused
                                   else "\neager" if s.eager else "") for s in splits]
    host_colors = [*plt.cm.Oranges([0.35, 0.5, 0.65, 0.8])]
    if all(s.forward_ops_ms is not None for s in splits):
        parts = (*HOST, "forward: ops", "forward: Python between ops")
        values = [{**s.phases_ms, parts[-2]: s.forward_ops_ms, parts[-1]: s.forward_python_ms}
                  for s in splits]
        _stacked(ax, names, parts, values, [*host_colors, "tab:blue", "lightskyblue"])
    else:
        _stacked(ax, names, (*HOST, "forward"), [s.phases_ms for s in splits], [*host_colors, "tab:blue"])
    for i, s in enumerate(splits):
        ax.annotate(f"host {100 * s.host_share:.0f}%", (i, s.step_ms), ha="center", va="bottom",
                    fontsize=8)
    ax.set_ylim(0, 1.15 * max(s.step_ms for s in splits))
    titled(ax, "A decode step: host work and the forward", label)
    return ax.figure
