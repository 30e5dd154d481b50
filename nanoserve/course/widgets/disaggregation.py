"""Lesson 09: colocated vs disaggregated goodput and latency, and the P:D / link / SLO explorer."""

from __future__ import annotations

import numpy as np

from nanoserve.course.widgets.common import log_axis, plot_ccdf, show_figure
from nanoserve.measure.figures import get_axes
from nanoserve.measure.metrics import completed, itl_p99, itls


def compute_disagg_view(study, num_prefill: int, link_bandwidth: float, ttft_slo_ms: float,
                        itl_slo_ms: float, colocated_budget: int | None = None) -> dict:
    """Goodput, and the two quantities the SLO limits, against arrival rate for `study.total`
    colocated instances at a token budget of colocated_budget (default: the study's) and for
    num_prefill prefill + the rest decode instances over a
    link_bandwidth link (modelled). The SLO is per request (TTFT, and the p99 of the request's own
    ITLs), so each is summarised over requests, by its p90: under the line, 90% of requests meet it."""
    from nanoserve.measure.metrics import compute_metrics
    slo = {"ttft": ttft_slo_ms / 1e3, "itl_p99": itl_slo_ms / 1e3}
    budget = study.config.max_num_batched_tokens if colocated_budget is None else colocated_budget
    layouts = {f"colocated x{study.total}, budget {budget}": study.colocated(budget),
               f"{num_prefill}P:{study.total - num_prefill}D over {link_bandwidth / 1e9:g} GB/s":
               study.disaggregated(num_prefill, link_bandwidth)}
    data = {"rates": list(study.rates), "label": study.label, "slo_ms": (ttft_slo_ms, itl_slo_ms),
            "layouts": {}}
    for name, results in layouts.items():
        ms = [compute_metrics(r.outputs, slo=slo) for r in results]
        per_request = [[v for o in r.outputs if completed(o) and (v := itl_p99(o)) is not None]
                       for r in results]
        data["layouts"][name] = {"goodput": [m.goodput for m in ms],
                                 "throughput": [m.request_throughput for m in ms],
                                 "ttft_p90": [1e3 * m.ttft.p90 for m in ms],
                                 "request_itl_p99_p90": [1e3 * float(np.percentile(v, 90)) if v else np.nan
                                                         for v in per_request]}
    return data


def _slo_line(ax, slo_ms: float, values_ms, far: float = 3.0) -> None:
    """The SLO on a log latency panel as a dashed line; when it is over `far` x above every value,
    as a note with an arrow up at the top of the panel instead (a line that high would squash the
    curves into the bottom), over at least a 4x range of latency so that the curves keep their
    scale and the axis its labels."""
    vals = [v for v in values_ms if np.isfinite(v)]
    if not vals or slo_ms <= far * max(vals):
        ax.axhline(slo_ms, color="tab:red", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
        return
    bottom = min(min(vals) / 1.3, max(vals) / 4)
    ax.set_ylim(bottom, max(vals) ** 1.5 / bottom ** 0.5)  # the data in the lower two thirds
    ax.annotate(f"SLO {slo_ms:g} ms, above the panel:\n{slo_ms / max(vals):.0f}x the highest point",
                (0.5, 1.0), xycoords="axes fraction", xytext=(0.5, 0.94), textcoords="axes fraction",
                ha="center", va="top", fontsize=8, color="tab:red",
                arrowprops=dict(arrowstyle="->", color="tab:red", lw=1))


def plot_disagg_view(data: dict, axes) -> None:
    """Goodput, then TTFT and each request's p99 ITL (p90 over requests) against arrival rate,
    one line per layout, each against its SLO (dashed)."""
    styles = [dict(color="0.35", marker="o"), dict(color="tab:purple", marker="s")]
    ax_g, ax_t, ax_i = axes
    for (name, d), st in zip(data["layouts"].items(), styles):
        ax_g.plot(data["rates"], d["goodput"], label=name, **st)
        ax_t.plot(data["rates"], d["ttft_p90"], label=name, **st)
        ax_i.plot(data["rates"], d["request_itl_p99_p90"], label=name, **st)
    ttft_slo, itl_slo = data["slo_ms"]
    log_axis(ax_t, "y")
    log_axis(ax_i, "y")
    _slo_line(ax_t, ttft_slo, [v for d in data["layouts"].values() for v in d["ttft_p90"]])
    _slo_line(ax_i, itl_slo, [v for d in data["layouts"].values() for v in d["request_itl_p99_p90"]])
    ax_g.set_ylabel("goodput\n(requests/s within the SLO)")
    ax_t.set_ylabel("TTFT, p90 over requests\n(ms, log)")
    ax_i.set_ylabel("each request's p99 ITL,\np90 over requests (ms, log)")
    for ax, what in ((ax_g, "Goodput (vLLM's)"), (ax_t, "Time to first token"),
                     (ax_i, "Inter-token latency, per request")):
        ax.set_xlabel("arrival rate (requests/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(what, fontsize=10)
    ax_g.figure.suptitle(f"Colocated vs disaggregated, SLO: TTFT <= {ttft_slo:g} ms, p99 ITL <= "
                         f"{itl_slo:g} ms\n{data['label']}", fontsize=10)


LINK_CHOICES = [("NVLink 4: 450 GB/s", 450e9), ("PCIe 5.0 x16: 64 GB/s", 64e9),
                ("InfiniBand NDR: 50 GB/s", 50e9), ("100 GbE: 12.5 GB/s", 12.5e9),
                ("10 GbE: 1.25 GB/s", 1.25e9)]


def disagg_explorer(study, ttft_slo_ms: float, itl_slo_ms: float, link_bandwidth: float = 50e9):
    """P:D split, link, the colocated token budget and SLOs over the simulator (modelled). A new
    split, link or budget simulates its rates once (a few seconds); SLO changes only re-score the
    cached runs. The budget control keeps the comparison fair: colocation at its best budget."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    split = W.SelectionSlider(options=[(f"{p}P:{study.total - p}D", p) for p in range(1, study.total)],
                              value=max(1, study.total // 2), description="prefill:decode",
                              continuous_update=False, style={"description_width": "initial"})
    links = dict(LINK_CHOICES)
    if link_bandwidth not in links.values():
        links[f"{link_bandwidth / 1e9:g} GB/s"] = link_bandwidth
    link = W.Dropdown(options=list(links.items()), value=link_bandwidth, description="KV link",
                      style={"description_width": "initial"})
    ttft = W.SelectionSlider(options=sorted({25, 50, 100, 200, 400, 800, 1600, 3200, ttft_slo_ms}),
                             value=ttft_slo_ms, description="TTFT SLO (ms)", continuous_update=False,
                             style={"description_width": "initial"})
    itl = W.SelectionSlider(options=sorted({5, 10, 15, 20, 30, 50, 100, 200, 400, itl_slo_ms}),
                            value=itl_slo_ms, description="p99 ITL SLO (ms)", continuous_update=False,
                            style={"description_width": "initial"})
    default = study.config.max_num_batched_tokens
    budget = W.SelectionSlider(options=sorted({256, 512, 1024, 2048, 4096, 8192, default}), value=default,
                               description="colocated token budget", continuous_update=False,
                               style={"description_width": "initial"})
    status = W.HTML("modelled (simulator)")
    out = W.Output()

    def draw(_=None):
        status.value = "simulating..."

        def fig():
            fig, axes = plt.subplots(1, 3, figsize=(10, 3.8), constrained_layout=True)
            plot_disagg_view(compute_disagg_view(study, split.value, link.value, ttft.value, itl.value,
                                                 budget.value), axes)
            return fig
        show_figure(out, fig)
        status.value = "modelled (simulator)"
    for w in (split, link, budget, ttft, itl):
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([budget, split, link]), W.HBox([ttft, itl, status]), out])


def plot_layout_itl(results: dict, label: str, ax=None):
    """Tail of the inter-token latency for each layout at one rate (modelled)."""
    ax = get_axes(ax, (7, 3.8))
    for (name, res), color in zip(results.items(), ["0.35", "tab:purple", "tab:green"]):
        plot_ccdf(ax, [1e3 * g for o in res.outputs if completed(o) for g in itls(o)], color=color, lw=2,
              label=name)
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel("inter-token latency x (ms, log)")
    ax.set_ylabel("fraction of gaps longer than x (log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"ITL tail, colocated vs disaggregated\n{label}", fontsize=10)
    return ax.figure
