"""Figures of lessons 00-04 (data from course.experiments), and the goodput figure lessons 03 and
07 share. Every figure names the device it was measured on (measure.figures.device_label) or
says it is modelled, and every axis has a unit. Lessons 05-09 draw with course.widgets.
"""

from __future__ import annotations

import numpy as np

from nanoserve.course.annotate import mark_outliers
from nanoserve.course.annotate import titled as _titled
from nanoserve.course.figures_policies import plot_batch_occupancy, plot_policies, plot_timelines
from nanoserve.course.setup import slo_text
from nanoserve.measure.figures import (
    DECODE_COLOR,
    MEASURED_COLOR,
    MODELLED_COLOR,
    PREFILL_COLOR,
    device_label,
    get_axes,
    plain_log_ticks,
)

__all__ = ["plot_batch_occupancy", "plot_batching_gain", "plot_block_map", "plot_cache_comparison",
           "plot_decode_batch", "plot_decode_context", "plot_fragmentation", "plot_goodput",
           "plot_phase_steps", "plot_policies", "plot_prefill_fit", "plot_timelines"]


def plot_phase_steps(run, label, ax=None):
    """Each step of one request: the prefill step, then one decode step per token (log time)."""
    ax = get_axes(ax)
    colors = [PREFILL_COLOR if k == "prefill" else DECODE_COLOR for k in run.kinds]
    ax.bar(range(len(run.seconds)), [1e3 * s for s in run.seconds], color=colors)
    ax.set_yscale("log")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=PREFILL_COLOR, label=f"prefill: {run.prompt_len} tokens, one step"),
                       Patch(color=DECODE_COLOR, label="decode: 1 token per step")], fontsize=8)
    ax.set_xlabel("step of the request")
    ax.set_ylabel("step time (ms, log scale)")
    plain_log_ticks(ax)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    _titled(ax, "One request, step by step", label)
    return ax.figure


def plot_prefill_fit(points, fit, label, extrapolate_to: int = 30000, reference=None):
    """Left: measured prefill times with the fit split into its linear and quadratic parts. Right:
    the same on log axes, the fit carried out to `extrapolate_to` tokens (dashed), and
    reference: (label, [(length, seconds)]) of another machine as grey squares."""
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
    mark_outliers(a, L, t)
    a.set_xlabel("prompt length (tokens)")
    a.set_ylabel("prefill time (s)")
    a.legend(fontsize=9, loc="upper left")  # the times rise to the right
    a.grid(True, alpha=0.3)
    _titled(a, "Prefill time against prompt length", label)
    xs = np.logspace(np.log10(L.min()), np.log10(max(extrapolate_to, L.max())), 200)
    inside = xs <= L.max()
    b.loglog(xs[inside], fit.predict(xs[inside]), "k-", label="fit, within measured lengths")
    b.loglog(xs[~inside], fit.predict(xs[~inside]), "k--", label="fit, extrapolated")
    b.loglog(xs, fit.fixed + fit.per_token * xs, color="tab:green", lw=1, label="linear part alone")
    b.loglog(L, t, "ko", ms=4, label="measured")
    if reference is not None:  # here, not on the left: on log axes a faster or slower machine fits
        b.loglog(*zip(*reference[1]), "s", color="0.6", ms=4, label=f"reference: {reference[0]}")
    # the short prompt's note in the empty upper left, with an arrow: beside its point it ran
    # over the axis; the long one's level with it, on its left, above the falling curve
    leader = dict(arrowstyle="-", lw=0.6, color="0.4", shrinkB=4)
    notes = ((300, (0.04, 0.5), "axes fraction", "left", "bottom", leader),
             (extrapolate_to, (-10, 0), "offset points", "right", "center", None))
    for n, xytext, coords, ha, va, arrow in notes:
        b.plot([n], [fit.predict(n)], "s", color="tab:red", ms=6)
        b.annotate(f"{n} tokens: {float(fit.predict(n)):.3g} s", (n, fit.predict(n)), textcoords=coords,
                   xytext=xytext, ha=ha, va=va, fontsize=8, arrowprops=arrow)
    b.set_xlabel("prompt length (tokens, log scale)")
    b.set_ylabel("prefill time (s, log scale)")
    plain_log_ticks(b, "both")
    # under both panels: inside, every corner holds a curve, a point or a note; under this panel
    # alone, a reference's long label made the layout squeeze both panels to fit it
    fig.legend(*b.get_legend_handles_labels(), fontsize=9, loc="outside lower right", ncol=2,
               frameon=False)
    b.grid(True, which="both", alpha=0.3)
    _titled(b, f"Fitted, carried out to {extrapolate_to} tokens (dashed: modelled)", label)
    return fig


def plot_cache_comparison(with_cache, without, prompt_len: int, label, ax=None, reference=None):
    """Time of each generated token with a KV cache and when everything is recomputed (medians
    over repeats; points far off their neighbours ringed). reference: course.reference's
    (label, {"with": [(position, seconds)], "without": [...]}) of another machine, in grey."""
    ax = get_axes(ax)
    for run, color, name in ((without, "tab:red", "recompute everything"), (with_cache, DECODE_COLOR,
                                                                           "with KV cache")):
        x = [prompt_len + i for i in run.positions]
        y = [1e3 * s for s in run.seconds]
        ax.plot(x, y, "o-", ms=3, color=color, label=f"{name}: total {run.total:.2f} s")
        mark_outliers(ax, x, y)
    if reference is not None:
        name, ref = reference
        for key in ("without", "with"):
            ax.plot([prompt_len + i for i, _ in ref[key]], [1e3 * s for _, s in ref[key]], ":", color="0.55",
                    label=f"reference: {name}" if key == "with" else None)
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the sequence before this one")
    ax.set_ylabel("ms for this token\n(log; median of repeats)")
    plain_log_ticks(ax)
    # below the axes, one column: the recompute curve climbs through any corner inside, and two
    # columns of the reference's long label would be wider than the figure
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, frameon=False)
    ax.grid(True, which="both", alpha=0.3)
    _titled(ax, "Generating with and without a KV cache", label)
    return ax.figure


def plot_fragmentation(run, label, ax=None):
    """KV slots over the run: tokens stored against what each allocation scheme holds."""
    ax = get_axes(ax)
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
    ax = get_axes(ax, (9, max(2.0, 0.35 * rows + 1.2)))
    cmap = plt.get_cmap("tab20")
    # a number fills about half its cell; below 7 points it cannot be read, so colour alone tells
    size = 0.5 * 72 * min(ax.figure.get_figwidth() / cols, 0.35)
    numbered = size >= 7
    for b in range(n):
        r, c = divmod(b, cols)
        ax.add_patch(plt.Rectangle((c, -r), 0.95, -0.9, fill=False, lw=0.3, color="grey"))
        if b in owner:
            i, fill = owner[b]
            ax.add_patch(plt.Rectangle((c, -r), 0.95 * fill, -0.9, color=cmap(i % 20)))
            if numbered:
                ax.text(c + 0.47, -r - 0.45, str(i), ha="center", va="center", fontsize=min(size, 10))
    ax.set_xlim(0, cols)
    ax.set_ylim(-rows, 0.1)
    ax.set_xticks([])
    ax.set_yticks([])
    owner_key = "number and colour" if numbered else "colour"
    ax.set_xlabel(f"block id, row by row ({cols} per row); {owner_key}: the request owning it; "
                  f"fill: tokens held out of {run.block_size}", fontsize=9)
    ax.set_ylabel(f"blocks {cols} x row ... {cols} x row + {cols - 1}", fontsize=9)
    _titled(ax, f"The block pool at the fullest step ({len(run.snapshot)} running requests)", label)
    return ax.figure


def plot_decode_batch(points, floors, label, critical_batch: float | None = None, reference=None):
    """Left: decode throughput against batch size. Right: ITL against batch size, with the
    roofline floor of a step. Log-2 batch axis; the critical batch as a vertical line; points far
    off their neighbours ringed. reference: (label, [(batch, ITL seconds)]) of another machine."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.8), constrained_layout=True)
    B = [p.batch for p in points]
    a.plot(B, [p.tokens_per_s for p in points], "o-", color=DECODE_COLOR, label="measured")
    a.plot(B, [points[0].tokens_per_s * n for n in B], ":", color="grey",
           label="if batching were free (batch 1 x B)")
    b.plot(B, [1e3 * p.itl_seconds for p in points], "o-", color=DECODE_COLOR, label="measured ITL (median)")
    b.plot(B, [1e3 * f for f in floors], "k--", label="roofline floor of a step (modelled)")
    mark_outliers(a, B, [p.tokens_per_s for p in points])
    mark_outliers(b, B, [1e3 * p.itl_seconds for p in points])
    if reference is not None:
        name, ref = reference
        a.plot([r[0] for r in ref], [r[0] / r[1] for r in ref], "s:", color="0.6", ms=4,
               label=f"reference: {name}")
        b.plot([r[0] for r in ref], [1e3 * r[1] for r in ref], "s:", color="0.6", ms=4,
               label=f"reference: {name}")
    for ax in (a, b):
        if critical_batch is not None:
            ax.axvline(critical_batch, color="tab:red", ls=":",
                       label=f"critical batch {critical_batch:.0f} (from measured ceilings)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (sequences decoding together, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        # below each panel: inside, the rising curves and the reference fill every corner
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    a.set_yscale("log")
    plain_log_ticks(a, "both")
    plain_log_ticks(b, "x")
    a.set_ylabel("decode throughput (tokens/s, log scale)")
    b.set_ylabel("inter-token latency (ms)")
    b.set_ylim(0, None)
    _titled(a, "Throughput grows with the batch...", label)
    _titled(b, "...while each token waits a little longer", label)
    return fig


def plot_batching_gain(decode, prefill, label):
    """Tokens/s of one step against the sequences in it, decode beside prefill. Left: tokens/s
    (log). Right: each as a multiple of one sequence, with the "free batching" line n x."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    dn = [p.batch for p in decode]
    dt = [p.batch / p.step_seconds for p in decode]
    pn = [p.num_prompts for p in prefill]
    pt = [p.tokens_per_s for p in prefill]
    for ax, d, q in ((a, dt, pt), (b, [v / dt[0] for v in dt], [v / pt[0] for v in pt])):
        ax.plot(dn, d, "o-", color=DECODE_COLOR, label="decode: n sequences, one token each")
        ax.plot(pn, q, "s-", color=PREFILL_COLOR,
                label=f"prefill: n prompts of {prefill[0].prompt_len} tokens")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequences in the step, n (log scale)")
        ax.grid(True, which="both", alpha=0.3)
    mark_outliers(a, dn, dt)
    mark_outliers(a, pn, pt)
    top = max(dn + pn)
    b.plot([1, top], [1, top], ":", color="grey", label="if batching were free (n x)")
    a.set_yscale("log")
    a.set_ylabel("tokens/s of the step (log scale)")
    b.set_ylabel("tokens/s, as a multiple of n = 1")
    b.set_yscale("log", base=2)
    for ax in (a, b):
        plain_log_ticks(ax, "both")
        ax.legend(fontsize=8)
    _titled(a, "Tokens per second of one step", label)
    _titled(b, "What batching gains each phase", label)
    return fig


def plot_decode_context(points, floors, label, ax=None, reference=None):
    """Median decode step time (batch 1) against context length, with the roofline floor; points
    far off their neighbours ringed. reference: (label, [(context, seconds)]) of another machine."""
    ax = get_axes(ax)
    ctx = [p.context_len for p in points]
    lo = [1e3 * (p.step_seconds - min(p.times)) for p in points]
    hi = [1e3 * (max(p.times) - p.step_seconds) for p in points]
    ax.errorbar(ctx, [1e3 * p.step_seconds for p in points], yerr=[lo, hi], fmt="o-", capsize=2,
                color=DECODE_COLOR, label="measured decode step (median, min-max over repeats)")
    ax.plot(ctx, [1e3 * f for f in floors], "k--",
            label="roofline floor: bytes / bandwidth (modelled from the measured ceiling)")
    steps = [1e3 * p.step_seconds for p in points]
    own = steps + [1e3 * f for f in floors]
    mark_outliers(ax, ctx, steps)
    log_y = False
    if reference is not None:
        ref = [1e3 * s for _, s in reference[1]]
        ax.plot([c for c, _ in reference[1]], ref, "s:", color="0.6", ms=4,
                label=f"reference: {reference[0]}")
        # another machine several times slower or faster would squash this one's curve flat
        log_y = max(ref) > 3 * max(own) or min(ref) < min(own) / 3
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, None)
    ax.set_xlabel("context length (tokens in the KV cache, log scale)")
    ax.set_ylabel("decode step time (ms" + (", log scale)" if log_y else ")"))
    plain_log_ticks(ax, "both")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    ax.grid(True, which="both", alpha=0.3)
    _titled(ax, "Decode at batch 1 against context length", label)
    return ax.figure


def plot_goodput(points, slo: dict, label, x: str = "offered", ax=None, modelled=None,
                 modelled_label: str = ""):
    """Request throughput and request goodput against `x` of each point.

    Goodput is vLLM's: completed requests per second that met every SLO. Each point has
    `.throughput` and `.goodput` (requests/s) and the attribute named by x: "offered" (the arrival
    rate, lesson 07) or "batch" (the decode batch size, lesson 03). `modelled` points (the
    calibrated simulator) are drawn as purple lines."""
    ax = get_axes(ax, (7, 4))
    xs = [getattr(p, x) for p in points]
    if x == "offered":
        top = max(xs + [getattr(p, x) for p in (modelled or [])]) * 1.05
        ax.plot([0, top], [0, top], color="0.7", ls="--", lw=1, label="offered = served")
        ax.set_xlabel("offered arrival rate, as the random arrivals came (requests/s)")
    else:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.set_xlabel("batch size (requests decoding together)")
    if modelled:
        mx = [getattr(p, x) for p in modelled]
        ax.plot(mx, [p.throughput for p in modelled], "-", color=MODELLED_COLOR, alpha=0.5,
                label="throughput, modelled")
        ax.plot(mx, [p.goodput for p in modelled], "--", color=MODELLED_COLOR, label="goodput, modelled")
    # throughput as hollow rings wider than goodput's squares, drawn over them: where every
    # request met the SLO the two coincide, and a marker underneath would vanish
    ax.plot(xs, [p.throughput for p in points], "o-", color="0.4", lw=1, ms=10, mfc="none", mew=1.5,
            zorder=3, label="throughput, measured")
    ax.plot(xs, [p.goodput for p in points], "s-", color=MEASURED_COLOR, lw=2, ms=5,
            label="goodput, measured")
    ax.set_ylabel("completed requests/s")
    ax.set_ylim(0, None)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    sub = device_label(label) + (f"\nlines: {modelled_label}" if modelled else "")
    ax.set_title(f"Throughput vs goodput at SLO {slo_text(slo)}\n{sub}", fontsize=10)
    return ax.figure
