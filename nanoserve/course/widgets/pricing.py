"""Lesson 08: the step-time fit behind the cost split, the price box, and cost at an SLO."""

from __future__ import annotations

import numpy as np

from nanoserve.course.scenarios.pricing import run_cost
from nanoserve.course.setup import slo_text
from nanoserve.course.widgets.common import log_axis, show_figure
from nanoserve.measure.figures import DECODE_COLOR, PREFILL_COLOR


def plot_step_time_fit(results, ax=None):
    """Where the money goes: each step's time against its tokens, with the fitted
    step_time = a + b * prefill_tokens + c * decode_tokens (cost.fit_step_time) over the steps
    of every run given (one BenchResult, or a dict or list of them)."""
    import matplotlib.pyplot as plt

    from nanoserve.measure.cost import fit_step_time
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(12, 3.6), constrained_layout=True)
    ax_d, ax_p = ax
    results = list(results.values()) if isinstance(results, dict) else (
        results if isinstance(results, (list, tuple)) else [results])
    result = results[-1]
    trace = [r for res in results for r in res.trace]
    fit = fit_step_time(trace)
    dec = [r for r in trace if r.num_prefill_tokens == 0]
    pre = [r for r in trace if r.num_prefill_tokens > 0]
    ax_d.plot([r.num_decode_tokens for r in dec], [1e3 * r.duration for r in dec], ".", color=DECODE_COLOR,
              alpha=0.5, label="decode-only steps")
    xs = np.arange(0, max([r.num_decode_tokens for r in dec], default=1) + 2)
    ax_d.plot(xs, 1e3 * fit.predict(0, xs), "k-", lw=1,
              label=f"fit: {1e3 * fit.a:.1f} ms + {1e3 * fit.c:.2f} ms x tokens")
    ax_d.set_xlabel("decode tokens in the step (= running requests)")
    ax_d.set_ylabel("step time (ms)")
    ax_d.set_ylim(bottom=0)
    ax_p.plot([r.num_prefill_tokens for r in pre], [1e3 * r.duration for r in pre], ".", color=PREFILL_COLOR,
              alpha=0.7, label="steps with prefill")
    xp = np.linspace(0, max([r.num_prefill_tokens for r in pre], default=1), 50)
    ax_p.plot(xp, 1e3 * fit.predict(xp, 0), "k-", lw=1,
              label=f"fit: {1e3 * fit.a:.1f} ms + {1e3 * fit.b:.3f} ms x tokens")
    ax_p.set_xlabel("prefill tokens in the step")
    ax_p.set_ylabel("step time (ms)")
    ax_p.set_ylim(bottom=0)
    for a in ax:
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    ax_d.set_title(f"Decode: one token per request per step\n{result.device_label}", fontsize=10)
    ax_p.set_title(f"Prefill: many tokens per step (fit $R^2$ {fit.r2:.2f})\n{result.device_label}",
                   fontsize=10)
    return ax_d.figure


def compute_cost_view(runs: dict, price_per_hour: float) -> dict:
    """$/1M input and output tokens of each measured run at price_per_hour, and providers' ratios."""
    from nanoserve.measure.cost import PROVIDER_PRICES
    reports = {k: run_cost(r, price_per_hour) for k, r in runs.items()}
    return {"price": price_per_hour, "device": next(iter(runs.values())).device_label,
            "runs": list(runs), "in": [reports[k].usd_per_1m_input for k in runs],
            "out": [reports[k].usd_per_1m_output for k in runs],
            "ratio": [reports[k].output_input_ratio for k in runs],
            "providers": {n: (p.ratio, p.source, p.date) for n, p in PROVIDER_PRICES.items()}}


def plot_cost_view(data: dict, axes) -> None:
    """Left: $/1M input and output tokens per batch cap. Right: output/input ratio, this device
    (measured) beside providers' list prices."""
    ax, bx = axes
    # dots, not bars: on a log axis a bar's length depends on where the axis happens to start
    x = np.arange(len(data["runs"]))
    ax.plot(x, data["in"], "o-", color=PREFILL_COLOR, label="per 1M input tokens")
    ax.plot(x, data["out"], "s-", color=DECODE_COLOR, label="per 1M output tokens")
    for xi, v in [*zip(x, data["out"]), *zip(x, data["in"])]:
        ax.annotate(f"${v:.3g}", (xi, v), textcoords="offset points", xytext=(0, 6), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(x, [str(r) for r in data["runs"]])
    ax.set_xlim(-0.5, len(x) - 0.5)
    log_axis(ax, "y")
    ax.margins(y=0.15)  # room for the price above the top dot
    ax.set_xlabel("max_num_seqs (batch cap)")
    ax.set_ylabel("USD per 1M tokens (log)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_title(f"Cost at ${data['price']:.2f}/hour\n{data['device']}", fontsize=10)
    names = [f"this device, max_num_seqs={r} (measured)" for r in data["runs"]]
    names += [f"{n} (list price, {date})" for n, (_, _, date) in data["providers"].items()]
    vals = list(data["ratio"]) + [v for v, _, _ in data["providers"].values()]
    colors = ["tab:green"] * len(data["runs"]) + ["0.6"] * len(data["providers"])
    # from 1 (output as dear as input) to the ratio: on this log axis 1 is where the length means something
    bx.hlines(range(len(vals)), 1, vals, color=colors, lw=3)
    bx.scatter(vals, range(len(vals)), color=colors, zorder=3)
    bx.axvline(1, color="0.3", lw=1)
    bx.set_yticks(range(len(vals)), names, fontsize=8)
    bx.invert_yaxis()
    log_axis(bx, "x")
    bx.set_xlabel("output price / input price (log)")
    bx.set_title("How much dearer an output token is,\nmeasured here vs list prices "
                 "(sources: scenarios.provider_table())", fontsize=9)
    bx.grid(True, axis="x", which="both", alpha=0.3)


def cost_explorer(runs: dict, price_per_hour: float):
    """A price-per-hour box: the measured runs re-priced instantly (no re-measuring)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    price = W.BoundedFloatText(value=price_per_hour, min=0.001, max=1000.0, step=0.05,
                               description="price ($/hour)", style={"description_width": "initial"})
    out = W.Output()

    def draw(_=None):
        def fig():
            fig, axes = plt.subplots(1, 2, figsize=(13, 4), constrained_layout=True)
            plot_cost_view(compute_cost_view(runs, price.value), axes)
            return fig
        show_figure(out, fig)
    price.observe(draw, names="value")
    draw()
    return W.VBox([price, out])


def plot_cost_at_slo(runs: dict, evaluations, slo: dict, axes=None):
    """runs: {cap: BenchResult}; evaluations: scenarios.evaluate_caps of the same runs.
    Left: each request's TPOT per batch cap against the SLO's TPOT limit (a limit per request).
    Right: what 1000 requests cost at each cap, all of them and only those within the SLO (the
    price per second over vLLM's request goodput); the cheapest within the SLO starred."""
    import matplotlib.pyplot as plt

    from nanoserve.measure.metrics import completed, tpot
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    if [str(k) for k in runs] != [e.label for e in evaluations]:
        raise ValueError(f"evaluations of {[e.label for e in evaluations]} don't match runs {list(runs)}")
    ax_t, ax_c = axes
    device = next(iter(runs.values())).device_label
    x = np.arange(len(evaluations))
    for xi, r in zip(x, runs.values()):
        vals = [1e3 * v for o in r.outputs if completed(o) and (v := tpot(o)) is not None]
        ax_t.plot(np.full(len(vals), xi), vals, "o", ms=4, alpha=0.5, color=DECODE_COLOR)
    if "tpot" in slo:
        ax_t.axhline(1e3 * slo["tpot"], color="tab:red", lw=1, ls="--",
                     label=f"SLO: each request's TPOT <= {1e3 * slo['tpot']:g} ms")
    ax_t.set_ylabel("TPOT of each request (ms)")
    ax_t.set_ylim(bottom=0)
    ax_t.set_title(f"Each request's TPOT against the limit\n{device}", fontsize=10)
    # a wide pale band under the green line: where every request is within the SLO the two are
    # equal, and the green line runs along the band's middle instead of hiding a line like it
    every = [e.usd_per_1k_requests for e in evaluations]
    ax_c.plot(x, every, "o-", color="0.8", ms=14, lw=8, solid_capstyle="round", zorder=1,
              label="per 1000 requests, SLO ignored")
    good = [(xi, e.usd_per_1k_good) for xi, e in zip(x, evaluations) if np.isfinite(e.usd_per_1k_good)]
    ax_c.plot(*zip(*good) if good else ([], []), "s-", color="tab:green", zorder=2,
              label="per 1000 requests within the SLO")
    if len(good) == len(x) and np.allclose([g for _, g in good], every):
        ax_c.text(0.02, 0.03, "every request within the SLO: the two lines coincide",
                  transform=ax_c.transAxes, fontsize=8, color="0.3")
    for xi, e in zip(x, evaluations):
        if not np.isfinite(e.usd_per_1k_good):
            ax_c.annotate("none within\nthe SLO", (xi, e.usd_per_1k_requests), textcoords="offset points",
                          xytext=(0, 8), ha="center", fontsize=8, color="tab:red")
    if good:
        bx, by = min(good, key=lambda g: g[1])
        ax_c.plot([bx], [by], "*", ms=20, mfc="none", color="k", label="cheapest within the SLO")
    log_axis(ax_c, "y")
    ax_c.set_ylabel("USD per 1000 requests (log)")
    ax_c.set_title(f"Cost per request at {slo_text(slo)} (goodput: vLLM's)\n{device}", fontsize=10)
    for ax in axes:
        ax.set_xticks(x, [e.label for e in evaluations])
        ax.set_xlabel("max_num_seqs (batch cap)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return ax_t.figure
