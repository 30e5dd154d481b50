"""Lesson 12's figures: the verify step's cost against query positions, acceptance by draft
position, measured speedup beside the simple model's, and the rejection sampler's draws against
the target distribution (course.experiments.speculative)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nanoserve.course.annotate import titled
from nanoserve.measure.figures import MEASURED_COLOR, MODELLED_COLOR, get_axes


def plot_verify_cost(points: Sequence, label, ax=None):
    """Step ms against positions per sequence, a line per batch; the roofline floor dashed."""
    ax = get_axes(ax)
    for i, b in enumerate(sorted({p.batch for p in points})):
        ps = [p for p in points if p.batch == b]
        color = f"C{i}"
        ax.plot([p.positions for p in ps], [1e3 * p.step_seconds for p in ps], "o-", color=color,
                label=f"batch {b}, measured")
        ax.plot([p.positions for p in ps], [1e3 * p.floor_seconds for p in ps], "--", color=color,
                alpha=0.6, label=f"batch {b}, roofline floor (modelled)")
    ax.set_xlabel("query positions per sequence (1 + drafts checked)")
    ax.set_ylabel("ms per step")
    ax.set_xticks(sorted({p.positions for p in points}))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    titled(ax, "What checking k drafts costs", label)
    return ax.figure


def plot_acceptance(comps: Sequence, label, ax=None):
    """Per draft position, the fraction of verify steps that accepted it, a bar group per task."""
    ax = get_axes(ax)
    width = 0.8 / max(len(comps), 1)
    positions = 0
    for i, c in enumerate(comps):
        rates = c.on[0].per_position()
        positions = max(positions, len(rates))
        ax.bar(np.arange(1, len(rates) + 1) + (i - (len(comps) - 1) / 2) * width, rates, width,
               label=f"{c.task}: {c.on[0].acceptance_rate:.0%} of drafts accepted")
    ax.set_xticks(range(1, positions + 1))  # whole positions: there is no draft 1.5
    ax.set_xlabel("draft position j (1 = the first guessed token)")
    ax.set_ylabel("share of verify steps accepting draft j")
    ax.set_ylim(0, 1.05)
    ax.grid(True, axis="y", alpha=0.3)
    # below the axes: bars of every height fill the panel's top
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)
    titled(ax, "Prompt lookup (ngram): acceptance by position", label)
    return ax.figure


def plot_speedup(comps: Sequence, ratios: dict[int, float], label, ax=None):
    """Measured speedup per (task, batch) beside the simple model's prediction; 1x marked."""
    ax = get_axes(ax)
    names = [f"{c.task}\nbatch {c.on[0].batch}" + (f"\n{c.on[0].label}" if c.on[0].label != "ngram" else "")
             for c in comps]
    x = np.arange(len(comps))
    measured = [c.speedup for c in comps]
    predicted = [c.predicted_speedup(ratios[c.on[0].batch]) for c in comps]
    ax.bar(x - 0.2, measured, 0.4, color=MEASURED_COLOR, label="measured")
    ax.bar(x + 0.2, predicted, 0.4, color=MODELLED_COLOR, alpha=0.7,
           label="simple model (from measured acceptance, verify cost)")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("decode speedup (TPOT without / with)")
    ax.set_ylim(0, 1.35 * max(measured + predicted + [1.0]))  # headroom: the legend above the bars
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, axis="y", alpha=0.3)
    titled(ax, "Speedup: measured and predicted", label)
    return ax.figure


def plot_sampling(check, ax=None):
    """Target p, the rejection sampler's measured draws, and the mistake's computed distribution."""
    ax = get_axes(ax, (7, 3.5))
    x = np.arange(len(check.target))
    ax.bar(x - 0.27, check.target, 0.27, color="tab:gray", label="target p")
    ax.bar(x, check.counts / check.samples, 0.27, color=MEASURED_COLOR,
           label=f"rejection sampler, {check.samples} draws (measured)")
    ax.bar(x + 0.27, check.mistake, 0.27, color="tab:red", alpha=0.7,
           label="rejected: draw from p again (computed)")
    ax.annotate("draft", (check.draft, max(check.mistake[check.draft], check.target[check.draft])),
                textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    ax.set_xticks(x)
    ax.set_xlabel("token")
    ax.set_ylabel("probability")
    ax.legend(fontsize=8)
    titled(ax, "Sampling with speculation keeps the distribution", "rejection sampling, measured on this CPU")
    return ax.figure
