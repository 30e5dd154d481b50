"""nanoserve.measure.figures, the figures of lessons 00-04: each draws from real quick-mode measurements
(tiny preset) and has a title naming the device, and labelled axes with units."""

import re

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from nanoserve.course import experiments as ex
from nanoserve.course import figures, setup
from nanoserve.measure import roofline
from nanoserve.measure.figures import device_label

matplotlib.use("Agg")

UNIT = re.compile(r"\((?:[^()]*(?:s|ms|tokens?|GFLOP/s|FLOP/byte|tokens/s|log scale)[^()]*)\)")


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny", num_kv_blocks=1024, max_num_seqs=8)


@pytest.fixture(scope="module")
def ceilings():
    return roofline.DeviceCeilings(device="cpu", device_name="Test CPU", num_threads=2,
                                   torch_version=torch.__version__, date="2026-11-29T00:00:00",
                                   quick=True, copy_bandwidth=30e9, weight_read_bandwidth=25e9,
                                   peak_flops={"float32": 200e9, "bfloat16": 400e9})


def check(fig, device="measured on", units=True):
    """Every axes with data has a title naming where it was measured (or the figure does) and
    labelled axes; units in parentheses unless the axis is categorical."""
    titles = " ".join(a.get_title() for a in fig.axes) + (fig._suptitle.get_text() if fig._suptitle else "")
    assert device in titles, f"no device in titles: {titles!r}"
    for ax in fig.axes:
        if not ax.has_data():
            continue
        assert ax.get_title() or fig._suptitle, "an axes without a title"
        if units:
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                assert label, f"unlabelled axis in {ax.get_title()!r}"
    plt.close(fig)


def test_device_label(llm, ceilings):
    assert device_label(ceilings) == "measured on Test CPU (2 threads)"
    label = device_label(llm)
    assert label.startswith("measured on ") and "float32" in label and label.endswith("preset:tiny")
    assert device_label("anything") == "anything"


def test_two_phase_figures(llm, ceilings):
    run = ex.two_phases(llm, 32, 5)
    check(figures.plot_phase_steps(run, llm))
    ctx = ex.decode_context_sweep(llm, (16, 64, 256), steps=2, reps=2, progress=False)
    floors = ex.decode_floors(llm, ceilings, 1, [p.context_len for p in ctx])
    fig = figures.plot_decode_context(ctx, floors, llm)
    assert UNIT.search(fig.axes[0].get_ylabel()) and UNIT.search(fig.axes[0].get_xlabel())
    check(fig)
    sweep = ex.prefill_sweep(llm, (16, 32, 64, 128), reps=1, progress=False)
    fit = ex.fit_prefill([p.length for p in sweep], [p.seconds for p in sweep])
    fig = figures.plot_prefill_fit(sweep, fit, llm)
    assert len(fig.axes) == 2 and all(UNIT.search(a.get_ylabel()) for a in fig.axes)
    assert "30000 tokens" in " ".join(t.get_text() for t in fig.axes[1].texts)
    check(fig)


def test_kv_figures(llm):
    prompt = list(range(10, 26))
    a = ex.generate_with_cache(llm, prompt, 6)
    b = ex.generate_without_cache(llm, prompt, 6, progress=False)
    check(figures.plot_cache_comparison(a, b, len(prompt), llm))
    run = ex.fragmentation_run(llm, ex.fragmentation_workload(llm, 6, 16, 12), 3, progress=False)
    check(figures.plot_fragmentation(run, llm))
    fig = figures.plot_block_map(run, llm)
    assert len(fig.axes[0].patches) >= sum(len(ids) for ids, _ in run.snapshot.values())
    check(fig)


def test_batched_decode_figures(llm, ceilings):
    points = ex.decode_batch_sweep(llm, (1, 2, 4), context_len=16, steps=3, progress=False)
    floors = ex.batch_floors(llm, ceilings, points)
    check(figures.plot_decode_batch(points, floors, llm, roofline.critical_batch_size(ceilings, "float32")))
    small, big, target = ex.itl_target(points)
    check(figures.plot_goodput(ex.goodput_points(points, target), {"tpot": target}, llm, x="batch"))
    check(roofline.plot_roofline(ceilings, "float32", ex.decode_points(llm, points)))
    prefill = ex.prefill_batch_sweep(llm, (1, 2, 4), prompt_len=16, reps=1, progress=False)
    fig = figures.plot_batching_gain(points, prefill, llm)
    assert len(fig.axes) == 2 and all(UNIT.search(a.get_xlabel()) for a in fig.axes)
    gain = {line.get_label(): line.get_ydata() for line in fig.axes[1].get_lines()}
    assert gain["decode: n sequences, one token each"][0] == gain["prefill: n prompts of 16 tokens"][0] == 1
    check(fig)


def test_policy_figures(llm):
    wl = ex.serving_workload(llm, 5, 2, (8, 16), (2, 5))
    results = ex.compare_policies(llm, wl, 2, progress=False)
    fig = figures.plot_timelines(results)
    assert len(fig.axes) == 2 and "static" in fig.axes[0].get_title()
    check(fig)
    check(figures.plot_batch_occupancy(results))
    fig = figures.plot_policies(results)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["static", "continuous"]
    check(fig)
