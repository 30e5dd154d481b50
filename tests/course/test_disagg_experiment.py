"""Lesson 09's real experiment (course/scenarios/disagg_real.py): the summary rows read the right
requests and limits, the workload shift keeps lesson 05's shape, the transfer table reports the
deployment's own counters, and one end-to-end run on the tiny preset (colocated, then a
Deployment) completes every request, counts exactly one save and one load of each prompt's KV,
and leaves no segment behind."""

from __future__ import annotations

import math
import os

import pytest

from nanoserve import SamplingParams
from nanoserve.course.scenarios import disagg_real as real
from nanoserve.course.scenarios.interference import InterferenceSetup
from nanoserve.measure.http_result import HTTPOutput
from nanoserve.measure.kv_transfer import TransferFit, TransferPoint
from nanoserve.measure.workload import Workload, WorkloadRequest
from nanoserve.outputs import RequestMetrics


def _out(i: int, arrival: float, times: list[float]) -> HTTPOutput:
    m = RequestMetrics(arrival_time=arrival, first_token_time=times[0], token_times=times,
                       finished_time=times[-1])
    return HTTPOutput(f"r{i}", 16, m, len(times), True, "length")


def test_layout_row_splits_decoders_from_long_prompts_and_scores_the_slo():
    decoders = [_out(0, 0.0, [0.1, 0.11, 0.12, 0.52]),  # one 400 ms stall
                _out(1, 0.0, [0.1, 0.11, 0.12, 0.13])]
    longs = [_out(2, 1.0, [1.3, 1.31]), _out(3, 2.0, [2.5, 2.51])]
    row = real.layout_row("x", decoders + longs, 2, {"itl_p99": 0.05})
    assert row["decoder ITL max (ms)"] == pytest.approx(400)
    assert row["decoder ITL p50 (ms)"] == pytest.approx(10)
    assert row["decoder ITL p99 (ms)"] == pytest.approx(10 + 0.95 * 390)  # 6 gaps, numpy's linear p99
    assert row["long TTFT median (ms)"] == pytest.approx(400)  # 300 and 500 ms
    assert row["long TTFT p99 (ms)"] == pytest.approx(498)
    assert row["within SLO"] == "3/4"  # the stalled decoder misses 50 ms
    assert row["goodput (req/s)"] == pytest.approx(3 / 2.51)  # first arrival to last token


def _inter() -> InterferenceSetup:
    reqs = [WorkloadRequest([11] * 4, SamplingParams(max_tokens=10), 0.0) for _ in range(2)]
    reqs += [WorkloadRequest([12] * 64, SamplingParams(max_tokens=4), t) for t in (0.1, 0.3)]
    return InterferenceSetup(Workload("interference", "d", reqs), 2, 64, 0.01, 0.05, 0.2, ["2", "3"])


def test_settled_moves_long_prompts_later_and_lengthens_decoders_to_match():
    inter = _inter()
    out = real._settled(inter).workload.requests
    assert [r.arrival_time for r in out] == pytest.approx([0.0, 0.0, 0.15, 0.35])
    assert [r.params.max_tokens for r in out] == [15, 15, 4, 4]  # +ceil(0.05 / 0.01)
    assert [r.prompt_token_ids for r in out] == [r.prompt_token_ids for r in inter.workload]
    assert [r.params.max_tokens for r in inter.workload] == [10, 10, 4, 4]  # the original is kept


def test_transfer_lengths_span_one_block_to_the_long_prompt():
    assert real.transfer_lengths(1024, 16) == (16, 64, 256, 1024)
    assert real.transfer_lengths(100, 16) == (16, 64, 100)


def test_transfer_table_rows_and_the_deployments_counters():
    points = [TransferPoint(16, 1, 1000, 0.001, 0.001), TransferPoint(1024, 64, 64000, 0.004, 0.004)]
    fit = TransferFit(latency=0.002, bandwidth=1e7)
    run = real.LayoutRun("d", None, 0, {("count", "save"): 2.0, ("count", "load"): 2.0,
                                        ("bytes", "save"): 2e6, ("bytes", "load"): 2e6,
                                        ("seconds", "save"): 0.004, ("seconds", "load"): 0.006})
    rows = real.transfer_table(points, fit, run).rows
    assert rows[1]["GB/s"] == pytest.approx(64000 / 0.008 / 1e9)
    assert rows[1]["per block (ms)"] == pytest.approx(8 / 64)
    assert rows[0]["link model (ms)"] == pytest.approx(0.1)  # 1000 B / 10 MB/s, no latency
    assert rows[0]["link model error (%)"] == pytest.approx(-95)
    assert rows[2]["KV (KB)"] == pytest.approx(1000) and rows[2]["total (ms)"] == pytest.approx(5)
    assert rows[2]["GB/s"] == pytest.approx(2e6 / 0.01 / 1e9)


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("nskv")} if os.path.isdir("/dev/shm") else set()


@pytest.mark.usefixtures("cpu_ops")  # timed: the C++ ops are built before, not inside it
@pytest.mark.serial
def test_real_layouts_end_to_end_on_the_tiny_preset():
    from nanoserve.course import setup
    llm = setup.load_llm("preset:tiny", device="cpu", dtype="float32")
    exp = real.real_setup(llm, "preset:tiny", num_decoders=2, long_prompt_len=128, num_long=2)
    before = _segments()
    runs = real.run_layouts(exp)
    assert _segments() <= before, "KV segments left behind"
    prompts = [r.prompt_len for r in exp.requests]
    for run in runs.values():
        assert [o.error for o in run.outputs] == [""] * len(prompts)
        assert [o.output_len for o in run.outputs] == [r.max_tokens for r in exp.requests]
    t = runs["disaggregated"].transfers
    per_token = 2 * 4 * 2 * 32 * 4  # K and V x layers x KV heads x head_dim x fp32 bytes (tiny)
    assert t[("count", "save")] == t[("count", "load")] == len(prompts)
    assert t[("bytes", "save")] == t[("bytes", "load")] == per_token * sum(prompts)
    assert t[("failures", "save")] == t[("failures", "load")] == 0
    assert runs["colocated"].transfers is None
    threads = exp.threads()  # the legend's labels name each layout's thread count
    assert runs["colocated"].layout == f"colocated, {threads[0]} thread{'s' * (threads[0] != 1)}"
    assert runs["disaggregated"].layout.startswith("disaggregated 1P:1D, ")
    assert runs["disaggregated"].layout.endswith((" thread each", " threads each"))
    row = real.layout_row("d", runs["disaggregated"].outputs, 2, exp.slo)
    assert not math.isnan(row["long TTFT median (ms)"]) and row["decoder ITL max (ms)"] > 0
    fit = TransferFit(0.001, 1e9)
    predicted = real.predict_layouts(llm, exp, fit, num_requests=6, input_median=64, output_median=8)
    for name, res in predicted.items():
        assert len(res.outputs) == len(prompts), name
        assert all(o.finished for o in res.outputs)
