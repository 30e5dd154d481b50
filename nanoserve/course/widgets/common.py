"""Shared by the figures of lessons 05-09: log scales with plain labels, CCDFs, redraws in an Output.

Colours and axes are measure.figures' (one palette for the whole course).
"""

from __future__ import annotations

import numpy as np

from nanoserve.measure.figures import plain_log_ticks


def show_figure(out, draw) -> None:
    """Replace what an ipywidgets Output shows with the figure `draw()` returns, as one PNG.

    The figure goes into `out.outputs` in one state update (the kernel sends it; nothing answers).
    Not `with out: out.clear_output(); plt.show()`: that routes the figure through the Output's
    message capture, which a headless client (nbclient, behind `jupyter nbconvert --execute` and
    `make slides`) serves by sending comm messages back to the kernel on the shell channel while it
    waits on that channel for the cell's reply: the reply can then go unseen until the client's
    timeout (nbclient issue 312, nbconvert issues 2003 and 2029). The figure is closed so that the
    inline backend does not also show it under the cell."""
    import base64

    import matplotlib.pyplot as plt
    from IPython.core.pylabtools import print_figure
    fig = draw()
    try:
        png = print_figure(fig, "png", bbox_inches="tight")  # what %matplotlib inline shows
    finally:
        plt.close(fig)
    w, h = fig.get_size_inches() * fig.dpi
    out.outputs = ({"output_type": "display_data", "metadata": {},
                    "data": {"image/png": base64.b64encode(png).decode("ascii"),
                             "text/plain": f"<Figure size {w:.0f}x{h:.0f} with {len(fig.axes)} Axes>"}},)


def log_axis(ax, which: str = "x") -> None:
    """A log axis labelled with plain numbers (measure.figures.plain_log_ticks)."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    plain_log_ticks(ax, which)


def plot_ccdf(ax, values_ms, **kw) -> None:
    """Fraction of samples longer than x, on log-log axes: the tail is where a spike shows."""
    x = np.sort(np.asarray(values_ms, dtype=float))
    if len(x):
        ax.step(x, 1 - np.arange(len(x)) / len(x), where="post", **kw)
