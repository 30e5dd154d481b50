"""Figures and dashboards of lessons 05-09 (nanoserve.course.widgets): every compute_/plot_ pair a widget
calls, every figure a lesson draws, and the widgets themselves (built, then moved), on tiny runs."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from nanoserve.course import scenarios as S  # noqa: E402
from nanoserve.course import setup
from nanoserve.course import widgets as W  # noqa: E402
from nanoserve.course.widgets.interference import _ordered  # noqa: E402
from nanoserve.measure.figures import device_label


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny", device="cpu", dtype="float32")


def titled(fig):
    """Every axes with data has a title naming where its numbers come from, and labelled axes."""
    for ax in fig.axes:
        if not ax.has_data() or ax.get_label() == "<colorbar>":
            continue
        twins = ax.get_shared_x_axes().get_siblings(ax)  # a twinx axis shares its partner's title
        title = " ".join(a.get_title() for a in twins) + (fig._suptitle.get_text() if fig._suptitle else "")
        assert "measured on" in title or "modelled" in title or "list price" in title \
            or "providers" in title, f"axes without a source in its title: {title!r}"
        assert ax.get_xlabel() or ax.get_xticklabels(), "x axis unlabelled"
        no_y = len(ax.get_yticks()) == 0  # a time line: y deliberately carries nothing
        assert ax.get_ylabel() or ax.get_yticklabels() or no_y, "y axis unlabelled"


@pytest.fixture(scope="module")
def interference_runs(llm):
    setup = S.interference_setup(llm, num_decoders=2, long_prompt_len=192, num_long=1)
    return S.interference_grid(llm, setup, [32, 96], progress=False)


def test_interference_figures_and_view(interference_runs):
    titled(W.plot_itl_timeline(interference_runs[0]))
    titled(W.plot_budget_tradeoff(interference_runs))
    labels = [r.label for r in _ordered(interference_runs)]
    assert labels[-1] == "no chunking" and labels[0] == "chunked, 32 tok/step"
    data = W.compute_interference_view(interference_runs, labels[0])
    assert data["selected"] == labels[0] and set(data["itl_ms"]) == set(labels)
    assert all(len(v) > 0 for v in data["itl_ms"].values())
    _, axes = plt.subplots(1, 2)
    W.plot_interference_view(data, axes)
    titled(axes[0].figure)
    with pytest.raises(ValueError, match="no run labelled"):
        W.compute_interference_view(interference_runs, "chunked, 7 tok/step")


def test_interference_explorer_slider(interference_runs):
    box = W.interference_explorer(interference_runs)
    slider = box.children[0]
    slider.value = slider.options[-1]  # redraws from the precomputed runs
    assert slider.value == "no chunking"


def test_prefix_figures(llm):
    wl, _ = S.shared_prefix_workload(llm, 4, 64, 8, 2)
    res = S.prefix_cache_compare(llm, wl, progress=False)
    titled(W.plot_prefix_compare(res))
    points = S.eviction_sweep(llm, 16, 64, 48, [0, 6], progress=False)
    titled(W.plot_eviction(points, 16, 16, 64, device_label(llm)))


@pytest.fixture(scope="module")
def device_model(llm):
    return S.calibrate_device(llm, num_requests=6, input_median=32, output_median=6, progress=False)


def test_measuring_figures(llm, device_model):
    weeks = S.workload_shift(llm, 6, 24, 4, 16, progress=False)
    titled(W.plot_request_anatomy(weeks["before"]))
    titled(W.plot_metric_distributions(weeks["before"]))
    titled(W.plot_stratified(weeks, "tpot", buckets=(1, 8, 32)))
    fig = W.plot_stratified(weeks, "ttft", buckets=S.length_buckets(24), by="input")
    titled(fig)
    assert fig.axes[0].get_xlabel() == "input length bucket (tokens)"
    make = S.chat_maker(llm, 4, 24, 4)
    slo = {"ttft": 1.0, "tpot": 1.0}
    measured = S.rate_sweep(llm, [20.0], make, slo, progress=False)
    modelled = S.simulated_rate_sweep(device_model, [10.0, 20.0], make, slo)
    titled(W.plot_goodput(measured, slo, weeks["before"].device_label, modelled=modelled,
                          modelled_label=device_model.label))


def test_dashboard_compute_measure_plot_and_widget(llm, device_model):
    make = S.chat_maker(llm, 4, 24, 4)
    slo = {"ttft": 0.5, "tpot": 0.1}
    modelled = W.compute_dashboard(device_model, make, 20.0, 4, 64, slo)
    measured = W.measure_dashboard_point(llm, make, 20.0, 4, 64, slo)
    for d in (modelled, measured):
        assert d["params"] == dict(rate=20.0, max_num_seqs=4, max_num_batched_tokens=64)
        assert len(d["ttft_ms"]) == 4 and np.all(np.diff(d["ttft_ms"]) >= 0)
        assert 0 <= d["attainment"] <= 1
    assert modelled["label"].startswith("modelled") and measured["label"].startswith("measured on")
    _, axes = plt.subplots(1, 3)
    W.plot_dashboard(modelled, axes, measured)
    titled(axes[0].figure)
    slo_lines = [[line.get_label() for line in ax.get_lines() if line.get_label().startswith("SLO")]
                 for ax in axes]  # each limit on the axis of the quantity it limits
    assert slo_lines == [["SLO TTFT 500 ms"], ["SLO TPOT 100 ms"], []], slo_lines
    assert [ax.get_xlabel() for ax in axes] == ["TTFT (ms, log)", "TPOT (ms, log)", "ITL (ms, log)"]
    box = W.serving_dashboard(device_model, llm, make, slo, max_rate=30.0)
    (_, seqs, budget), (button, status) = box.children[0].children, box.children[1].children
    seqs.value = 2
    budget.value = 32
    button.click()  # measures this point on the real engine
    assert status.value.startswith("measured")


def test_cost_figures_and_explorer(llm):
    runs = S.batch_cap_runs(llm, [1, 4], 4, 32, 4, progress=False)
    titled(W.plot_step_time_fit(runs))
    titled(W.plot_step_time_fit(runs[4]))
    a, b = W.compute_cost_view(runs, 1.0), W.compute_cost_view(runs, 2.0)
    assert b["out"] == pytest.approx([2 * x for x in a["out"]])  # linear in the price
    assert b["ratio"] == pytest.approx(a["ratio"])  # the ratio doesn't depend on it
    assert len(a["providers"]) > 0
    _, axes = plt.subplots(1, 2)
    W.plot_cost_view(a, axes)
    titled(axes[0].figure)
    box = W.cost_explorer(runs, 0.5)
    box.children[0].value = 3.0
    slo = S.tpot_slo(llm, 32, factor=100.0)
    evals = S.evaluate_caps(runs, 1.0, slo)
    fig = W.plot_cost_at_slo(runs, evals, slo)
    titled(fig)
    assert [line.get_label() for line in fig.axes[0].get_lines() if line.get_label().startswith("SLO")] \
        == [f"SLO: each request's TPOT <= {1e3 * slo['tpot']:g} ms"]
    none = S.evaluate_caps(runs, 1.0, {"tpot": 1e-9})  # nobody within it: no cost per good request
    titled(W.plot_cost_at_slo(runs, none, {"tpot": 1e-9}))
    with pytest.raises(ValueError, match="don't match"):
        W.plot_cost_at_slo(runs, evals[:1], slo)


def test_disaggregation_view_and_explorer():
    study = S.datasheet_study("H100-SXM", "llama-3-8b", num_requests=8, num_rates=2, total=2)
    data = W.compute_disagg_view(study, 1, 50e9, 400, 25)
    assert data["rates"] == study.rates and len(data["layouts"]) == 2
    for d in data["layouts"].values():
        assert len(d["goodput"]) == 2 and all(g <= t + 1e-9 for g, t in zip(d["goodput"], d["throughput"]))
    strict = W.compute_disagg_view(study, 1, 50e9, 400, 1)
    assert all(g == 0 for d in strict["layouts"].values() for g in d["goodput"])  # 1 ms ITL: nobody
    # the ITL panel plots what the SLO limits: at an SLO equal to the plotted value, 90% meet it
    # (less one request: numpy interpolates between two requests' values)
    from nanoserve.measure.metrics import compute_metrics
    runs = {"colocated": study.colocated(), "disaggregated": study.disaggregated(1, 50e9)}
    for (name, d), results in zip(data["layouts"].items(), runs.values()):
        for value_ms, res in zip(d["request_itl_p99_p90"], results):
            m = compute_metrics(res.outputs, slo={"itl_p99": value_ms / 1e3})
            assert 0.9 - 1 / len(res.outputs) <= m.slo_attainment <= 1, (name, value_ms, m.slo_attainment)
    _, axes = plt.subplots(1, 3)
    W.plot_disagg_view(data, axes)
    titled(axes[0].figure)
    titled(W.plot_layout_itl({"colocated": study.colocated()[0],
                              "1P:1D": study.disaggregated(1, 50e9)[0]}, study.label))
    box = W.disagg_explorer(study, ttft_slo_ms=400, itl_slo_ms=25, link_bandwidth=50e9)
    (budget, _, link), (_, itl, status) = box.children[0].children, box.children[1].children
    itl.value = 200  # re-scores the cached runs
    link.value = 12.5e9  # simulates the new link once
    budget.value = 512  # simulates colocation at that token budget once
    assert ("colocated", 512) in study.cache
    assert status.value.startswith("modelled")
