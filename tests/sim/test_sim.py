"""sim: the real scheduler on a simulated clock, its cost model, calibration, disaggregation.

The validation test runs the real engine on this CPU in real time and checks that the
simulator, calibrated on that run's trace, reproduces its TTFT and ITL medians and p99.
"""

import json
import os
import random
import time
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from nanoserve import LLM, EngineConfig, ModelConfig
from nanoserve.engine.kv_cache import kv_bytes_per_token
from nanoserve.measure.bench import drive
from nanoserve.measure.bench import replay as bench_replay
from nanoserve.measure.metrics import compute_metrics, itls, ttft
from nanoserve.measure.roofline import DeviceCeilings, ceilings_cache_path, step_cost
from nanoserve.measure.workload import LogNormal, Uniform, Workload, shared_prefix, synthetic
from nanoserve.sim import CostModel, calibrate, sim_engine, simulate
from nanoserve.sim.devices import (
    DEVICES,
    LINKS,
    measured_profile,
    model_shape,
    num_kv_blocks,
)
from nanoserve.sim.disagg import goodput_sweep, simulate_colocated, simulate_disaggregated


def replay(engine, workload):
    """Real-time replay on a real engine (bench's harness) -> final outputs."""
    return bench_replay(engine, workload, progress=False, warmup=0).outputs

H100 = DEVICES["H100-SXM"]
LLAMA8B = model_shape("llama-3-8b")


def small_workload(n=24, rate=20.0, seed=0, vocab_size=32000):
    return synthetic(n, input_len=Uniform(16, 600), output_len=Uniform(2, 40), rate=rate,
                     seed=seed, vocab_size=vocab_size)


# --- the cost model -----------------------------------------------------------------------

def test_datasheet_decode_is_memory_bound_and_prefill_compute_bound():
    cm = CostModel.from_profile(H100)
    bw, peak = H100.bandwidth * H100.bandwidth_fraction, H100.peak_flops * H100.flops_fraction
    decode = step_cost(LLAMA8B, [(1, 512)], 2)
    t = cm.step_time(decode, 1) - cm.overhead - cm.per_seq
    assert t == pytest.approx(decode.total_bytes / bw)
    assert decode.bytes["linear"] > 0.9 * decode.total_bytes  # the weights dominate
    prefill = step_cost(LLAMA8B, [(4096, 4096)], 2)
    assert cm.step_time(prefill, 1) - cm.overhead - cm.per_seq == pytest.approx(
        prefill.total_flops / peak)


def test_kv_blocks_from_memory():
    cfg = model_shape("llama-3-70b")
    with pytest.raises(ValueError, match="scaled"):
        num_kv_blocks(H100, cfg)  # 141 GB of bf16 weights on one 80 GB device
    four = H100.scaled(4)
    per_block = 16 * kv_bytes_per_token(cfg, "bfloat16")
    assert kv_bytes_per_token(cfg, "bfloat16") == 2 * 80 * 8 * 128 * 2
    assert num_kv_blocks(four, cfg) == int((4 * 80e9 * 0.9 - cfg.num_params() * 2) // per_block)


def test_measured_profile_reads_the_cached_ceilings(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    fake = DeviceCeilings(device="cpu", device_name="Test CPU", num_threads=2, torch_version="x",
                          date="2026-01-01T00:00:00", quick=True, copy_bandwidth=30e9,
                          weight_read_bandwidth=20e9, peak_flops={"float32": 1e11})
    path = ceilings_cache_path("cpu")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(asdict(fake), f)
    p = measured_profile("cpu", "float32")
    assert (p.peak_flops, p.bandwidth) == (1e11, 20e9) and p.source.startswith("measured")
    assert all(d.source.startswith("datasheet") for d in DEVICES.values())


def test_cost_model_rejects_bad_values():
    with pytest.raises(ValueError, match="combine"):
        CostModel(0, 0, 0, 0, 0, combine="mean")
    with pytest.raises(ValueError, match="overhead"):
        CostModel(-1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        sim_engine(LLAMA8B, CostModel(0, 0, 1e-12, 1e-15, 1e-15))


# --- the simulator drives the real scheduler ---------------------------------------------

def test_simulate_produces_engine_outputs():
    w = small_workload()
    res = simulate(w, LLAMA8B, H100, EngineConfig(max_num_batched_tokens=256))
    assert [o.request_id for o in res.outputs] == [str(i) for i in range(len(w))]
    for o, r in zip(res.outputs, w.requests):
        assert o.finished and o.finish_reason == "length"
        assert len(o.token_ids) == r.params.max_tokens
        assert o.metrics.arrival_time == r.arrival_time
        assert ttft(o) > 0 and all(g > 0 for g in itls(o))
    m = res.metrics("ttft<=1s")
    assert m.completed == len(w) and m.goodput > 0
    steps = res.trace
    assert steps and all(s.end > s.start for s in steps)
    assert sum(s.num_prefill_tokens for s in steps) == sum(w.input_lens)  # no cache hits here
    again = simulate(w, LLAMA8B, H100, EngineConfig(max_num_batched_tokens=256))
    assert [o.metrics.token_times for o in again.outputs] == [o.metrics.token_times for o in res.outputs]


def test_sim_preempts_and_recovers_with_a_small_cache():
    w = synthetic(16, input_len=200, output_len=100, seed=1)
    engine = sim_engine(LLAMA8B, H100, EngineConfig(num_kv_blocks=40, max_num_batched_tokens=512))
    outs = drive(engine, w, engine.clock.advance_to)
    assert engine.stats.preemptions > 0
    assert all(len(o.token_ids) == 100 for o in outs)
    engine.kv_manager.check_invariants()
    assert engine.kv_manager.num_free_blocks == 40


def test_prefix_caching_shows_in_simulated_ttft():
    w = shared_prefix(2, 8, prefix_len=2048, suffix_len=32, output_len=8, rate=4.0)
    on = simulate(w, LLAMA8B, H100).metrics()
    off = simulate(w, LLAMA8B, H100, EngineConfig(enable_prefix_caching=False)).metrics()
    assert on.ttft.median < 0.5 * off.ttft.median


# --- calibration -------------------------------------------------------------------------

def test_calibrate_recovers_a_known_cost_model():
    truth = CostModel(3e-3, 200e-6, 1 / 20e9, 1 / 80e9, 1 / 10e9, combine="sum", dtype="float32")
    cfg = model_shape("tiny")
    w = small_workload(40, rate=30.0, vocab_size=cfg.vocab_size)
    cfg_e = EngineConfig(num_kv_blocks=2000, max_num_batched_tokens=128)
    res = simulate(w, cfg, truth, cfg_e, dtype="float32")
    cal = calibrate(res.trace, cfg, "float32")
    assert cal.median_abs_rel_error < 1e-6 and cal.mape < 1e-4
    for name in ("overhead", "per_seq", "s_byte", "s_flop", "s_attn"):
        assert getattr(cal.cost_model, name) == pytest.approx(getattr(truth, name), rel=1e-4)
    with pytest.raises(ValueError, match="at least 5 steps"):
        calibrate(res.trace[:3], cfg)



def test_a_step_draws_its_noise_from_measured_steps_of_its_size():
    small = [(1e-3 + i * 1e-6, 1e-4) for i in range(20)]  # 1 ms steps, slowed 0.1 ms
    large = [(10e-3 + i * 1e-6, 5e-3) for i in range(20)]  # 10 ms steps, slowed 5 ms
    cm = CostModel(0, 0, 0, 0, 0, combine="sum", residuals={"decode": tuple(small + large)},
                   min_ratio=0.5)
    rng = random.Random(0)
    assert {cm.noisy_step_time(1e-3, "decode", rng) for _ in range(200)} == {1.1e-3}
    assert {cm.noisy_step_time(20e-3, "decode", rng) for _ in range(200)} == {25e-3}
    few = replace(cm, residuals={"decode": ((1e-3, -9e-3), (2e-3, 1e-3))})  # fewer than NEIGHBOURS
    assert {few.noisy_step_time(4e-3, "decode", rng) for _ in range(200)} == {2e-3, 5e-3}


def test_steps_the_fit_cannot_tell_apart_share_their_noise():
    # A fit with bytes and attention free gives every batch-1 decode step one modelled time; the
    # simulator computes it in another order, a rounding away. Sorted by residual within the tie
    # (the worst order), a window at the tie's end drew only the slowest steps: a CI run's
    # simulated ITL came out 40% long.
    tied = tuple((1e-3, i * 1e-6) for i in range(200))  # residuals 0-199 us, mean 99.5
    cm = CostModel(0, 0, 0, 0, 0, combine="sum", residuals={"decode": tied})
    rng = random.Random(0)
    for t in (1e-3 * (1 - 1e-12), 1e-3, 1e-3 * (1 + 1e-12)):
        drawn = [cm.noisy_step_time(t, "decode", rng) - t for _ in range(2000)]
        assert float(np.mean(drawn)) == pytest.approx(99.5e-6, abs=8e-6), t
        assert min(drawn) < 10e-6 and max(drawn) > 190e-6  # the whole tie, not a few of it


# --- disaggregation ----------------------------------------------------------------------

def test_disaggregated_ttft_includes_the_kv_transfer():
    prompt = 3000
    w = synthetic(1, input_len=prompt, output_len=20)
    fast = simulate_disaggregated(w, LLAMA8B, H100, 1, 1, LINKS["nvlink"]).outputs[0]
    slow = simulate_disaggregated(w, LLAMA8B, H100, 1, 1, LINKS["eth100"]).outputs[0]
    per_token = kv_bytes_per_token(LLAMA8B, "bfloat16")
    extra = prompt * per_token * (1 / LINKS["eth100"].bandwidth - 1 / LINKS["nvlink"].bandwidth)
    assert ttft(slow) - ttft(fast) == pytest.approx(extra)
    assert len(slow.token_ids) == 20 and len(slow.metrics.token_times) == 20
    assert slow.prompt_token_ids == w.requests[0].prompt_token_ids
    # the decode instance admits the transferred prompt at the cost of one decode
    cm = CostModel.from_profile(H100)
    decode_step = cm.step_time(step_cost(LLAMA8B, [(1, prompt + 1)], 2), 1)
    assert itls(slow)[0] == pytest.approx(decode_step)
    colo = simulate_colocated(w, LLAMA8B, H100, 2).outputs[0]
    assert ttft(colo) < ttft(fast)  # alone, colocated pays no transfer


def test_disaggregation_removes_prefill_interference():
    w = synthetic(80, input_len=LogNormal(2048, 0.3, hi=6000), output_len=LogNormal(64, 0.3),
                  rate=8.0, seed=2)

    def at_rate(rate):  # the same requests, arrivals compressed or stretched
        return replace(w, requests=[replace(r, arrival_time=r.arrival_time * 8.0 / rate)
                                    for r in w.requests])

    points = goodput_sweep([2.0, 8.0], at_rate, LLAMA8B, H100, "ttft<=2s,itl_p99<=30ms", 1, 1,
                           LINKS["ib400"], EngineConfig(max_num_batched_tokens=2048))
    assert [(p.rate, p.layout) for p in points] == [
        (2.0, "colocated"), (2.0, "disaggregated"), (8.0, "colocated"), (8.0, "disaggregated")]
    assert all(p.metrics.completed == 80 and 0 <= p.slo_attainment <= 1 for p in points)
    colo, dis = points[2].metrics, points[3].metrics
    assert dis.itl.p99 < 0.5 * colo.itl.p99  # decode instances never run a prefill chunk
    assert dis.ttft.median > colo.ttft.median  # but every request pays the KV transfer


# --- scale -------------------------------------------------------------------------------

def test_simulates_2000_requests_of_a_70b_model(capsys):
    cfg = model_shape("llama-3-70b")
    w = synthetic(2000, input_len=LogNormal(512, 1.0, hi=4000), output_len=LogNormal(64, 0.5),
                  rate=20.0, seed=3, vocab_size=cfg.vocab_size)
    cpu = time.process_time()
    res = simulate(w, cfg, H100.scaled(4), EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048))
    cpu = time.process_time() - cpu
    assert res.metrics().completed == 2000
    with capsys.disabled():
        print(f"\nsim speed: {len(w)} requests of llama-3-70b on 4x H100: "
              f"{res.requests_per_second:.0f} simulated requests/s of wall time "
              f"({len(w) / cpu:.0f} per CPU second)")


# --- validation against the real engine --------------------------------------------------

SIM_TEST_SHAPE = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=768,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=2048)
TOLERANCE = 0.25
REPEATS = 3  # real runs per workload; each statistic's error is the median over them
ENGINE = dict(max_num_seqs=32, max_num_batched_tokens=128)


def validation_workloads() -> dict[str, Workload]:
    v = 4096
    decoders = synthetic(12, input_len=16, output_len=64, rate=10.0, seed=2, vocab_size=v).requests
    longs = synthetic(3, input_len=640, output_len=4, rate=3.0, seed=3, vocab_size=v).requests
    mixed = sorted(decoders + [replace(r, arrival_time=r.arrival_time + 0.3) for r in longs],
                   key=lambda r: r.arrival_time)
    return {
        "steady": synthetic(48, input_len=Uniform(16, 160), output_len=Uniform(8, 48), rate=12.0,
                            seed=1, vocab_size=v),
        "interference": Workload("interference", "12 decoders and 3 long prompts", mixed),
        "shared_prefix": shared_prefix(4, 8, prefix_len=192, suffix_len=16, output_len=16,
                                       rate=12.0, vocab_size=v),
    }


# What the simulator is for: typical and high-percentile latency. A p99 of a few hundred ITL
# samples is decided by a handful of steps that the machine's noise slowed, not by the model.
STATS = [(k, p) for k in ("ttft", "itl") for p in ("median", "p90")]


def stats(m) -> dict[str, float]:
    return {f"{k}.{p}": getattr(getattr(m, k), p) for k, p in STATS}


def errors(real: dict, sim: dict) -> dict[str, float]:
    """Relative error of the simulator per statistic: sim / real - 1."""
    return {k: sim[k] / real[k] - 1 for k in real}


def scaled(cm: CostModel, factor: float) -> CostModel:
    """A wrong cost model: every step `factor` times as long (the mutant the test must catch)."""
    return replace(cm, overhead=cm.overhead * factor, per_seq=cm.per_seq * factor,
                   s_byte=cm.s_byte * factor, s_flop=cm.s_flop * factor, s_attn=cm.s_attn * factor,
                   residuals={k: tuple((p * factor, r * factor) for p, r in v)
                              for k, v in cm.residuals.items()})


def simulated_stats(w, cost_model, config, seeds=10) -> dict[str, float]:
    """The calibrated model adds measured noise at random, so one simulated run is one draw:
    take each statistic's median over seeded runs of the same size as the real one."""
    runs = [stats(simulate(w, SIM_TEST_SHAPE, cost_model, config, "float32", seed=s).metrics())
            for s in range(seeds)]
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def median_errors(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared 2-core machine a second thread mostly waits for a core."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_ops")  # timed: the C++ ops are built before, not inside it
@pytest.mark.serial  # times the real engine: run alone, not beside another xdist worker
def test_sim_matches_real_engine_on_cpu(one_thread):
    def fresh_engine():  # fresh each run: a warm prefix cache would change the next run
        return LLM(SIM_TEST_SHAPE, device="cpu", dtype="float32", config=EngineConfig(**ENGINE)).engine

    replay(fresh_engine(), synthetic(8, 64, 8, vocab_size=4096, seed=9))  # warm up torch
    models = {"calibrated": 1.0, "2x slow (mutant)": 2.0, "2x fast (mutant)": 0.5}
    found = {name: {} for name in models}  # model -> workload -> median error per statistic
    lines = []
    for name, w in validation_workloads().items():
        per_model = {m: [] for m in models}
        for _ in range(REPEATS):  # each real run is calibrated on itself and simulated
            engine = fresh_engine()
            outs = replay(engine, w)
            real = stats(compute_metrics(outs))
            cal = calibrate(engine.trace, engine.model_config, "float32")
            sim_cfg = EngineConfig(**ENGINE, num_kv_blocks=engine.num_kv_blocks)
            for m, factor in models.items():
                per_model[m].append(errors(real, simulated_stats(w, scaled(cal.cost_model, factor),
                                                                 sim_cfg)))
        for m in models:
            found[m][name] = median_errors(per_model[m])
            lines.append(f"{name:<14}{m:<18}" + " ".join(
                f"{k} {100 * v:+.0f}%" for k, v in found[m][name].items()))
        lines.append(f"  last run {cal.describe()}")
        last = (w, real, cal, sim_cfg)
    summary = "\n".join(lines)
    print("\nsimulator vs real engine (sim / real - 1, median over "
          f"{REPEATS} calibrated runs):\n{summary}")
    off = {(name, k): round(v, 2) for name, err in found["calibrated"].items()
           for k, v in err.items() if abs(v) > TOLERANCE}
    assert not off, f"{sorted(off)} off\n{summary}"
    # The comparison has teeth: a cost model off by 2x either way misses every workload.
    for m in ("2x slow (mutant)", "2x fast (mutant)"):
        for name, err in found[m].items():
            assert max(map(abs, err.values())) > TOLERANCE, f"{m} passes {name}\n{summary}"
    # ... and so does the right cost model with the wrong scheduler: prefix caching off.
    w, real, cal, sim_cfg = last  # shared_prefix, the last workload
    wrong = simulated_stats(w, cal.cost_model, replace(sim_cfg, enable_prefix_caching=False))
    assert max(map(abs, errors(real, wrong).values())) > TOLERANCE
