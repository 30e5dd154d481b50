"""Figures and ipywidgets dashboards for lessons 05-09.

Every dashboard is a thin shell: a pure `compute_...(..., params) -> data` (numbers only) and a
`plot_...(data, ax)` (matplotlib only); the widget wires sliders to the two. Tests call exactly
what a widget calls. Figures name the device they were measured on, or say "modelled: ..."
when the simulator produced them. matplotlib and ipywidgets are imported inside functions so
that importing nanoserve needs neither.
Deliberately left out: measuring (scenarios.py) and figures of single runs (viz.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nanoserve.metrics import completed, itls, ttft

PREFILL_COLOR, DECODE_COLOR = "tab:orange", "tab:blue"
MEASURED_COLOR, MODELLED_COLOR = "black", "tab:purple"


def _axes(ax, size=(8, 4)):
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=size, constrained_layout=True)
    return ax


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


# --- 05: interference and chunked prefill ----------------------------------------------------

def plot_itl_timeline(run, ax=None):
    """Each decoder's inter-token latency against time; shaded: a long prompt waiting for its
    first token (arrival to first token)."""
    ax = _axes(ax, (9, 3.6))
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
    _log(ax, "y")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("inter-token latency (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Decoders' ITL while long prompts arrive: {run.label}\n{res.device_label}", fontsize=10)
    return ax.figure


def _ordered(runs):
    """Chunked runs by budget, then the run without chunking (the largest 'budget')."""
    return sorted(runs, key=lambda r: math.inf if r.budget is None else r.budget)


def plot_budget_tradeoff(runs, ax=None):
    """Worst decoder stall and the long prompts' TTFT at each token budget."""
    ax = _axes(ax, (7, 3.8))
    runs = _ordered(runs)
    x = np.arange(len(runs))
    spike = [1e3 * r.decoder_itls().max() for r in runs]
    p99 = [1e3 * np.percentile(r.decoder_itls(), 99) for r in runs]
    first = [1e3 * np.median(r.long_ttfts()) for r in runs]
    ax.plot(x, spike, "o-", color=DECODE_COLOR, label="decoders: worst ITL (ms)")
    ax.plot(x, p99, "o:", color=DECODE_COLOR, alpha=0.6, label="decoders: p99 ITL (ms)")
    ax.plot(x, first, "s-", color=PREFILL_COLOR, label="long prompts: median TTFT (ms)")
    ax.set_xticks(x, ["no\nchunking" if r.budget is None else str(r.budget) for r in runs])
    _log(ax, "y")
    ax.set_xlabel("token budget per step (max_num_batched_tokens)")
    ax.set_ylabel("latency (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
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
        _ccdf(ax_itl, data["itl_ms"][lab], **kw)
        t = data["ttft_ms"][lab]
        ax_ttft.plot(t, np.full(len(t), i), "o", ms=8 if sel else 5,
                     color=PREFILL_COLOR if sel else "0.7", zorder=3 if sel else 1)
    _log(ax_itl, "x")
    _log(ax_itl, "y")
    ax_itl.set_xlabel("decoder inter-token latency x (ms, log)")
    ax_itl.set_ylabel("fraction of gaps longer than x (log)")
    ax_itl.grid(True, which="both", alpha=0.3)
    ax_itl.legend(fontsize=8, loc="lower left")
    ax_itl.set_title(f"Decoders' ITL tail: {data['selected']}\n{data['device']}", fontsize=10)
    ax_ttft.set_yticks(range(len(data["labels"])), data["labels"])
    _log(ax_ttft, "x")
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
            _, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
            plot_interference_view(compute_interference_view(runs, slider.value), axes)
        _show(out, fig)
    slider.observe(draw, names="value")
    draw()
    return W.VBox([slider, out])


# --- 06: prefix caching ----------------------------------------------------------------------

def plot_prefix_compare(results: dict, axes=None):
    """Left: each request's TTFT in arrival order, caching off and on. Right: prompt tokens
    computed versus served from the cache."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12, 3.8), constrained_layout=True,
                               gridspec_kw={"width_ratios": [2, 1]})
    ax, bx = axes
    colors = {"off": "0.45", "on": "tab:green"}
    names = list(results)
    for name in names:
        res = results[name]
        order = sorted(res.outputs, key=lambda o: o.metrics.arrival_time)
        ax.plot(range(len(order)), [1e3 * ttft(o) for o in order], "o-", ms=4, color=colors.get(name),
                label=f"prefix caching {name}")
        done = [o for o in res.outputs if completed(o)]
        cached = sum(o.num_cached_tokens for o in done)
        computed = sum(len(o.prompt_token_ids) for o in done) - cached
        i = names.index(name)
        bx.barh(i, computed, color=PREFILL_COLOR, label="computed (prefill)" if i == 0 else None)
        bx.barh(i, cached, left=computed, color="tab:green", label="from the prefix cache" if i == 0 else None)
    device = results[names[-1]].device_label
    _log(ax, "y")
    ax.set_xlabel("request (arrival order)")
    ax.set_ylabel("TTFT (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Time to first token, shared system prompt\n{device}", fontsize=10)
    bx.set_yticks(range(len(names)), [f"caching {n}" for n in names])
    bx.set_xlabel("prompt tokens (all requests)")
    bx.legend(fontsize=8, loc="lower right")
    bx.set_title(f"Where prompt tokens came from\n{device}", fontsize=10)
    return ax.figure


def plot_eviction(points, num_kv_blocks: int, block_size: int, prefix_len: int, device: str, ax=None):
    """How much of a cached prefix survives unrelated traffic through a small cache."""
    ax = _axes(ax, (8, 3.8))
    x = [p.unrelated_tokens for p in points]
    ax.plot(x, [p.cached_tokens for p in points], "o-", color="tab:green",
            label="prefix tokens still cached when it returns")
    capacity = num_kv_blocks * block_size
    ax.axvline(capacity - prefix_len, color="0.4", ls="--", lw=1)
    ax.text(capacity - prefix_len, prefix_len * 1.02, " free room in the cache", fontsize=8, color="0.3")
    ax.set_ylim(-0.05 * prefix_len, 1.1 * prefix_len)
    ax.set_xlabel("unrelated prompt tokens served between two uses of the prefix (tokens)")
    ax.set_ylabel("cached prefix tokens (tokens)")
    ax.grid(True, alpha=0.3)
    tx = ax.twinx()
    tx.plot(x, [1e3 * p.ttft for p in points], "s:", color=PREFILL_COLOR, label="its TTFT (ms)")
    tx.set_ylabel("TTFT of the returning request (ms)")
    tx.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = tx.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="center left")
    ax.set_title(f"What evicts a cached prefix: {prefix_len}-token prefix, cache of {num_kv_blocks} "
                 f"blocks x {block_size} tokens\n{device}", fontsize=10)
    return ax.figure


# --- 07: measuring a serving system ------------------------------------------------------------

def plot_request_anatomy(result, ax=None, request_id: str | None = None):
    """One request's life on a time line: arrival, first scheduled, each token, finish, with
    queue, prefill, TTFT, one ITL and E2E marked. Default: the request with the median E2E
    among those with at least 4 tokens."""
    ax = _axes(ax, (10, 2.8))
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
    ax.axvspan(0, ms(m.first_scheduled_time), ymin=0.25, ymax=0.75, color="0.8", label="queued")
    ax.axvspan(ms(m.first_scheduled_time), ms(m.first_token_time), ymin=0.25, ymax=0.75,
               color=PREFILL_COLOR, alpha=0.6, label="prefill")

    def bracket(y, a, b, text):
        ax.annotate("", (a, y), (b, y), arrowprops=dict(arrowstyle="<->", lw=1))
        ax.text((a + b) / 2, y + 0.05, text, ha="center", fontsize=8)
    bracket(1.15, 0, toks[0], f"TTFT {toks[0]:.0f} ms")
    k = len(toks) // 2
    bracket(-0.2, toks[k - 1], toks[k], f"one ITL {toks[k] - toks[k - 1]:.0f} ms")
    bracket(1.45, 0, ms(m.finished_time), f"E2E {ms(m.finished_time):.0f} ms   "
            f"(TPOT = (E2E - TTFT) / {len(toks) - 1} = {(ms(m.finished_time) - toks[0]) / (len(toks) - 1):.1f} ms)")
    ax.set_ylim(-0.45, 1.75)
    ax.set_yticks([])
    ax.set_xlabel("time since the request arrived (ms)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)
    ax.set_title(f"Anatomy of request {o.request_id}: {len(o.prompt_token_ids)} prompt tokens, "
                 f"{len(o.token_ids)} output tokens\n{result.device_label}", fontsize=10)
    return ax.figure


def plot_metric_distributions(result, axes=None):
    """Cumulative distributions of TTFT, TPOT, ITL and E2E with p50, p90 and p99 marked."""
    import matplotlib.pyplot as plt

    from nanoserve.metrics import REQUEST_METRICS
    if axes is None:
        _, axes = plt.subplots(1, 4, figsize=(14, 3.4), constrained_layout=True)
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
            ax.axvline(v, color="0.3", ls=ls, lw=1, label=f"p{p} {v:.0f} ms")
        _log(ax, "x")
        ax.set_xlabel(f"{name} (ms, log)")
        ax.set_title(f"{name}: {len(x)} {'gaps' if name == 'ITL' else 'requests'}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("fraction at or below")
    axes[0].figure.suptitle(f"Latency distributions of one run, {result.device_label}", fontsize=10)
    return axes[0].figure


def plot_stratified(results: dict, metric: str = "e2e", buckets=(1, 16, 32, 64, 128), ax=None):
    """Median `metric` per output-length bucket for each run, and over all requests ("all")."""
    from nanoserve.metrics import REQUEST_METRICS, stratify
    ax = _axes(ax, (7, 3.6))
    names = list(results)
    strat = {n: stratify(results[n].outputs, metric, "output", buckets) for n in names}
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
                ax.text(xi, v, f"n={c}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(labels) + 1), labels + ["all"])
    ax.set_xlabel("output length bucket (tokens)")
    ax.set_ylabel(f"median {metric.upper()} (ms)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(f"{metric.upper()} by output length\n{results[names[-1]].device_label}", fontsize=10)
    return ax.figure


def plot_goodput(points, slo: dict, device: str, ax=None, modelled=None, modelled_label: str = ""):
    """Throughput and goodput (requests/s within the SLO) against the offered arrival rate;
    measured points in black, the calibrated simulator's (optional) in purple."""
    from nanoserve.scenarios import slo_text
    ax = _axes(ax, (7, 4))
    rates = [p.rate for p in points] + [p.rate for p in (modelled or [])]
    top = max(rates) * 1.05
    ax.plot([0, top], [0, top], color="0.7", ls="--", lw=1, label="offered = served")
    if modelled:
        ax.plot([p.rate for p in modelled], [p.throughput for p in modelled], "-", color=MODELLED_COLOR,
                alpha=0.5, label="throughput, modelled")
        ax.plot([p.rate for p in modelled], [p.goodput for p in modelled], "--", color=MODELLED_COLOR,
                label="goodput, modelled")
    ax.plot([p.rate for p in points], [p.throughput for p in points], "o-", color="0.4",
            label="throughput, measured")
    ax.plot([p.rate for p in points], [p.goodput for p in points], "s-", color=MEASURED_COLOR,
            label="goodput, measured")
    ax.set_xlabel("offered arrival rate (requests/s)")
    ax.set_ylabel("completed requests/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    sub = device + (f"\nlines: {modelled_label}" if modelled else "")
    ax.set_title(f"Throughput vs goodput at SLO {slo_text(slo)}\n{sub}", fontsize=10)
    return ax.figure


def _latency_view(outputs, slo: dict) -> dict:
    from nanoserve.metrics import compute_metrics
    done = [o for o in outputs if completed(o)]
    m = compute_metrics(outputs, slo=slo)
    return {"ttft_ms": np.sort([1e3 * ttft(o) for o in done]),
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
            "params": dict(rate=rate, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)}


def measure_dashboard_point(engine, make_workload, rate: float, max_num_seqs: int,
                            max_num_batched_tokens: int, slo: dict) -> dict:
    """Measured: the same workload replayed on the real engine, in real time."""
    from nanoserve.scenarios import measure_workload
    res = measure_workload(engine, make_workload(rate), progress=False, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=True)
    return {**_latency_view(res.outputs, slo), "label": res.device_label, "slo": slo,
            "params": dict(rate=rate, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)}


def plot_dashboard(data: dict, axes, measured: dict | None = None) -> None:
    """TTFT and ITL distributions (modelled; measured overlaid when given) with the SLO."""
    from nanoserve.scenarios import slo_text
    p = data["params"]
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        for d, color, ls, kind in ((data, MODELLED_COLOR, "-", "modelled"),
                                   (measured, MEASURED_COLOR, "--", "measured")):
            if d is None:
                continue
            x = d[key]
            if len(x):
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=color, ls=ls,
                        label=f"{kind}: p50 {np.median(x):.0f} ms, p99 {np.percentile(x, 99):.0f} ms")
        limit = data["slo"].get("ttft" if name == "TTFT" else "tpot")
        if limit is not None:
            ax.axvline(1e3 * limit, color="tab:red", lw=1,
                       label=f"SLO {'TTFT' if name == 'TTFT' else 'TPOT (mean ITL)'} {1e3 * limit:g} ms")
        _log(ax, "x")
        ax.set_xlabel(f"{name} (ms, log)")
        ax.set_ylabel("fraction at or below")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    title = (f"rate {p['rate']:.2f} req/s, max_num_seqs {p['max_num_seqs']}, "
             f"max_num_batched_tokens {p['max_num_batched_tokens']}: goodput {data['goodput']:.2f} req/s "
             f"({100 * data['attainment']:.0f}% within {slo_text(data['slo'])}), modelled")
    if measured is not None:
        title += f"; measured goodput {measured['goodput']:.2f} req/s"
    axes[0].figure.suptitle(title, fontsize=9)
    sub = data["label"] + (f"\ndashed: {measured['label']}" if measured is not None else "")
    axes[0].set_title(f"TTFT\n{sub}", fontsize=9)
    axes[1].set_title(f"ITL\n{sub}", fontsize=9)


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
    button = W.Button(description="measure this point live", icon="play")
    status = W.HTML("modelled (calibrated simulator); the button measures on this device")
    out = W.Output()
    state = {"measured": None}

    def params():
        return dict(rate=rate.value, max_num_seqs=seqs.value, max_num_batched_tokens=budget.value)

    def draw(_=None):
        measured = state["measured"] if state.get("at") == params() else None

        def fig():
            _, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
            plot_dashboard(compute_dashboard(model, make_workload, slo=slo, **params()), axes, measured)
        _show(out, fig)

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


# --- 08: cost -----------------------------------------------------------------------------------

def plot_step_time_fit(results, ax=None):
    """Where the money goes: each step's time against its tokens, with the fitted
    step_time = a + b * prefill_tokens + c * decode_tokens (cost.fit_step_time) over the steps
    of every run given (one BenchResult, or a dict or list of them)."""
    import matplotlib.pyplot as plt

    from nanoserve.cost import fit_step_time
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
    ax_d.plot(xs, 1e3 * fit.predict(0, xs), "k-", lw=1, label=f"fit: {1e3 * fit.a:.1f} ms + {1e3 * fit.c:.2f} ms x tokens")
    ax_d.set_xlabel("decode tokens in the step (= running requests)")
    ax_d.set_ylabel("step time (ms)")
    ax_d.set_ylim(bottom=0)
    ax_p.plot([r.num_prefill_tokens for r in pre], [1e3 * r.duration for r in pre], ".", color=PREFILL_COLOR,
              alpha=0.7, label="steps with prefill")
    xp = np.linspace(0, max([r.num_prefill_tokens for r in pre], default=1), 50)
    ax_p.plot(xp, 1e3 * fit.predict(xp, 0), "k-", lw=1, label=f"fit: {1e3 * fit.a:.1f} ms + {1e3 * fit.b:.3f} ms x tokens")
    ax_p.set_xlabel("prefill tokens in the step")
    ax_p.set_ylabel("step time (ms)")
    ax_p.set_ylim(bottom=0)
    for a in ax:
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    ax_d.set_title(f"Decode: one token per request per step\n{result.device_label}", fontsize=10)
    ax_p.set_title(f"Prefill: many tokens per step (fit R^2 {fit.r2:.2f})\n{result.device_label}", fontsize=10)
    return ax_d.figure


def compute_cost_view(runs: dict, price_per_hour: float) -> dict:
    """$/1M input and output tokens of each measured run at price_per_hour, and providers' ratios."""
    from nanoserve.cost import PROVIDER_PRICES
    from nanoserve.scenarios import run_cost
    reports = {k: run_cost(r, price_per_hour) for k, r in runs.items()}
    return {"price": price_per_hour, "device": next(iter(runs.values())).device_label,
            "runs": list(runs), "in": [reports[k].usd_per_1m_input for k in runs],
            "out": [reports[k].usd_per_1m_output for k in runs],
            "ratio": [reports[k].output_input_ratio for k in runs],
            "providers": {n: (p.ratio, f"{p.source}, {p.date}") for n, p in PROVIDER_PRICES.items()}}


def plot_cost_view(data: dict, axes) -> None:
    """Left: $/1M input and output tokens per batch cap. Right: output/input ratio, this device
    (measured) beside providers' list prices."""
    ax, bx = axes
    x = np.arange(len(data["runs"]))
    ax.bar(x - 0.2, data["in"], 0.4, color=PREFILL_COLOR, label="per 1M input tokens")
    ax.bar(x + 0.2, data["out"], 0.4, color=DECODE_COLOR, label="per 1M output tokens")
    for xi, v in zip(x, data["out"]):
        ax.text(xi + 0.2, v, f"${v:.3g}", ha="center", va="bottom", fontsize=7)
    for xi, v in zip(x, data["in"]):
        ax.text(xi - 0.2, v, f"${v:.3g}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [str(r) for r in data["runs"]])
    _log(ax, "y")
    ax.set_xlabel("max_num_seqs (batch cap)")
    ax.set_ylabel("USD per 1M tokens (log)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_title(f"Cost at ${data['price']:.2f}/hour\n{data['device']}", fontsize=10)
    names = [f"this device, max_num_seqs={r} (measured)" for r in data["runs"]]
    names += [f"{n} (list price)" for n in data["providers"]]
    vals = list(data["ratio"]) + [v for v, _ in data["providers"].values()]
    colors = ["tab:green"] * len(data["runs"]) + ["0.6"] * len(data["providers"])
    bx.barh(range(len(vals)), vals, color=colors)
    bx.set_yticks(range(len(vals)), names, fontsize=8)
    bx.invert_yaxis()
    _log(bx, "x")
    bx.set_xlabel("output price / input price (log)")
    sources = "; ".join(sorted({s for _, s in data["providers"].values()}))
    bx.set_title(f"How much dearer an output token is\nproviders: {sources}", fontsize=8)
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
            _, axes = plt.subplots(1, 2, figsize=(13, 4), constrained_layout=True)
            plot_cost_view(compute_cost_view(runs, price.value), axes)
        _show(out, fig)
    price.observe(draw, names="value")
    draw()
    return W.VBox([price, out])


def plot_cost_at_slo(evaluations, slo: dict, device: str, ax=None, metric: str = "tpot"):
    """Each run's cost per 1M tokens (input + output) against its p90 `metric`; the SLO as a
    line; the cheapest run meeting it starred."""
    from nanoserve.scenarios import slo_text
    ax = _axes(ax, (7, 4))
    ok = [e for e in evaluations if e.meets_slo]
    best = min(ok, key=lambda e: e.usd_per_1m_total, default=None)
    for e in evaluations:
        x = 1e3 * getattr(e.metrics, metric).p90
        ax.plot(x, e.usd_per_1m_total, "o", ms=8, color="tab:green" if e.meets_slo else "tab:red")
        ax.annotate(f"max_num_seqs={e.label}", (x, e.usd_per_1m_total), textcoords="offset points",
                    xytext=(6, 4), fontsize=8)
    if best is not None:
        ax.plot(1e3 * getattr(best.metrics, metric).p90, best.usd_per_1m_total, "*", ms=20, mfc="none",
                color="k", label="cheapest within the SLO")
    if metric in slo:
        ax.axvline(1e3 * slo[metric], color="tab:red", lw=1, ls="--", label=f"SLO {metric.upper()} {1e3 * slo[metric]:g} ms")
    _log(ax, "y")
    ax.set_xlabel(f"p90 {metric.upper()} (ms)")
    ax.set_ylabel("USD per 1M tokens, input + output (log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Cost at the same SLO ({slo_text(slo)}; green: 90% of requests within it)\n{device}",
                 fontsize=10)
    return ax.figure


# --- 09: disaggregation ---------------------------------------------------------------------------

def compute_disagg_view(study, num_prefill: int, link_bandwidth: float, ttft_slo_ms: float,
                        itl_slo_ms: float) -> dict:
    """Goodput, p90 TTFT and p99 ITL against arrival rate for `study.total` colocated instances
    and for num_prefill prefill + the rest decode instances over a link_bandwidth link (modelled)."""
    from nanoserve.metrics import compute_metrics
    slo = {"ttft": ttft_slo_ms / 1e3, "itl_p99": itl_slo_ms / 1e3}
    layouts = {f"colocated x{study.total}": study.colocated(),
               f"{num_prefill}P:{study.total - num_prefill}D over {link_bandwidth / 1e9:g} GB/s":
               study.disaggregated(num_prefill, link_bandwidth)}
    data = {"rates": list(study.rates), "label": study.label, "slo_ms": (ttft_slo_ms, itl_slo_ms), "layouts": {}}
    for name, results in layouts.items():
        ms = [compute_metrics(r.outputs, slo=slo) for r in results]
        data["layouts"][name] = {"goodput": [m.goodput for m in ms],
                                 "throughput": [m.request_throughput for m in ms],
                                 "ttft_p90": [1e3 * m.ttft.p90 for m in ms],
                                 "itl_p99": [1e3 * m.itl.p99 for m in ms]}
    return data


def plot_disagg_view(data: dict, axes) -> None:
    """Goodput, TTFT p90 and ITL p99 against arrival rate, one line per layout, SLOs dashed."""
    styles = [dict(color="0.35", marker="o"), dict(color="tab:purple", marker="s")]
    ax_g, ax_t, ax_i = axes
    for (name, d), st in zip(data["layouts"].items(), styles):
        ax_g.plot(data["rates"], d["goodput"], label=name, **st)
        ax_t.plot(data["rates"], d["ttft_p90"], label=name, **st)
        ax_i.plot(data["rates"], d["itl_p99"], label=name, **st)
    ttft_slo, itl_slo = data["slo_ms"]
    ax_t.axhline(ttft_slo, color="tab:red", ls="--", lw=1, label=f"SLO: TTFT {ttft_slo:g} ms")
    ax_i.axhline(itl_slo, color="tab:red", ls="--", lw=1, label=f"SLO: p99 ITL {itl_slo:g} ms")
    ax_g.set_ylabel("goodput (requests/s within the SLO)")
    ax_t.set_ylabel("TTFT p90 (ms, log)")
    ax_i.set_ylabel("ITL p99 over all gaps (ms, log)")
    _log(ax_t, "y")
    _log(ax_i, "y")
    for ax, what in ((ax_g, "Goodput"), (ax_t, "Time to first token"), (ax_i, "Inter-token latency")):
        ax.set_xlabel("arrival rate (requests/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(what, fontsize=10)
    ax_g.figure.suptitle(f"Colocated vs disaggregated, SLO TTFT <= {ttft_slo:g} ms and per-request p99 ITL <= "
                         f"{itl_slo:g} ms\n{data['label']}", fontsize=9)


LINK_CHOICES = [("NVLink 4: 450 GB/s", 450e9), ("PCIe 5.0 x16: 64 GB/s", 64e9),
                ("InfiniBand NDR: 50 GB/s", 50e9), ("100 GbE: 12.5 GB/s", 12.5e9),
                ("10 GbE: 1.25 GB/s", 1.25e9)]


def disagg_explorer(study, ttft_slo_ms: float, itl_slo_ms: float, link_bandwidth: float = 50e9):
    """P:D split, link and SLOs over the simulator (modelled). A new split or link simulates its
    rates once (a few seconds); SLO changes only re-score the cached runs."""
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
    status = W.HTML("modelled (simulator)")
    out = W.Output()

    def draw(_=None):
        status.value = "simulating..."

        def fig():
            _, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
            plot_disagg_view(compute_disagg_view(study, split.value, link.value, ttft.value, itl.value), axes)
        _show(out, fig)
        status.value = "modelled (simulator)"
    for w in (split, link, ttft, itl):
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([split, link]), W.HBox([ttft, itl, status]), out])


def plot_layout_itl(results: dict, label: str, ax=None):
    """Tail of the inter-token latency for each layout at one rate (modelled)."""
    ax = _axes(ax, (7, 3.8))
    for (name, res), color in zip(results.items(), ["0.35", "tab:purple", "tab:green"]):
        _ccdf(ax, [1e3 * g for o in res.outputs if completed(o) for g in itls(o)], color=color, lw=2,
              label=name)
    _log(ax, "x")
    _log(ax, "y")
    ax.set_xlabel("inter-token latency x (ms, log)")
    ax.set_ylabel("fraction of gaps longer than x (log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"ITL tail, colocated vs disaggregated\n{label}", fontsize=10)
    return ax.figure
