"""What a screenshot review of the lessons found hard to read, kept fixed: log axes in plain
numbers, an SLO far above the data drawn as a note (not a line squashing the curves), whole
draft positions, a roofline's point labels off its lines, tables without exponents, labels of
8 points or more, printed sizes that fit a slide, and throughput's markers visible where goodput
equals it."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from nanoserve.course import annotate  # noqa: E402
from nanoserve.course import figures_speculative as spec_figs  # noqa: E402
from nanoserve.course.widgets.disaggregation import _slo_line  # noqa: E402
from nanoserve.measure.figures import plain_log_ticks  # noqa: E402
from nanoserve.measure.roofline import DeviceCeilings  # noqa: E402


@pytest.fixture(autouse=True)
def close():
    yield
    plt.close("all")


def tick_labels(axis) -> list[str]:
    axis.figure.canvas.draw()
    return [t.get_text() for t in axis.get_majorticklabels() + axis.get_minorticklabels() if t.get_text()]


def test_log_ticks_read_as_plain_numbers():
    _, ax = plt.subplots()
    ax.semilogy([1, 2], [5, 40])
    plain_log_ticks(ax)
    labels = tick_labels(ax.yaxis)
    assert "10" in labels and "20" in labels, labels
    assert not any("times" in t or "^" in t for t in labels), labels
    _, ax = plt.subplots()
    ax.semilogy([1, 2], [65, 75])  # under 3x: every minor tick named, so the axis has labels
    plain_log_ticks(ax)
    assert {"70"} <= set(tick_labels(ax.yaxis))


def test_an_slo_far_above_the_data_is_a_note_not_a_line():
    _, ax = plt.subplots()
    ax.set_yscale("log")
    ax.plot([1, 2, 3], [65, 72, 75])
    _slo_line(ax, 400, [65, 72, 75])
    assert not [ln for ln in ax.lines if ln.get_label().startswith("SLO")]
    assert any("SLO 400 ms" in t.get_text() for t in ax.texts)
    assert ax.get_ylim()[1] < 400 and ax.get_ylim()[1] / ax.get_ylim()[0] >= 4
    _, ax = plt.subplots()
    ax.set_yscale("log")
    _slo_line(ax, 100, [65, 72, 75])
    assert [ln.get_label() for ln in ax.lines] == ["SLO 100 ms"] and not ax.texts


def test_draft_positions_are_whole_numbers():
    on = SimpleNamespace(per_position=lambda: [1.0, 0.8, 0.5], acceptance_rate=0.77)
    fig = spec_figs.plot_acceptance([SimpleNamespace(task="quote-back", on=[on])], "measured on a test CPU")
    assert list(fig.axes[0].get_xticks()) == [1, 2, 3]


def test_roofline_labels_stay_off_the_roof_lines():
    ceilings = DeviceCeilings("cpu", "test CPU", 1, "2.13", "2026-11-30", False, 30e9, 26.5e9,
                              {"float32": 187e9, "bfloat16": 400e9})
    near_roof = [("b=64", 28.0, 158e9), ("b=256", 85.0, 172e9)]
    fig = annotate.roofline(ceilings, "float32", near_roof)
    ax = fig.axes[0]
    r = fig.canvas.get_renderer()
    lines = [annotate._line_pixels(ln) for ln in ax.lines if len(ln.get_xdata()) > 1]
    for t in ax.texts:
        if t.get_text():
            box = t.get_window_extent(r)
            crossed = [p for p in lines if np.any((p[:, 0] >= box.x0) & (p[:, 0] <= box.x1)
                                                  & (p[:, 1] >= box.y0) & (p[:, 1] <= box.y1))]
            assert not crossed, t.get_text()


def test_table_numbers_read_plainly():
    from nanoserve.course.table import Table
    text = repr(Table([{"a": 9284.0, "b": 3.35e-05, "c": 4.19e5, "d": 0.5, "e": float("inf")}]))
    assert "e+" not in text and "e-" not in text, text
    assert text.split("\n")[1].split() == ["9280", "0.0000335", "419000", "0.5", "inf"]


def test_flattened_batch_labels_are_8_points_or_more():
    from nanoserve.course.exercise_figures import plot_flattened_batch
    fig = plot_flattened_batch()
    fig.canvas.draw()
    sizes = [t.get_fontsize() for ax in fig.axes for t in ax.texts]
    assert fig.get_figwidth() <= 9 and sizes and min(sizes) >= 8, (fig.get_figwidth(), min(sizes))


def test_a_lessons_sizes_print_within_100_columns():
    from nanoserve.course import setup
    for lesson in setup.SIZES:
        for quick in (True, False):
            S = setup.sizes(lesson, quick=quick, device="cpu")
            assert max(map(len, repr(S).splitlines())) <= 100 and eval(repr(S)) == dict(S), repr(S)


def test_throughput_and_goodput_both_show_where_they_are_equal():
    from nanoserve.course.figures import plot_goodput
    points = [SimpleNamespace(offered=r, throughput=r, goodput=r) for r in (1.0, 2.0, 3.0)]
    fig = plot_goodput(points, {"tpot": 0.05}, "measured on a test CPU")
    ax = fig.axes[0]
    fig.set_dpi(100)
    fig.canvas.draw()  # the layout first: it places the axes
    x, y = ax.transData.transform((2.0, 2.0))
    row, col = fig.canvas.get_width_height()[1] - round(y), round(x)

    def around_the_point():
        fig.canvas.draw()
        return np.asarray(fig.canvas.buffer_rgba())[row - 12:row + 13, col - 12:col + 13, :3].astype(int)
    both = around_the_point()
    for name in ("throughput, measured", "goodput, measured"):
        line = next(ln for ln in ax.lines if ln.get_label() == name)
        line.set_visible(False)
        changed = (np.abs(around_the_point() - both).max(axis=-1) > 60).sum()
        line.set_visible(True)
        assert changed >= 20, f"{name}: hiding it changes {changed} pixels at a point where the two are equal"


def test_a_long_reference_label_leaves_the_prefill_panels_their_width():
    from nanoserve.course.experiments import fit_prefill
    from nanoserve.course.figures import plot_prefill_fit
    lengths, seconds = [32, 128, 512, 1024], [0.004, 0.009, 0.03, 0.07]
    points = [SimpleNamespace(length=n, seconds=t, times=[t, 1.1 * t]) for n, t in zip(lengths, seconds)]
    label = "cpu: AMD EPYC (2 cores; AVX2, AVX-512, no AMX), 2026-12-02, quick sizes"
    fig = plot_prefill_fit(points, fit_prefill(lengths, seconds), "measured on a test CPU",
                           reference=(label, list(zip(lengths, seconds))))
    fig.canvas.draw()
    widths = [ax.get_position().width for ax in fig.axes]
    assert min(widths) >= 0.4, widths
