"""course.annotate: roofline labels that overlapped (lesson 01's "prefill 512/1024/2048") no
longer do, and a timed point far off its neighbours (lesson 03 on a busy machine: batch 1 at
396 ms ITL beside 31 ms at batch 2) is flagged, while clean sweeps of any power law are not."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from nanoserve.course import annotate, figures  # noqa: E402
from nanoserve.course.experiments import DecodePoint  # noqa: E402
from nanoserve.measure.roofline import DeviceCeilings, plot_roofline  # noqa: E402

CEILINGS = DeviceCeilings("cpu", "test CPU", 2, "2.13", "2026-11-30", False, 30e9, 24e9,
                          {"float32": 190e9, "bfloat16": 400e9})
# lesson 01 on a 2-core CPU: three prefills close together near the roof, one decode far left
CROWDED = [("prefill 512", 180.0, 120e9), ("prefill 1024", 210.0, 126e9), ("prefill 2048", 240.0, 118e9),
           ("decode, batch 1", 0.5, 9e9)]


@pytest.fixture(autouse=True)
def close():
    yield
    plt.close("all")


def label_boxes(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return [t.get_window_extent(r) for t in fig.axes[0].texts if t.get_text()]


def overlaps(boxes):
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if annotate._boxes_overlap(a, b, 0)]


def test_roofline_labels_overlapped_and_no_longer_do():
    assert overlaps(label_boxes(plot_roofline(CEILINGS, "float32", CROWDED))), "the case no longer overlaps"
    fig = annotate.roofline(CEILINGS, "float32", CROWDED)
    boxes = label_boxes(fig)
    assert len(boxes) == 4 and not overlaps(boxes)  # one label a point (the ridge is in the legend)
    inside = fig.axes[0].get_window_extent(fig.canvas.get_renderer())
    for b in boxes:
        assert inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1


def test_outliers_flag_the_busy_batch_1_point_only():
    batches = [1, 2, 4, 8, 16, 32, 64]
    itl = [396, 31, 32, 34, 38, 47, 66]  # ms: batch 1 measured while another process ran
    assert annotate.outliers(batches, itl) == [True] + [False] * 6
    spike = [30, 31, 32, 140, 38, 47, 66]
    assert annotate.outliers(batches, spike) == [False, False, False, True, False, False, False]
    dip = [30, 31, 32, 34, 6, 47, 66]
    assert annotate.outliers(batches, dip)[4] and sum(annotate.outliers(batches, dip)) == 1


@pytest.mark.parametrize("power", [0, 1, 2, 3])
def test_outliers_leave_clean_power_laws_and_mild_noise_alone(power):
    x = [32, 64, 128, 256, 512, 1024, 2048]
    y = [(v / 32) ** power * (1.6 if i % 2 else 1.0) for i, v in enumerate(x)]  # +60% every other point
    assert not any(annotate.outliers(x, y))


def test_outliers_refuse_bad_input():
    assert annotate.outliers([1, 2], [5, 500]) == [False, False]  # too few to compare
    with pytest.raises(ValueError, match="differ in length"):
        annotate.outliers([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="factor must be > 1"):
        annotate.outliers([1, 2, 3], [1, 2, 3], factor=1)


def test_decode_batch_figure_rings_the_outlier():
    pts = [DecodePoint(b, 32, s / 1e3, s / 1e3) for b, s in
           zip([1, 2, 4, 8, 16], [396, 31, 32, 34, 38])]
    fig = figures.plot_decode_batch(pts, [0.02] * 5, "measured on test CPU", None)
    legends = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert any(t.startswith("flagged") for t in legends), legends
    clean = [DecodePoint(b, 32, s / 1e3, s / 1e3) for b, s in zip([1, 2, 4, 8, 16], [30, 31, 32, 34, 38])]
    fig = figures.plot_decode_batch(clean, [0.02] * 5, "measured on test CPU", None)
    assert not any(t.get_text().startswith("flagged") for ax in fig.axes for t in ax.get_legend().get_texts())
