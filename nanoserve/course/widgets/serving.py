"""Lesson 07: one request's anatomy, percentiles, stratification, goodput, and the dashboard."""

from __future__ import annotations

import numpy as np

from nanoserve.course.scenarios.common import measure_workload
from nanoserve.course.setup import slo_text
from nanoserve.course.widgets.common import log_axis, show_figure
from nanoserve.measure.figures import DECODE_COLOR, MEASURED_COLOR, MODELLED_COLOR, PREFILL_COLOR, get_axes
from nanoserve.measure.metrics import completed, itls, tpot, ttft


def plot_request_anatomy(result, ax=None, request_id: str | None = None):
    """One request's life on a time line: arrival, first scheduled, each token, finish, with
    queue, prefill, TTFT, one ITL and E2E marked. Default: the request with the median E2E
    among those with at least 4 tokens."""
    ax = get_axes(ax, (10, 3.2))
    done = [o for o in result.outputs if completed(o) and len(o.token_ids) >= 4]
    if request_id is None:
        done.sort(key=lambda o: o.metrics.finished_time - o.metrics.arrival_time)
        o = done[len(done) // 2]
    else:
        o = next(x for x in result.outputs if x.request_id == request_id)
    m = o.metrics
    t0 = m.arrival_time
    ms = lambda t: 1e3 * (t - t0)  # noqa: E731
    toks = [ms(t) for t in m.token_times]
    ax.vlines(toks, 0, 1, color=DECODE_COLOR, lw=1.5, label="a token reaches the user")
    ax.plot([0], [0.5], "k>", ms=9, label="arrival")
    ax.fill_betweenx([0.1, 0.9], 0, ms(m.first_scheduled_time), color="0.8", label="queued")
    ax.fill_betweenx([0.1, 0.9], ms(m.first_scheduled_time), ms(m.first_token_time),
                     color=PREFILL_COLOR, alpha=0.6, label="prefill")

    def bracket(y, a, b, text, above=True):
        # the text a few points clear of the arrow's heads, not in data units that put it on them
        ax.annotate("", (a, y), (b, y), arrowprops=dict(arrowstyle="<->", lw=1))
        ax.annotate(text, ((a + b) / 2, y), xytext=(0, 5 if above else -5), textcoords="offset points",
                    ha="center", va="bottom" if above else "top", fontsize=8)
    bracket(1.15, 0, toks[0], f"TTFT {toks[0]:.0f} ms")
    k = len(toks) // 2
    bracket(-0.15, toks[k - 1], toks[k], f"one ITL {toks[k] - toks[k - 1]:.0f} ms", above=False)
    e2e_ms = ms(m.finished_time)
    bracket(1.6, 0, e2e_ms, f"E2E {e2e_ms:.0f} ms   "
            f"(TPOT = (E2E - TTFT) / {len(toks) - 1} = {(e2e_ms - toks[0]) / (len(toks) - 1):.1f} ms)")
    ax.set_ylim(-0.75, 2.0)
    ax.set_yticks([])
    ax.set_xlabel("time since the request arrived (ms)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)
    ax.set_title(f"Anatomy of request {o.request_id}: {len(o.prompt_token_ids)} prompt tokens, "
                 f"{len(o.token_ids)} output tokens\n{result.device_label}", fontsize=10)
    return ax.figure


def plot_metric_distributions(result, axes=None):
    """Cumulative distributions of TTFT, TPOT, ITL and E2E with p50, p90 and p99 marked."""
    import matplotlib.pyplot as plt

    from nanoserve.measure.metrics import REQUEST_METRICS
    if axes is None:  # 2 x 2: four panels in a row would be shrunk to fit a notebook's width
        _, axes = plt.subplots(2, 2, figsize=(10, 6.2), constrained_layout=True)
    axes = np.ravel(axes)
    done = [o for o in result.outputs if completed(o)]
    series = {"TTFT": [REQUEST_METRICS["ttft"](o) for o in done],
              "TPOT": [v for v in map(REQUEST_METRICS["tpot"], done) if v is not None],
              "ITL": [g for o in done for g in itls(o)],
              "E2E": [REQUEST_METRICS["e2e"](o) for o in done]}
    for ax, (name, vals) in zip(axes, series.items()):
        x = np.sort(1e3 * np.asarray(vals, dtype=float))
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=DECODE_COLOR)
        for p, ls in ((50, "-"), (90, "--"), (99, ":")):
            v = np.percentile(x, p)
            shown = f"{v:.2g}" if v < 10 else f"{v:.0f}"  # "3 ms" would hide a 2.6 vs 3.4 difference
            ax.axvline(v, color="0.3", ls=ls, lw=1, label=f"p{p} {shown} ms")
        log_axis(ax, "x")
        ax.set_xlabel(f"{name} (ms, log)")
        ax.set_title(f"{name}: {len(x)} {'gaps' if name == 'ITL' else 'requests'}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        # upper left: a rising curve leaves it empty, and the p90 and p99 lines sit to the right
        ax.legend(fontsize=8, loc="upper left")
        if ax.get_subplotspec() is None or ax.get_subplotspec().is_first_col():
            ax.set_ylabel("fraction at or below")
    axes[0].figure.suptitle(f"Latency distributions of one run, {result.device_label}", fontsize=10)
    return axes[0].figure


def plot_stratified(results: dict, metric: str = "e2e", buckets=(1, 8, 16, 32, 64), ax=None,
                    by: str = "output"):
    """Median `metric` per length bucket (by "output" or "input" length) for each run, and over
    all requests ("all")."""
    from nanoserve.measure.metrics import REQUEST_METRICS, stratify
    ax = get_axes(ax, (7, 3.6))
    names = list(results)
    strat = {n: stratify(results[n].outputs, metric, by, buckets) for n in names}
    labels = [s.label for s in strat[names[0]].strata]
    width = 0.8 / len(names)
    colors = ["0.55", "tab:red", "tab:green", "tab:blue"]
    for j, n in enumerate(names):
        done = [o for o in results[n].outputs if completed(o)]
        vals = [v for v in map(REQUEST_METRICS[metric], done) if v is not None]
        med = [1e3 * s.summary.median for s in strat[n].strata] + [1e3 * float(np.median(vals))]
        cnt = [s.num_requests for s in strat[n].strata] + [len(vals)]
        x = np.arange(len(labels) + 1) + (j - (len(names) - 1) / 2) * width
        ax.bar(x, np.nan_to_num(med), width, color=colors[j % len(colors)], label=n)
        for xi, v, c in zip(x, med, cnt):
            if c:
                ax.text(xi, v, f"n={c}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(labels) + 1), labels + ["all"])
    ax.set_xlabel(f"{by} length bucket (tokens)")
    ax.set_ylabel(f"median {metric.upper()} (ms)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(f"{metric.upper()} by {by} length\n{results[names[-1]].device_label}", fontsize=10)
    return ax.figure


def plot_ttft_vs_input(sweep, ax=None):
    """Each prompt length's TTFT, sent alone (measured), on log axes, beside a line of cost in
    proportion to the prompt through the longest point."""
    ax = get_axes(ax, (7, 3.6))
    x, y = np.asarray(sweep.input_lens, dtype=float), 1e3 * np.asarray(sweep.ttfts)
    ax.plot(x, y, "o-", color=MEASURED_COLOR, label="measured: one prompt alone (median)")
    ax.plot(x, y[-1] * x / x[-1], ":", color="0.4", label="in proportion to the prompt's length")
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel("prompt length (tokens, log)")
    ax.set_ylabel("TTFT (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"TTFT grew {sweep.growth:.0f}x as the prompt grew {x[-1] / x[0]:.0f}x ({x[0]:.0f} to "
                 f"{x[-1]:.0f} tokens)\n{sweep.device_label}", fontsize=10)
    return ax.figure


def _latency_view(outputs, slo: dict) -> dict:
    from nanoserve.measure.metrics import compute_metrics
    done = [o for o in outputs if completed(o)]
    m = compute_metrics(outputs, slo=slo)
    return {"ttft_ms": np.sort([1e3 * ttft(o) for o in done]),
            "tpot_ms": np.sort([1e3 * v for v in map(tpot, done) if v is not None]),
            "itl_ms": np.sort([1e3 * g for o in done for g in itls(o)]),
            "ttft_p50": 1e3 * m.ttft.median, "ttft_p99": 1e3 * m.ttft.p99,
            "itl_p50": 1e3 * m.itl.median, "itl_p99": 1e3 * m.itl.p99, "tpot_p50": 1e3 * m.tpot.median,
            "throughput": m.request_throughput, "goodput": m.goodput, "attainment": m.slo_attainment}


def compute_dashboard(model, make_workload, rate: float, max_num_seqs: int,
                      max_num_batched_tokens: int, slo: dict) -> dict:
    """Modelled: the workload at `rate` on the simulator calibrated on this device."""
    res = model.simulate(make_workload(rate), max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=True)
    return {**_latency_view(res.outputs, slo), "label": model.label, "slo": slo,
            "params": dict(rate=rate, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens)}


def measure_dashboard_point(engine, make_workload, rate: float, max_num_seqs: int,
                            max_num_batched_tokens: int, slo: dict) -> dict:
    """Measured: the same workload replayed on the real engine, in real time."""
    res = measure_workload(engine, make_workload(rate), progress=False, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=True)
    return {**_latency_view(res.outputs, slo), "label": res.device_label, "slo": slo,
            "params": dict(rate=rate, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens)}


# Dashboard panels: (data key, name, the SLO key that limits this quantity, per what).
DASHBOARD_PANELS = (("ttft_ms", "TTFT", "ttft", "requests"), ("tpot_ms", "TPOT", "tpot", "requests"),
                    ("itl_ms", "ITL", None, "all gaps"))


def plot_dashboard(data: dict, axes, measured: dict | None = None) -> None:
    """Distributions of TTFT and TPOT (one value per request, each against its own SLO line) and
    of ITL (every gap, pooled: no per-request SLO limits it), modelled; measured overlaid.
    Other SLO keys (e2e, itl_p99, ...) count in the goodput of the title but have no panel."""
    p = data["params"]
    for ax, (key, name, slo_key, per) in zip(axes, DASHBOARD_PANELS):
        for d, color, ls, kind in ((data, MODELLED_COLOR, "-", "modelled"),
                                   (measured, MEASURED_COLOR, "--", "measured")):
            if d is None:
                continue
            x = d[key]
            if len(x):
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=color, ls=ls,
                        label=f"{kind}: p50 {np.median(x):.0f} ms, p99 {np.percentile(x, 99):.0f} ms")
        limit = data["slo"].get(slo_key)
        if limit is not None:
            ax.axvline(1e3 * limit, color="tab:red", lw=1, label=f"SLO {name} {1e3 * limit:g} ms")
        log_axis(ax, "x")
        ax.set_xlabel(f"{name} (ms, log)")
        ax.set_ylabel(f"fraction of {per} at or below")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        # below the panel: inside, the lower right hid the curve's first steps
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
        ax.set_title(name, fontsize=10)
    title = (f"rate {p['rate']:.2f} req/s, max_num_seqs {p['max_num_seqs']}, "
             f"max_num_batched_tokens {p['max_num_batched_tokens']}: goodput {data['goodput']:.2f} req/s "
             f"({100 * data['attainment']:.0f}% within {slo_text(data['slo'])})")
    if measured is not None:
        title += f"; measured goodput {measured['goodput']:.2f} req/s"
    # the device once, for all three panels (JupyterLab's width leaves no room for it in each);
    # data["label"] begins "modelled:", naming what the first line's figures come from
    title += f"\n{data['label']}" + (f"; dashed: {measured['label']}" if measured is not None else "")
    axes[0].figure.suptitle(title, fontsize=10)


def serving_dashboard(model, engine, make_workload, slo: dict, max_rate: float):
    """Sliders over arrival rate, batch cap and token budget drive the calibrated simulator
    (modelled, instant); the button measures the current point on the real engine."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    rate = W.FloatSlider(value=round(max_rate / 2, 3), min=round(max_rate / 20, 3), max=round(max_rate, 3),
                         step=round(max_rate / 40, 4), description="arrival rate (req/s)",
                         continuous_update=False, style={"description_width": "initial"})
    seqs = W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64], value=min(64, model.config.max_num_seqs),
                             description="max_num_seqs", continuous_update=False,
                             style={"description_width": "initial"})
    budget = W.SelectionSlider(options=[32, 64, 128, 256, 512, 1024, 2048],
                               value=model.config.max_num_batched_tokens
                               if model.config.max_num_batched_tokens in (32, 64, 128, 256, 512, 1024, 2048)
                               else 512, description="max_num_batched_tokens", continuous_update=False,
                               style={"description_width": "initial"})
    # wide enough for its label at JupyterLab's width (the default 148 px cuts it short)
    button = W.Button(description="measure this point live", icon="play", layout=W.Layout(width="auto"))
    status = W.HTML("modelled (calibrated simulator); the button measures on this device")
    out = W.Output()
    state = {"measured": None}

    def params():
        return dict(rate=rate.value, max_num_seqs=seqs.value, max_num_batched_tokens=budget.value)

    def draw(_=None):
        measured = state["measured"] if state.get("at") == params() else None

        def fig():
            fig, axes = plt.subplots(1, len(DASHBOARD_PANELS), figsize=(10, 4.4), constrained_layout=True)
            plot_dashboard(compute_dashboard(model, make_workload, slo=slo, **params()), axes, measured)
            return fig
        show_figure(out, fig)

    def measure(_):
        status.value = "measuring on this device (real time)..."
        state["measured"] = measure_dashboard_point(engine, make_workload, slo=slo, **params())
        state["at"] = params()
        status.value = "measured point shown dashed"
        draw()
    for w in (rate, seqs, budget):
        w.observe(draw, names="value")
    button.on_click(measure)
    draw()
    return W.VBox([W.HBox([rate, seqs, budget]), W.HBox([button, status]), out])
