"""Lesson 06: TTFT and prompt tokens with prefix caching off and on; what evicts a prefix."""

from __future__ import annotations

from nanoserve.course.widgets.common import log_axis
from nanoserve.measure.figures import PREFILL_COLOR, get_axes
from nanoserve.measure.metrics import completed, ttft


def plot_prefix_compare(results: dict, axes=None):
    """Left: each request's TTFT in arrival order, caching off and on. Right: prompt tokens
    computed versus served from the cache."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(12, 3.8), constrained_layout=True,
                               gridspec_kw={"width_ratios": [2, 1]})
    ax, bx = axes
    colors = {"off": "0.45", "on": "tab:green", "yours": "tab:purple"}  # yours: an ex06 pool
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
        bx.barh(i, cached, left=computed, color="tab:green",
                label="from the prefix cache" if i == 0 else None)
    device = results[names[-1]].device_label
    log_axis(ax, "y")
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
    ax = get_axes(ax, (8, 4.2))
    x = [p.unrelated_tokens for p in points]
    ax.plot(x, [p.cached_tokens for p in points], "o-", color="tab:green",
            label="prefix tokens still cached when it returns")
    capacity = num_kv_blocks * block_size
    ax.axvline(capacity - prefix_len, color="0.4", ls="--", lw=1)
    ax.text(capacity - prefix_len, prefix_len * 0.05, " free room in the cache", fontsize=8, color="0.3")
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
    # below the axes: inside, any spot can hold the first point of one of the two curves
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              frameon=False)
    ax.set_title(f"What evicts a cached prefix: {prefix_len}-token prefix, cache of {num_kv_blocks} "
                 f"blocks x {block_size} tokens\n{device}", fontsize=10)
    return ax.figure
