"""Figures of a measured run (a bench.BenchResult): who ran when, latency, step times.

Every figure names the device it was measured on in its title, and every axis has a unit.
Each function draws on `ax` (a new figure when None) and returns the Figure. matplotlib is
imported inside the functions so that importing nanoserve never needs a display backend.
Deliberately left out: the roofline plot (roofline.plot_roofline) and interactive widgets.
"""

from __future__ import annotations

import numpy as np

from nanoserve.metrics import completed, itls, ttft

PREFILL_COLOR, DECODE_COLOR = "tab:orange", "tab:blue"


def _axes(ax, size=(8, 4)):
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=size, constrained_layout=True)
    return ax


def _title(ax, what: str, result) -> None:
    ax.set_title(f"{what}: {result.workload.name}\n{result.device_label}", fontsize=10)


def plot_timeline(result, ax=None):
    """One row per request: its prefill chunks and decode steps as bars along time, its arrival
    as a tick. Runs of consecutive steps are merged into one bar; a gap is a step it sat out."""
    ax = _axes(ax, (9, max(3.0, 0.18 * len(result.outputs) + 1.5)))
    row = {o.request_id: i for i, o in enumerate(result.outputs)}
    spans: dict[tuple[int, str], list[list[float]]] = {}
    last: dict[tuple[int, str], int] = {}
    for rec in result.trace:
        t0, t1 = rec.start - result.start, rec.end - result.start
        for rid, kind, _ in rec.entries:
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
              loc="upper right", fontsize=8)
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
    ax = _axes(ax)
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
    ax = _axes(ax)
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


# --- Figures of lessons 00-04 (data from nanoserve.experiments) -----------------------------

def device_label(x) -> str:
    """'measured on <device> (<threads>), <dtype>, <N>M-param model' for an LLM or engine;
    'measured on <device> (<threads>)' for roofline ceilings; a BenchResult's own label."""
    if isinstance(x, str):
        return x
    if hasattr(x, "device_label"):  # a BenchResult
        return x.device_label
    if hasattr(x, "peak_flops"):  # roofline.DeviceCeilings
        threads = f" ({x.num_threads} threads)" if x.device == "cpu" else ""
        return f"measured on {x.device_name}{threads}"
    from nanoserve.bench import device_label as engine_label
    engine = getattr(x, "engine", x)
    name = getattr(x, "name", None) or f"{engine.model_config.num_params() / 1e6:.0f}M-param model"
    return f"measured on {engine_label(engine)}, {name}"


def _titled(ax, what: str, label) -> None:
    ax.set_title(f"{what}\n{device_label(label)}", fontsize=10)


def plot_phase_steps(run, label, ax=None):
    """Each step of one request: the prefill step, then one decode step per token (log time)."""
    ax = _axes(ax)
    colors = [PREFILL_COLOR if k == "prefill" else DECODE_COLOR for k in run.kinds]
    ax.bar(range(len(run.seconds)), [1e3 * s for s in run.seconds], color=colors)
    ax.set_yscale("log")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=PREFILL_COLOR, label=f"prefill: {run.prompt_len} tokens, one step"),
                       Patch(color=DECODE_COLOR, label="decode: 1 token per step")], fontsize=8)
    ax.set_xlabel("step of the request")
    ax.set_ylabel("step time (ms, log scale)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    _titled(ax, "One request, step by step", label)
    return ax.figure


def plot_prefill_fit(points, fit, label, extrapolate_to: int = 30000):
    """Left: measured prefill times with the fit split into its linear and quadratic parts.
    Right: the same on log axes, the fit carried out to `extrapolate_to` tokens (dashed)."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    L = np.array([p.length for p in points])
    t = np.array([p.seconds for p in points])
    lo = t - np.array([min(p.times) for p in points])
    hi = np.array([max(p.times) for p in points]) - t
    x = np.linspace(0, L.max(), 200)
    lin = fit.fixed + fit.per_token * x
    a.fill_between(x, 0, lin, color="tab:green", alpha=0.25, label="fit: fixed + linear part")
    a.fill_between(x, lin, lin + fit.per_token2 * x * x, color="tab:red", alpha=0.25,
                   label="fit: quadratic part (attention)")
    a.errorbar(L, t, yerr=[lo, hi], fmt="ko", ms=4, capsize=2, label="measured (median, min-max)")
    a.set_xlabel("prompt length (tokens)")
    a.set_ylabel("prefill time (s)")
    a.legend(fontsize=8)
    a.grid(True, alpha=0.3)
    _titled(a, "Prefill time against prompt length", label)
    xs = np.logspace(np.log10(L.min()), np.log10(max(extrapolate_to, L.max())), 200)
    inside = xs <= L.max()
    b.loglog(xs[inside], fit.predict(xs[inside]), "k-", label="fit, within measured lengths")
    b.loglog(xs[~inside], fit.predict(xs[~inside]), "k--", label="fit, extrapolated")
    b.loglog(xs, fit.fixed + fit.per_token * xs, color="tab:green", lw=1, label="linear part alone")
    b.loglog(L, t, "ko", ms=4, label="measured")
    for n, offset, va in ((300, (-8, 6), "bottom"), (extrapolate_to, (-8, -4), "top")):
        b.plot([n], [fit.predict(n)], "s", color="tab:red", ms=6)
        b.annotate(f"{n} tokens: {float(fit.predict(n)):.3g} s", (n, fit.predict(n)),
                   textcoords="offset points", xytext=offset, ha="right", va=va, fontsize=8)
    b.set_xlabel("prompt length (tokens, log scale)")
    b.set_ylabel("prefill time (s, log scale)")
    b.legend(fontsize=8, loc="upper left")
    b.grid(True, which="both", alpha=0.3)
    _titled(b, f"Fitted, carried out to {extrapolate_to} tokens (dashed: modelled)", label)
    return fig


def plot_decode_vs_floor(run, floors, label, ax=None):
    """Each decode step of one request against the roofline floor at its context length."""
    ax = _axes(ax)
    ctx = [c for c, k in zip(run.contexts, run.kinds) if k == "decode"]
    ax.plot(ctx, [1e3 * s for s in run.decode_seconds], "o", color=DECODE_COLOR,
            label="measured decode step")
    ax.plot(ctx, [1e3 * f for f in floors], "k--",
            label="roofline floor: bytes / bandwidth (modelled from the measured ceiling)")
    ax.set_ylim(0, None)
    ax.set_xlabel("context length (tokens in the KV cache)")
    ax.set_ylabel("decode step time (ms)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, alpha=0.3)
    _titled(ax, "Decode at batch 1 against its floor", label)
    return ax.figure


def plot_cache_comparison(with_cache, without, prompt_len: int, label, ax=None):
    """Time of each generated token with a KV cache and when everything is recomputed."""
    ax = _axes(ax)
    pos = np.arange(len(with_cache.seconds)) + prompt_len
    ax.plot(pos, [1e3 * s for s in without.seconds], "o-", ms=3, color="tab:red",
            label=f"recompute everything: total {without.total:.2f} s")
    ax.plot(pos, [1e3 * s for s in with_cache.seconds], "o-", ms=3, color=DECODE_COLOR,
            label=f"with KV cache: total {with_cache.total:.2f} s")
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the sequence before this one")
    ax.set_ylabel("time for this token (ms, log scale)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    _titled(ax, "Generating with and without a KV cache", label)
    return ax.figure


def plot_fragmentation(run, label, ax=None):
    """KV slots over the run: tokens stored against what each allocation scheme holds."""
    ax = _axes(ax)
    steps = np.arange(len(run.tokens))
    ax.plot(steps, run.reserve_max_len, color="tab:red",
            label=f"contiguous, max_model_len ({run.max_model_len}) per request")
    ax.plot(steps, run.reserve_request, color="tab:purple",
            label=f"contiguous, prompt + longest output ({run.max_tokens_cap}) per request")
    ax.plot(steps, run.paged, color=DECODE_COLOR, label=f"paged, blocks of {run.block_size}")
    ax.fill_between(steps, 0, run.tokens, color="tab:green", alpha=0.4, label="tokens stored")
    ax.set_yscale("symlog", linthresh=100)
    ax.set_xlabel("engine step")
    ax.set_ylabel("KV slots (tokens; log scale above 100)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    _titled(ax, "KV memory held against KV memory used", label)
    return ax.figure


def plot_block_map(run, label, ax=None):
    """The block pool at the run's fullest step: each cell a block, coloured by its request,
    filled in proportion to the tokens it holds. A request's blocks need not be adjacent."""
    import matplotlib.pyplot as plt
    owner = {}
    for i, (rid, (blocks, tokens)) in enumerate(sorted(run.snapshot.items(), key=lambda kv: int(kv[0])
                                                       if kv[0].isdigit() else kv[0])):
        for j, b in enumerate(blocks):
            fill = min(run.block_size, max(0, tokens - j * run.block_size)) / run.block_size
            owner[b] = (i, fill)
    n = max(owner) + 1 if owner else 1
    cols = int(np.ceil(np.sqrt(n * 2)))
    rows = int(np.ceil(n / cols))
    ax = _axes(ax, (9, max(2.0, 0.35 * rows + 1.2)))
    cmap = plt.get_cmap("tab20")
    for b in range(n):
        r, c = divmod(b, cols)
        ax.add_patch(plt.Rectangle((c, -r), 0.95, -0.9, fill=False, lw=0.3, color="grey"))
        if b in owner:
            i, fill = owner[b]
            ax.add_patch(plt.Rectangle((c, -r), 0.95 * fill, -0.9, color=cmap(i % 20)))
            ax.text(c + 0.47, -r - 0.45, str(i), ha="center", va="center", fontsize=6)
    ax.set_xlim(0, cols)
    ax.set_ylim(-rows, 0.1)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(f"block id, row by row ({cols} per row); number and colour: the request owning it; "
                  f"fill: tokens held out of {run.block_size}", fontsize=8)
    ax.set_ylabel(f"blocks {cols} x row ... {cols} x row + {cols - 1}", fontsize=8)
    _titled(ax, f"The block pool at the fullest step ({len(run.snapshot)} running requests)", label)
    return ax.figure


def plot_decode_batch(points, floors, label, critical_batch: float | None = None):
    """Left: decode throughput against batch size. Right: ITL against batch size, with the
    roofline floor of a step. Log-2 batch axis; the critical batch as a vertical line."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    B = [p.batch for p in points]
    a.plot(B, [p.tokens_per_s for p in points], "o-", color=DECODE_COLOR, label="measured")
    a.plot(B, [points[0].tokens_per_s * n for n in B], ":", color="grey",
           label="if batching were free (batch 1 x B)")
    b.plot(B, [1e3 * p.itl_seconds for p in points], "o-", color=DECODE_COLOR, label="measured ITL (median)")
    b.plot(B, [1e3 * f for f in floors], "k--", label="roofline floor of a step (modelled)")
    for ax in (a, b):
        if critical_batch is not None:
            ax.axvline(critical_batch, color="tab:red", ls=":",
                       label=f"critical batch {critical_batch:.0f} (from measured ceilings)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (sequences decoding together, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    a.set_yscale("log")
    a.set_ylabel("decode throughput (tokens/s, log scale)")
    b.set_ylabel("inter-token latency (ms)")
    b.set_ylim(0, None)
    _titled(a, "Throughput grows with the batch...", label)
    _titled(b, "...while each token waits a little longer", label)
    return fig


def plot_goodput(points, tpot_slo: float, label, ax=None):
    """Throughput and goodput (tokens/s of requests meeting the TPOT SLO) per batch size."""
    from nanoserve.metrics import tpot
    ax = _axes(ax)
    x = np.arange(len(points))
    good = [p.tokens_per_s * np.mean([(tpot(o) or 0.0) <= tpot_slo for o in p.outputs]) for p in points]
    ax.bar(x - 0.2, [p.tokens_per_s for p in points], 0.4, color="lightgrey", label="throughput")
    ax.bar(x + 0.2, good, 0.4, color="tab:green", label=f"goodput at TPOT <= {1e3 * tpot_slo:.2f} ms")
    ax.set_xticks(x, [str(p.batch) for p in points])
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    _titled(ax, "Throughput against goodput at one latency target", label)
    return ax.figure


def plot_timelines(results: dict):
    """plot_timeline of each result (e.g. each scheduling policy) stacked on one time axis."""
    import matplotlib.pyplot as plt
    n = max(len(r.outputs) for r in results.values())
    fig, axes = plt.subplots(len(results), 1, figsize=(10, len(results) * (0.16 * n + 1.6)),
                             sharex=True, constrained_layout=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results.values()):
        plot_timeline(r, ax)
    return fig


def plot_policies(results: dict):
    """Throughput and latency of each run side by side (bars; latencies' p50 and p90)."""
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.6), constrained_layout=True)
    names = list(results)
    ms = {k: r.metrics() for k, r in results.items()}
    colors = [f"C{i}" for i in range(len(names))]
    a.bar(names, [ms[k].output_throughput for k in names], color=colors)
    a.set_ylabel("output tokens/s")
    a.set_title("Throughput", fontsize=10)
    x = np.arange(len(names))
    for ax, metric, title in ((b, "ttft", "Time to first token"), (c, "e2e", "End-to-end latency")):
        s = [getattr(ms[k], metric) for k in names]
        ax.bar(x - 0.2, [1e3 * v.median for v in s], 0.4, color=colors, label="p50")
        ax.bar(x + 0.2, [1e3 * v.p90 for v in s], 0.4, color=colors, alpha=0.5, label="p90")
        ax.set_xticks(x, names)
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_title(title + " (p50, p90 pale)", fontsize=10)
    for ax in (a, b, c):
        ax.set_xlabel("scheduling policy")
        ax.grid(True, axis="y", alpha=0.3)
    first = next(iter(results.values()))
    fig.suptitle(f"{first.workload.name}, served {len(names)} ways\n"
                 f"{device_label(first).split(', ', 1)[-1]}", fontsize=10)
    return fig


def plot_batch_occupancy(results: dict, ax=None):
    """Sequences in each step against time, one line per run: how full each policy keeps the batch."""
    ax = _axes(ax, (9, 3.2))
    for name, r in results.items():
        ax.step([s.start - r.start for s in r.trace], [len(s.entries) for s in r.trace], where="post",
                label=f"{name}: mean {np.mean([len(s.entries) for s in r.trace]):.2f} per step")
    cap = max(r.config.max_num_seqs for r in results.values())
    ax.axhline(cap, color="grey", ls=":", label=f"max_num_seqs = {cap}")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("sequences in the step")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    first = next(iter(results.values()))
    _titled(ax, "How full the batch is", device_label(first).split(", ", 1)[-1])
    return ax.figure
