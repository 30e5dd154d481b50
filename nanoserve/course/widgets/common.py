"""Shared by the figures of lessons 05-09: log scales with plain labels, CCDFs, redraws in an Output.

Colours and axes are measure.figures' (one palette for the whole course).
"""

from __future__ import annotations

import numpy as np


def _show(out, draw) -> None:
    """Redraw a figure inside an ipywidgets Output."""
    import matplotlib.pyplot as plt
    with out:
        out.clear_output(wait=True)
        draw()
        plt.show()


def _log(ax, which: str = "x") -> None:
    """A log axis labelled with plain numbers (0.01, 20, 300) instead of powers of ten; minor
    ticks (2, 3, 5 x a decade) are labelled only when the axis spans under two decades."""
    from matplotlib.ticker import FuncFormatter
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")

    def minor(v, _):
        lo, hi = sorted(axis.get_view_interval())
        if lo <= 0 or hi / lo > 100 or f"{v:.1e}"[0] not in "235":
            return ""
        return f"{v:.6g}"
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _ccdf(ax, values_ms, **kw) -> None:
    """Fraction of samples longer than x, on log-log axes: the tail is where a spike shows."""
    x = np.sort(np.asarray(values_ms, dtype=float))
    if len(x):
        ax.step(x, 1 - np.arange(len(x)) / len(x), where="post", **kw)
