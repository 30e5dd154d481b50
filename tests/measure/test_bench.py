"""The benchmark harness: real-time replay, its result and figures, the CLI, the peers script."""

import importlib.util
import json
import math
import os

import matplotlib
import pytest

matplotlib.use("Agg")

from nanoserve import LLM, EngineConfig, SamplingParams  # noqa: E402
from nanoserve.measure.bench import main, make_workload, replay, scheduler_overhead  # noqa: E402
from nanoserve.measure.roofline import DeviceCeilings  # noqa: E402
from nanoserve.measure.workload import Workload, WorkloadRequest, greedy_params, synthetic  # noqa: E402

LATE = 0.3  # seconds after t0 that the last request arrives
FAKE_CEILINGS = DeviceCeilings("cpu", "test cpu", 2, "0", "2026-01-01", False, 30e9, 25e9,
                               {"float32": 2e11, "bfloat16": 4e11})


@pytest.fixture(scope="module")
def llm():
    return LLM("preset:tiny", config=EngineConfig(max_num_seqs=8, max_num_batched_tokens=64))


def tiny_workload(vocab=4096) -> Workload:
    base = synthetic(4, 12, 4, seed=1, vocab_size=vocab)
    late = WorkloadRequest(list(range(20, 120)), greedy_params(3), LATE)  # 2 chunks of <= 64
    return Workload("tiny", "4 at t=0 and one at 0.3 s", [*base.requests, late])


@pytest.fixture(scope="module")
def result(llm):
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))  # an earlier run the trace must exclude
    return replay(llm, tiny_workload(), progress=False)


def test_replay_finishes_everything_in_workload_order(result):
    wl = result.workload
    assert len(result.outputs) == len(wl)
    for o, r in zip(result.outputs, wl):
        assert o.finished and o.finish_reason == "length"
        assert o.prompt_token_ids == r.prompt_token_ids
        assert len(o.token_ids) == r.params.max_tokens


def test_replay_respects_arrival_times(result):
    for o, r in zip(result.outputs, result.workload):
        assert o.metrics.arrival_time == pytest.approx(result.start + r.arrival_time)
        assert o.metrics.first_scheduled_time >= o.metrics.arrival_time
    late = result.outputs[-1]
    assert late.metrics.first_scheduled_time - result.start >= LATE
    assert result.duration >= LATE


def test_trace_covers_this_run_only(result):
    ids = {o.request_id for o in result.outputs}
    seen = {e.request_id for rec in result.trace for e in rec.entries}
    assert seen == ids  # warm-up and the earlier generate are not in it
    assert all(rec.start >= result.start for rec in result.trace)
    steps = [rec.step for rec in result.trace]
    assert steps == list(range(steps[0], steps[0] + len(steps)))


def test_metrics_and_table(result):
    m = result.metrics(slo="ttft<=10s")
    assert m.completed == m.num_requests == 5
    assert m.total_output_tokens == 4 * 4 + 3
    assert m.ttft.count == 5 and m.ttft.min > 0
    text = result.table("ttft<=10s", FAKE_CEILINGS)
    for word in ("TTFT", "Goodput", "Decode MBU", result.device_label):
        assert word in text


def test_efficiency_is_a_fraction_of_the_ceilings(result):
    e = result.efficiency(FAKE_CEILINGS)
    assert e.decode_steps + e.prefill_steps == len(result.trace)
    assert e.decode_steps > 0 and e.prefill_steps > 0
    assert 0 < e.decode_mbu < 1 and 0 < e.prefill_mfu < 1
    assert 0 < e.decode_floor < e.decode_step_time


@pytest.mark.parametrize("plot", ["plot_timeline", "plot_latency", "plot_step_times"])
def test_plots_have_titles_units_and_device(result, plot):
    import matplotlib.pyplot as plt
    fig = getattr(result, plot)()
    ax = fig.axes[0]
    assert result.device_label in ax.get_title()
    assert "(" in ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_offline_replay_sends_everything_at_t0(llm):
    wl = make_workload("synthetic", 3, 8, 2, rate=5.0, vocab_size=4096)
    r = replay(llm, wl, realtime=False, progress=False, warmup=0)
    assert all(o.metrics.arrival_time == r.start for o in r.outputs)


def test_replay_needs_an_idle_engine(llm):
    rid = llm.engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    try:
        with pytest.raises(ValueError, match="idle"):
            replay(llm, tiny_workload(), progress=False)
    finally:
        llm.engine.abort(rid)


def test_make_workload_rejects_unknown_kind():
    with pytest.raises(ValueError, match="sharegpt"):
        make_workload("sharegpt", 4, 8, 8)


def test_scheduler_overhead_reports_and_restores(llm):
    rep = scheduler_overhead(llm, batch_size=4, input_len=8, output_len=6)
    assert rep.num_steps >= 1 and 0 < rep.fraction < 1
    assert 0 < rep.schedule < rep.step_time and 0 < rep.prepare < rep.step_time
    engine = llm.engine
    assert "schedule" not in vars(engine.scheduler) and "prepare" not in vars(engine.executor)
    assert not engine.has_unfinished()
    with pytest.raises(ValueError, match="max_num_seqs"):
        scheduler_overhead(llm, batch_size=9)


def test_cli_prints_metrics_and_saves_figure(capsys, tmp_path):
    png = tmp_path / "bench.png"
    assert main(["--model", "preset:tiny", "--num-requests", "4", "--input-len", "16",
                 "--output-len", "4", "--max-num-seqs", "4", "--no-prefix-caching", "--quiet",
                 "--no-roofline", "--slo", "ttft<=500ms,itl_p99<=100ms", "--overhead", "4",
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    for word in ("TTFT", "ITL", "SLO attainment", "prefix_caching=False", "overhead"):
        assert word in out
    assert png.stat().st_size > 0


def test_cli_prints_mbu_from_cached_ceilings(capsys, tmp_path, monkeypatch):
    from dataclasses import asdict

    from nanoserve.measure.roofline import ceilings_cache_path
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    with open(ceilings_cache_path("cpu"), "w") as f:
        json.dump(asdict(FAKE_CEILINGS), f)
    main(["--model", "preset:tiny", "--num-requests", "2", "--input-len", "8", "--output-len", "3",
          "--quiet"])
    assert "Decode MBU" in capsys.readouterr().out


# --- benchmarks/peers.py ---

def load_peers():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "peers.py")
    spec = importlib.util.spec_from_file_location("peers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_peers_quick_smoke(tmp_path, monkeypatch):
    """nanoserve alone, fp32, quick sizes: every figure and the report files (timings not judged)."""
    from dataclasses import asdict

    from nanoserve.measure.roofline import ceilings_cache_path
    peers = load_peers()
    monkeypatch.setattr(peers, "other_cpu_load", lambda interval=1.0: 0.0)
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    with open(ceilings_cache_path("cpu"), "w") as f:
        json.dump(asdict(FAKE_CEILINGS), f)
    assert peers.main(["--quick", "--only", "nanoserve", "--dtypes", "float32",
                       "--out-dir", str(tmp_path)]) == 0
    [path] = tmp_path.glob("peers-*.json")
    report = json.loads(path.read_text())
    figs = report["figures"]["float32"]["nanoserve"]
    assert {k for k, *_ in report["figure_specs"]} == set(figs)
    assert all(math.isfinite(v) and v > 0 for v in figs.values())
    assert all(c["idle"] for c in report["idle"])
    assert {t["status"] for t in report["targets"]} <= {"PASS", "MISS", "n/a"}
    md = path.with_suffix(".md").read_text()
    assert "| batch-1 decode" in md and "## Targets" in md
    [profiles] = report["raw"]["float32"]["nanoserve"]["profile"]
    assert [p["label"].split(" x ")[0] for p in profiles] == [
        "decode batch 1", "decode batch 8", "prefill batch 4", "prefill batch 1"]
    assert "Where nanoserve's time goes" in md and "| prefill batch 1 x 128 tokens |" in md


def test_peers_batch_1_jobs_time_two_prompts_of_one_length():
    """t_N and t_1 from different prompts: the same one twice would hit a prefix cache."""
    jobs = load_peers().plan(load_peers().SIZES["quick"], vocab=1000)
    n = [j["prompts"][0] for j in jobs if j["tag"] == "b1_n"]
    one = [j["prompts"][0] for j in jobs if j["tag"] == "b1_1"]
    assert len(n) == len(one) >= 1
    assert all(len(a) == len(b) and a != b for a, b in zip(n, one))


def test_batch1_host_work_splits_a_step_into_ops_and_host_work(capsys):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "batch1_host_work.py")
    spec = importlib.util.spec_from_file_location("batch1_host_work", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--model", "preset:tiny", "--steps", "4", "--rounds", "1"])
    rows = [ln.split("|")[1:-1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")]
    assert [r[0].strip() for r in rows[1:]] == ["bf16", "bf16, eager", "int8, lm_head int8",
                                                "int8, lm_head int8, eager"]
    for r in rows[1:]:
        step, ops = float(r[1]), float(r[2])
        assert 0 < ops and step > 0  # the Python between ops = forward - ops, whatever its sign when busy
        host, phases = float(r[4]), [float(x) for x in r[5:]]
        assert len(phases) == 4 and all(p > 0 for p in phases)  # scheduling, input prep, sampling, outputs
        assert abs(sum(phases) - host) <= 0.01, "the host phases add up to their sum (one round: no medians)"
    module.main(["--model", "preset:tiny", "--steps", "4", "--rounds", "1", "--no-eager"])
    rows = [ln.split("|")[1:-1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")]
    assert [r[0].strip() for r in rows[1:]] == ["bf16", "int8, lm_head int8"]


def test_input_prepare_times_each_step_hot_and_cold(capsys):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "input_prepare.py")
    spec = importlib.util.spec_from_file_location("input_prepare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--rounds", "1", "--sweep-mb", "1"])
    rows = [ln.split("|")[1:-1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")]
    assert [r[0].strip() for r in rows[1:]] == list(module.STEPS)
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows[1:])


def test_peers_require_idle_aborts_on_a_busy_machine(tmp_path, monkeypatch):
    peers = load_peers()
    monkeypatch.setattr(peers, "other_cpu_load", lambda interval=1.0: 1.5)
    with pytest.raises(SystemExit, match="NOT idle"):
        peers.main(["--quick", "--only", "nanoserve", "--require-idle", "--out-dir", str(tmp_path)])
