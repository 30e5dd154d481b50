"""What keeps the lesson figures readable on a projector and honest on a noisy laptop: point
labels that never overlap, and points that disagree wildly with their neighbours flagged on the
figure instead of plotted as if they were as good as the rest.

  spread_labels(ax)          moves each annotation of ax to the first free spot around its point
  outliers(x, y, factor)     which points of a sweep sit factor x off what their neighbours predict
  mark_outliers(ax, x, y)    rings those points in red, with a legend entry saying why
  roofline(...)              measure.roofline.plot_roofline with both of the above
  titled(ax, what, label)    a title naming where the figure's numbers come from

Deliberately left out: measuring (course.experiments) and the figures themselves (course.figures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

OUTLIER_FACTOR = 3.0  # "wildly": 3x off both what the neighbours predict
FLAG_COLOR = "tab:red"
# candidate offsets (points) of a label from its point, nearest first, with the alignment that
# keeps the text on that side of the point
_RINGS = (6, 16, 28, 42)
_DIRECTIONS = ((1, 0.6, "left", "bottom"), (1, -0.6, "left", "top"), (-1, 0.6, "right", "bottom"),
               (-1, -0.6, "right", "top"), (0, 1, "center", "bottom"), (0, -1, "center", "top"))


def titled(ax, what: str, label) -> None:
    """Title `what`, and on a second line where the numbers come from (measure.figures.device_label)."""
    from nanoserve.measure.figures import device_label
    ax.set_title(f"{what}\n{device_label(label)}", fontsize=10)


def _boxes_overlap(a, b, pad: float = 1.0) -> bool:
    return not (a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0)


def _line_pixels(line, step: float = 3.0):
    """Points every `step` pixels along a drawn line (display coordinates, n x 2)."""
    xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) < 2:
        return xy
    counts = np.maximum(1, np.ceil(np.hypot(*np.diff(xy, axis=0).T) / step)).astype(int)
    return np.concatenate([np.linspace(a, b, k, endpoint=False) for a, b, k in zip(xy[:-1], xy[1:], counts)]
                          + [xy[-1:]])


def _marker_pixels(line):
    xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
    return xy[np.isfinite(xy).all(axis=1)].reshape(-1, 2)


def spread_labels(ax) -> int:
    """Place every point label (an Annotation with textcoords "offset points") of `ax` at the
    nearest offset where it overlaps no label placed before it, no other text, no plotted marker
    of another label's point, no drawn line and no legend, staying inside the axes; a label moved
    from its first spot (up and right of its point) gets a thin leader line. -> how many labels
    were moved."""
    from matplotlib.text import Annotation
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if isinstance(t, Annotation) and t.anncoords == "offset points"]
    inside = ax.get_window_extent(renderer)
    taken = [leg.get_window_extent(renderer) for leg in [ax.get_legend()] if leg is not None]
    taken += [t.get_window_extent(renderer) for t in ax.texts if t not in labels and t.get_text()]
    dots = [ax.transData.transform(t.xy) for t in labels]
    # a line clashes with a label that comes within half its width (plus 2 px) of the text: a
    # thick roof drawn through the text's edge crosses it though its centre stays outside; a
    # series of markers alone (a reference's squares) clashes at its markers, not between them
    lines = [(_line_pixels(ln), ln.get_linewidth() * fig.dpi / 144 + 2) if ln.get_linestyle() != "None"
             else (_marker_pixels(ln), ln.get_markersize() * fig.dpi / 144 + 2)
             for ln in ax.lines if len(ln.get_xdata()) > 1]
    moved = 0
    for i, t in enumerate(labels):
        best = None
        for r in _RINGS:
            for dx, dy, ha, va in _DIRECTIONS:
                t.xyann = (dx * r, dy * r)
                t.set_horizontalalignment(ha)
                t.set_verticalalignment(va)
                box = t.get_window_extent(renderer)
                clash = sum(_boxes_overlap(box, b) for b in taken) + sum(
                    box.x0 - 3 <= x <= box.x1 + 3 and box.y0 - 3 <= y <= box.y1 + 3
                    for j, (x, y) in enumerate(dots) if j != i) + sum(
                    bool(np.any((p[:, 0] >= box.x0 - w) & (p[:, 0] <= box.x1 + w) & (p[:, 1] >= box.y0 - w)
                                & (p[:, 1] <= box.y1 + w))) for p, w in lines)
                out = not (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0
                           and box.y1 <= inside.y1)
                score = (clash + 2 * out, r)
                if best is None or score < best[0]:
                    best = (score, (dx * r, dy * r), ha, va)
                if score[0] == 0:
                    break
            if best[0][0] == 0:
                break
        (_, r), offset, ha, va = best
        t.xyann = offset
        t.set_horizontalalignment(ha)
        t.set_verticalalignment(va)
        if offset != (_DIRECTIONS[0][0] * _RINGS[0], _DIRECTIONS[0][1] * _RINGS[0]):
            moved += 1
            if t.arrow_patch is None:
                ax.annotate("", t.xy, xytext=offset, textcoords="offset points",
                            arrowprops=dict(arrowstyle="-", lw=0.6, color="0.5", shrinkA=0, shrinkB=2))
        taken.append(t.get_window_extent(renderer))
    return moved


def outliers(x: Sequence[float], y: Sequence[float], factor: float = OUTLIER_FACTOR) -> list[bool]:
    """Which points of a sweep (x increasing, y > 0) are more than `factor` x off what their
    neighbours predict. Every pair among the 3 nearest points on each side predicts the point by
    a straight line on log-log axes (so a power law, e.g. a doubling sweep of a linear or
    quadratic cost, predicts itself); the expectation is the median of those predictions, so
    one bad neighbour does not condemn a good point. The worst point beyond `factor` is flagged
    first and left out of every later prediction, then the rest are judged again. With fewer
    than 3 unflagged points there is nothing to compare with: nothing more is flagged."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    if len(lx) != len(ly):
        raise ValueError(f"x and y differ in length: {len(lx)} and {len(ly)}")
    if factor <= 1:
        raise ValueError(f"factor must be > 1, got {factor}")
    flagged: set[int] = set()
    if not np.all(np.isfinite(ly)):
        return [False] * len(lx)
    while len(lx) - len(flagged) >= 3:
        keep = [i for i in range(len(lx)) if i not in flagged]
        worst, worst_dev = None, math.log(factor)
        for k, i in enumerate(keep):
            near = keep[max(0, k - 3):k] + keep[k + 1:k + 4]
            guesses = [ly[a] + (ly[b] - ly[a]) * (lx[i] - lx[a]) / (lx[b] - lx[a])
                       for j, a in enumerate(near) for b in near[j + 1:] if lx[a] != lx[b]]
            dev = abs(ly[i] - float(np.median(guesses))) if guesses else 0.0
            if dev > worst_dev:
                worst, worst_dev = i, dev
        if worst is None:
            break
        flagged.add(worst)
    return [i in flagged for i in range(len(lx))]


def mark_outliers(ax, x, y, factor: float = OUTLIER_FACTOR) -> list[int]:
    """Ring the outliers of (x, y) in red on ax, with one legend entry per axes saying why.
    -> their indices."""
    idx = [i for i, f in enumerate(outliers(x, y, factor)) if f]
    if idx:
        text = f"flagged: {factor:g}x off its neighbours (busy machine? re-run)"
        ax.plot([x[i] for i in idx], [y[i] for i in idx], "o", ms=14, mfc="none", mec=FLAG_COLOR, mew=2,
                zorder=5, label=None if any(ln.get_label() == text for ln in ax.lines) else text)
    return idx


def roofline(ceilings, dtype, points=(), sweep: bool = False, reference=None, ax=None):
    """measure.roofline.plot_roofline with labels spread apart; sweep=True flags points far off
    their neighbours (one series in order, e.g. batch sizes); `reference` (label, points) draws
    another machine's points in grey (course.reference)."""
    from nanoserve.measure.roofline import plot_roofline
    points = list(points)
    fig = plot_roofline(ceilings, dtype, points, ax=ax)
    ax = fig.axes[0] if ax is None else ax
    if reference is not None:
        name, ref = reference
        ax.plot([p[1] for p in ref], [p[2] / 1e9 for p in ref], "s", color="0.6", ms=5, zorder=1,
                label=f"reference: {name}")
    if sweep and points:
        mark_outliers(ax, [p[1] for p in points], [p[2] / 1e9 for p in points])
    if reference is not None or sweep:  # below the axes: inside, it would hide the low-intensity points
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize=8, frameon=False)
    from matplotlib.text import Annotation
    labels = [t for t in ax.texts if isinstance(t, Annotation)]
    for t in labels:  # each label in its dot's colour: which label is whose stays clear
        dot = [ln for ln in ax.lines if len(ln.get_xdata()) == 1 and (ln.get_xdata()[0], ln.get_ydata()[0])
               == tuple(t.xy)]
        if dot:
            t.set_color(dot[0].get_color())
    spread_labels(ax)
    return fig
