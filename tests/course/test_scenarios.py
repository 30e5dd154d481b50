"""The measurements behind lessons 05-09 (nanoserve.course.scenarios), at tiny sizes.

Every function a lesson calls runs here once on preset:tiny. Assertions are about structure
(what ran in which step, what came from the cache), which holds on any machine, not about
timings, which a busy CI machine can't promise.
"""

import math

import pytest

from nanoserve.course import scenarios as S
from nanoserve.course import setup
from nanoserve.course.scenarios.common import round_up
from nanoserve.measure.metrics import completed


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny", device="cpu", dtype="float32")


def test_probes(llm):
    assert 0 < S.measure_decode_step(llm, 2, steps=3) < 5
    assert 0 < S.measure_prefill(llm, 64, repeats=1) < 5


def test_the_chunked_path_is_warmed_before_any_timed_run(llm):
    """A step mixing decode with a chunk of a prompt that already has cached context: the kernels
    the first timed chunked run needs (compiled on first use on a GPU) have run once."""
    from nanoserve.course.scenarios.interference import warm_chunked_prefill
    trace = warm_chunked_prefill(llm, 32).trace
    mixed = [r for r in trace if r.num_prefill_tokens and r.num_decode_tokens]
    assert mixed and max(r.num_tokens for r in trace) <= 32
    assert sum(r.num_prefill_tokens > 0 for r in trace) >= 3  # 65 prompt tokens in chunks


def test_interference_setup_warms_at_the_smallest_budget(llm, monkeypatch):
    from nanoserve.course.scenarios import interference
    calls = []
    monkeypatch.setattr(interference, "warm_chunked_prefill", lambda *a, **kw: calls.append(a))
    S.interference_setup(llm, num_decoders=2, long_prompt_len=64, num_long=1, min_budget=48)
    assert [a[1] for a in calls] == [48]


def test_interference_grid_chunks_only_when_asked(llm):
    setup = S.interference_setup(llm, num_decoders=2, long_prompt_len=256, num_long=1)
    assert setup.long_ids == ["2"] and "decoders" in setup.describe()
    runs = S.interference_grid(llm, setup, [32], progress=False)
    whole, chunked = runs
    assert whole.budget is None and chunked.budget == 32
    # without chunking the long prompt is prefilled in one step; with it no step passes the budget
    assert max(r.num_prefill_tokens for r in whole.result.trace) == 256
    assert max(r.num_tokens for r in chunked.result.trace) <= 32
    for run in runs:
        assert all(completed(o) for o in run.result.outputs)
        assert len(run.decoder_itls()) > 0 and len(run.long_ttfts()) == 1
        assert run.summary()["run"] == run.label
    assert len(S.interference_table(runs).rows) == 2


def test_prefix_caching_compare_and_demo(llm):
    wl, rate = S.shared_prefix_workload(llm, num_requests=4, prefix_len=64, suffix_len=8, output_len=2)
    assert rate > 0 and len(wl) == 4
    assert len({tuple(r.prompt_token_ids[:64]) for r in wl}) == 1  # one shared prefix
    res = S.prefix_cache_compare(llm, wl, progress=False)
    off, on = S.prefix_summary(res["off"]), S.prefix_summary(res["on"])
    assert off["hit rate (%)"] == 0 and off["prefill tokens computed"] == off["prompt tokens"]
    assert on["hit rate (%)"] > 50 and on["prefill tokens computed"] < off["prefill tokens computed"]
    assert len(S.prefix_table(res).rows) == 2
    demo = S.shared_prompt_demo(llm, "system prompt " * 4, ["first?", "second?"], max_tokens=2)
    rows = demo.rows
    assert rows[0]["from cache"] == 0 and rows[1]["from cache"] > 0
    assert [r["same tokens, cache off"] for r in rows] == ["yes", "yes"]  # run both ways, compared


def test_eviction_sweep_eats_the_prefix_only_past_the_free_room(llm):
    points = S.eviction_sweep(llm, num_kv_blocks=16, prefix_len=64, unrelated_len=48,
                              counts=[0, 1, 6], progress=False)
    assert [p.unrelated_requests for p in points] == [0, 1, 6]
    assert points[0].cached_tokens == 64 and points[1].cached_tokens == 64
    assert points[2].cached_tokens < 64


@pytest.fixture(scope="module")
def device_model(llm):
    return S.calibrate_device(llm, num_requests=6, input_median=32, output_median=6, progress=False)


def test_calibration_slo_and_capacity(llm, device_model):
    assert device_model.label.startswith("modelled: calibrated on")
    assert S.measured_capacity(device_model.result) > 0
    assert device_model.calibration.mape >= 0
    slo = S.unloaded_slo(llm, 32)
    assert set(slo) == {"ttft", "tpot"} and all(v > 0 for v in slo.values())
    assert setup.slo_text({"ttft": 0.12, "tpot": 0.026}) == "ttft<=120ms,tpot<=26ms"
    assert round_up(0.1234) == pytest.approx(0.13) and round_up(25) == 25


def test_workload_shift_and_stratification(llm):
    weeks = S.workload_shift(llm, num_requests=6, input_median=24, output_median=4,
                             longer_output_median=16, progress=False)
    assert list(weeks) == ["before", "after"]
    before, after = (sum(len(o.token_ids) for o in weeks[k].outputs) for k in weeks)
    assert after > before
    table = S.metrics_table(weeks, {"ttft": 1.0, "tpot": 1.0})
    assert [r["run"] for r in table.rows] == ["before", "after"]
    strat = S.stratified_table(weeks, "e2e", buckets=(1, 8, 32))
    assert sum(r["before: n"] for r in strat.rows) == 6 and sum(r["after: n"] for r in strat.rows) == 6
    assert S.length_buckets(24) == (1, 12, 24, 48)
    by_input = S.stratified_table(weeks, "ttft", buckets=S.length_buckets(24), by="input")
    assert list(by_input.rows[0])[0] == "input tokens" and by_input.title.endswith("by input length")
    for name, r in weeks.items():  # each request lands in the bucket of its prompt's length
        counts = [row[f"{name}: n"] for row in by_input.rows]
        lens = [len(o.prompt_token_ids) for o in r.outputs]
        edges = [1, 12, 24, 48, 10**9]
        assert counts == [sum(lo <= n < hi for n in lens) for lo, hi in zip(edges, edges[1:])]


def test_rate_sweeps_measured_and_modelled(llm, device_model):
    make = S.chat_maker(llm, 4, 24, 4)
    assert len(make(10.0)) == 4
    assert make(10.0).requests[0].prompt_token_ids == make(5.0).requests[0].prompt_token_ids
    slo = {"ttft": 1.0, "tpot": 1.0}
    measured = S.rate_sweep(llm, [20.0], make, slo, progress=False)
    modelled = S.simulated_rate_sweep(device_model, [20.0, 40.0], make, slo)
    assert len(measured) == 1 and len(modelled) == 2
    for p in measured + modelled:
        assert p.throughput > 0 and 0 <= p.attainment <= 1 and p.goodput <= p.throughput + 1e-9


def test_cost_runs_and_tables(llm):
    price, note = S.default_price_per_hour("cpu")
    assert price > 0 and "set your own" in note
    assert S.default_price_per_hour("cuda")[0] > price
    runs = S.batch_cap_runs(llm, [1, 4], num_requests=4, input_len=32, output_len=4, progress=False)
    assert list(runs) == [1, 4]
    assert max(r.num_running for r in runs[1].trace) == 1
    report = S.run_cost(runs[4], price)
    assert report.input_tokens == 4 * 32 and report.output_tokens == 4 * 4
    assert report.usd_per_1m_input > 0 and report.usd_per_1m_output > 0
    slo = S.tpot_slo(llm, 32)
    evals = S.evaluate_caps(runs, price, slo)
    assert [e.label for e in evals] == ["1", "4"]
    for e in evals:  # vLLM's request goodput, and the device's price per request within the SLO
        assert e.metrics.goodput == pytest.approx(e.metrics.good_requests / e.metrics.duration)
        assert e.usd_per_1k_requests == pytest.approx(1e3 * price / 3600 / e.metrics.request_throughput)
        assert e.usd_per_1k_good == (pytest.approx(1e3 * price / 3600 / e.metrics.goodput)
                                     if e.metrics.good_requests else math.inf)
        assert e.usd_per_1k_good >= e.usd_per_1k_requests
    none = S.evaluate_caps(runs, price, {"tpot": 1e-9})
    assert all(e.metrics.goodput == 0 and e.usd_per_1k_good == math.inf for e in none)
    rows = S.cost_rows(runs, price, slo).rows
    assert len(rows) == 2 and [r["$/1k within SLO"] for r in rows] == [e.usd_per_1k_good for e in evals]
    providers = S.provider_table(report.output_input_ratio)
    assert providers.rows[-1]["who"] == "this device (measured)"
    assert all("list price" in r["source"] for r in providers.rows[:-1])


def test_validation_and_kv_transfer(llm, device_model):
    make = S.chat_maker(llm, 4, 24, 4, seed=9)
    wl = make(20.0)
    measured = S.measure_workload(llm, wl, progress=False)
    table = S.validation_table(device_model, wl, measured)
    assert [r["metric"] for r in table.rows][:2] == ["TTFT median", "TTFT p99"]
    kv = S.kv_transfer_table("llama-3-8b", "H100-SXM", prompt_lens=(512,))
    row = kv.rows[0]
    # Llama-3-8B bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 131072 B per token
    assert row["KV (MB)"] == pytest.approx(512 * 131072 / 1e6)
    assert row["NVLink 4 (ms)"] == pytest.approx(512 * 131072 / 450e9 * 1e3)


def test_disaggregation_studies(device_model, llm):
    study = S.datasheet_study("H100-SXM", "llama-3-8b", num_requests=8, num_rates=2, total=2)
    assert len(study.rates) == 2 and study.label.startswith("modelled:")
    col = study.colocated()
    assert study.colocated() is col is study.colocated(study.config.max_num_batched_tokens)  # cached
    small = study.colocated(256)  # the colocated token budget: prefill in chunks of at most 256
    assert small is not col and all(completed(o) for r in small for o in r.outputs)
    assert max(s.num_prefill_tokens for s in small[0].trace) <= 256 < max(
        s.num_prefill_tokens for s in col[0].trace)
    with pytest.raises(ValueError, match="max_num_batched_tokens=0"):
        study.colocated(0)
    dis = study.disaggregated(1, 50e9)
    assert len(dis) == 2 and all(completed(o) for r in dis for o in r.outputs)
    with pytest.raises(ValueError, match="num_prefill"):
        study.disaggregated(2, 50e9)
    here = S.calibrated_study(device_model, S.chat_maker(llm, 4, 24, 4), [10.0], total=2)
    assert here.label == device_model.label
    assert all(completed(o) for o in here.disaggregated(1, 12.5e9)[0].outputs)
    rows = S.layout_table(here, 1, 12.5e9).rows
    assert [r["layout"] for r in rows] == ["colocated x2", "1P:1D over 12.5 GB/s"]
    wl = S.disagg_workload(5.0, 10, 32000)
    assert len(wl) == 10 and wl.name == "long-prompt chat"


def test_the_weeks_under_load_arrive_at_the_rate_asked_and_run_more_at_once(llm):
    """Lesson 07's loaded weeks: the same two workloads at a given rate; the table reads how many
    requests ran per step from the engine's trace."""
    idle = S.workload_shift(llm, num_requests=6, input_median=24, output_median=4,
                            longer_output_median=16, progress=False)
    idle_rate = S.load_table({"idle": idle}).rows[0]["rate (req/s)"]  # set from this machine's speed
    loaded = S.workload_shift(llm, num_requests=6, input_median=24, output_median=4,
                              longer_output_median=16, progress=False, rate=4 * idle_rate)
    for week in ("before", "after"):  # the same requests, idle and under load
        prompts = [[list(o.prompt_token_ids) for o in w[week].outputs] for w in (idle, loaded)]
        assert prompts[0] == prompts[1]
    arrivals = sorted(o.metrics.arrival_time for o in loaded["before"].outputs)
    assert 5 / (arrivals[-1] - arrivals[0]) == pytest.approx(4 * idle_rate, rel=0.5)  # nearly regular
    rows = S.load_table({"idle": idle, "under load": loaded}).rows
    assert [(r["condition"], r["week"]) for r in rows] == [
        ("idle", "before"), ("idle", "after"), ("under load", "before"), ("under load", "after")]
    assert rows[2]["rate (req/s)"] > 2 * rows[0]["rate (req/s)"]
    assert all(r["running per step (mean)"] > 0 for r in rows)
    e2e = [S.metrics_table(w).rows for w in (idle, loaded)]
    assert S.p50_ratio(idle, "e2e") == pytest.approx(e2e[0][1]["E2E p50"] / e2e[0][0]["E2E p50"], rel=1e-6)


def test_ttft_by_input_sends_each_length_alone_shortest_first(llm):
    sweep = S.ttft_by_input(llm, 8, 256, 4, repeats=1)
    assert sweep.input_lens == [8, 25, 81, 256]
    assert len(sweep.ttfts) == 4 and all(t > 0 for t in sweep.ttfts)
    assert sweep.growth == pytest.approx(sweep.ttfts[-1] / sweep.ttfts[0])
    with pytest.raises(ValueError, match="shortest=64, longest=32"):
        S.ttft_by_input(llm, 64, 32, 4)


def test_the_answers_to_the_lessons_predictions():
    from types import SimpleNamespace

    from nanoserve.course.scenarios.prefix import EvictionPoint
    runs = [SimpleNamespace(summary=lambda: {"decoder ITL max (ms)": 100.0, "long TTFT median (ms)": 50.0}),
            SimpleNamespace(summary=lambda: {"decoder ITL max (ms)": 10.0, "long TTFT median (ms)": 150.0})]
    assert S.interference_answers(runs) == {"worst gap, no chunking (ms)": 100.0,
                                            "worst gap, smallest budget (ms)": 10.0,
                                            "long TTFT, smallest budget / no chunking": 3.0}
    points = [EvictionPoint(n, 0, c, 0.1) for n, c in ((0, 64), (2, 64), (4, 48), (6, 0))]
    assert S.first_eviction(points) == 4
    assert S.first_eviction(points[:2]) == math.inf

    def at(rate, goodput):
        outs = [SimpleNamespace(metrics=SimpleNamespace(arrival_time=t / rate)) for t in range(5)]
        return S.RatePoint(rate, SimpleNamespace(outputs=outs), goodput, goodput, 1.0)
    assert S.peak_goodput_fraction([at(2.0, 1.9), at(4.0, 3.0), at(6.0, 2.0)], 8.0) == pytest.approx(0.5)
