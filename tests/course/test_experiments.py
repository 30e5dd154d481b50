"""nanoserve.course.experiments: every function lessons 00-04 call, in quick mode on the tiny preset,
checked for what the lessons say about their results (not for timings, which are noise here)."""

import math
from types import SimpleNamespace

import pytest
import torch

from nanoserve.course import experiments as ex
from nanoserve.course import setup
from nanoserve.engine.kv_cache import kv_bytes_per_token
from nanoserve.measure import roofline
from nanoserve.presets import preset_config


def fake_ceilings(bw=25e9, fp32=200e9, bf16=400e9):
    return roofline.DeviceCeilings(device="cpu", device_name="Test CPU", num_threads=2,
                                   torch_version=torch.__version__, date="2026-11-29T00:00:00",
                                   quick=True, copy_bandwidth=30e9, weight_read_bandwidth=bw,
                                   peak_flops={"float32": fp32, "bfloat16": bf16})


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny", num_kv_blocks=2048, max_num_seqs=16)


# --- 00 ---------------------------------------------------------------------------------------

def test_device_ceilings_are_measured_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    c = ex.device_ceilings("cpu")
    assert c.quick and c.weight_read_bandwidth > 0 and c.peak("float32") > 0
    assert list(tmp_path.glob("ceilings-*.json"))


def test_linear_point_counts_by_hand():
    p = ex.LinearPoint(batch=16, k=4096, dtype="float32", seconds=0.5)
    assert p.flops == 2 * 16 * 4096 * 4096
    assert p.bytes == (4096 * 4096 + 2 * 16 * 4096) * 4
    assert p.intensity == pytest.approx(p.flops / p.bytes)
    assert p.achieved == pytest.approx(p.flops / 0.5)


def test_linear_sweep_moves_right_with_the_batch():
    c = fake_ceilings()
    points = ex.linear_sweep(c, (1, 8, 64), 256, reps=2)
    assert [p.batch for p in points] == [1, 8, 64]
    assert all(p.seconds > 0 for p in points)
    assert points[0].intensity < points[1].intensity < points[2].intensity
    table = ex.linear_table(points, c)
    assert [r["batch"] for r in table.rows] == [1, 8, 64]
    assert table.rows[0]["roofline GFLOP/s"] == pytest.approx(25 * points[0].intensity, rel=0.01)


def test_weight_read_table_times_each_dtype_at_batch_one():
    rows = ex.weight_read_table(fake_ceilings(bw=20e9), 256).rows
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    for r in rows:  # bytes of the batch-1 product over its time, and that over the fp32 slope
        assert r["weight-read GB/s"] > 0
        assert float(r["vs the roofline's slope"].rstrip("%")) == pytest.approx(
            100 * r["weight-read GB/s"] / 20, abs=0.5)
        assert r["weight-read GB/s"] == pytest.approx((256 * 256 + 2 * 256) * {"float32": 4, "bfloat16": 2}[
            r["dtype"]] / (r["ms"] / 1e3) / 1e9)


# --- 01 ---------------------------------------------------------------------------------------

def test_two_phases_is_one_prefill_then_decodes(llm):
    run = ex.two_phases(llm, 48, 6)
    assert run.kinds == ["prefill"] + ["decode"] * 5
    assert run.contexts == [48, 49, 50, 51, 52, 53] and run.decode_contexts == run.contexts[1:]
    assert run.prefill_seconds > 0 and len(run.decode_seconds) == 5
    assert [r["phase"] for r in run.table().rows] == ["prefill", "decode (median)"]


def test_prefill_sweep_times_each_length(llm):
    points = ex.prefill_sweep(llm, (64, 16, 32, 16), reps=2, progress=False)
    assert [p.length for p in points] == [16, 32, 64]
    assert all(len(p.times) == 2 and p.seconds > 0 for p in points)
    with pytest.raises(ValueError, match="max_model_len"):
        ex.prefill_sweep(llm, (5000,), reps=1, progress=False)


def test_fit_prefill_recovers_known_coefficients():
    lengths = [32, 64, 128, 256, 512, 1024]
    fit = ex.fit_prefill(lengths, [0.01 + 2e-5 * n + 3e-8 * n * n for n in lengths])
    assert (fit.fixed, fit.per_token, fit.per_token2) == pytest.approx((0.01, 2e-5, 3e-8), rel=1e-6)
    assert fit.predict(300) == pytest.approx(0.01 + 2e-5 * 300 + 3e-8 * 300**2)
    assert fit.quadratic_share(30000) > fit.quadratic_share(300)


def test_fit_prefill_keeps_coefficients_non_negative():
    lengths = [32, 64, 128, 256]  # linear data with noise: an unconstrained fit goes negative
    fit = ex.fit_prefill(lengths, [0.0101, 0.0198, 0.0403, 0.0799])
    assert min(fit.fixed, fit.per_token, fit.per_token2) >= 0
    with pytest.raises(ValueError, match="at least 3"):
        ex.fit_prefill([1, 2], [1.0, 2.0])


def test_fit_table_says_what_was_measured():
    fit = ex.fit_prefill([100, 200, 400], [0.1, 0.2, 0.4])
    rows = fit.table((300, 30000), measured={300: 0.31}).rows
    assert rows[0]["source"] == "measured" and rows[0]["measured (s)"] == 0.31
    assert rows[1]["source"] == "extrapolated (fit)" and math.isnan(rows[1]["measured (s)"])


def test_prefill_outlook_measures_what_fits_and_extrapolates_the_rest(llm):
    fit = ex.fit_prefill([16, 32, 64], [0.01, 0.02, 0.04])
    rows = ex.prefill_outlook(llm, fit, (100, 30000)).rows  # tiny: max_model_len 4096
    assert [r["source"] for r in rows] == ["measured", "extrapolated (fit)"]
    assert rows[0]["measured (s)"] > 0


def test_counted_prefill_flops_of_llama_3_8b():
    rows = ex.counted_prefill_flops("llama-3-8b", (300, 30000)).rows
    assert [r["attention share"] for r in rows] == ["0.6%", "36.0%"]
    cost = roofline.step_cost(preset_config("llama-3-8b"), roofline.prefill_batch(300))
    assert rows[0]["linear GFLOP"] == round(cost.flops["linear"] / 1e9, 1)


def test_decode_context_sweep(llm):
    points = ex.decode_context_sweep(llm, (256, 16, 64), steps=3, reps=2, progress=False)
    assert [p.prompt_len for p in points] == [16, 64, 256]
    assert [p.context_len for p in points] == [18, 66, 258]  # the middle of 3 decode steps
    assert all(len(p.times) == 2 and p.step_seconds > 0 for p in points)
    floors = ex.decode_floors(llm, fake_ceilings(), 1, [p.context_len for p in points])
    rows = ex.decode_context_table(points, floors).rows
    assert [r["context tokens"] for r in rows] == [18, 66, 258]
    assert rows[0]["step vs first"] == "1.00x" and rows[0]["floor vs first"] == "1.00x"
    assert float(rows[2]["floor vs first"].rstrip("x")) > 1  # more KV to read
    with pytest.raises(ValueError, match="max_model_len"):
        ex.decode_context_sweep(llm, (4090,), steps=8, reps=1, progress=False)


def test_decode_floors_and_roofline_points(llm):
    floors = ex.decode_floors(llm, fake_ceilings(), 1, [16, 1024, 4096])
    assert floors[0] < floors[1] < floors[2]  # more KV to read
    pts = ex.roofline_points(llm, [("prefill 64", roofline.prefill_batch(64), 0.01),
                                   ("decode", roofline.decode_batch(1, 64), 0.001)])
    assert [p[0] for p in pts] == ["prefill 64", "decode"]
    assert pts[0][1] > 10 * pts[1][1]  # prefill far right of decode


# --- 02 ---------------------------------------------------------------------------------------

def test_generation_with_and_without_cache_agree(llm):
    prompt = list(range(10, 30))
    a = ex.generate_with_cache(llm, prompt, 8)
    b = ex.generate_without_cache(llm, prompt, 8, progress=False)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 8
    assert a.positions == list(range(8)) and len(a.seconds) == 8
    assert b.positions == [0, 4, 7] and len(b.seconds) == 3  # every 4th token and the last, timed
    assert a.total > 0 and b.total > 0
    rows = ex.cache_table(llm, len(prompt), a, b).rows
    assert rows[2]["GFLOP (counted)"] > 2  # recomputing does several times the work


def test_kv_bytes_formula():
    assert kv_bytes_per_token(preset_config("llama-3-8b"), "bfloat16") == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token(preset_config("llama-120m"), "float32") == 2 * 12 * 4 * 64 * 4
    rows = {r["model"]: r for r in ex.kv_budget_table(("llama-3-8b",)).rows}
    row = rows["llama-3-8b"]
    assert row["KiB/token"] == 128 and row["MiB/request (4096)"] == 512
    assert row["requests/GPU"] == int((0.92 * 80e9 - preset_config("llama-3-8b").num_params() * 2)
                                      // 131072) // 4096


def test_allocator_matches_the_formula(llm):
    check = ex.check_kv_allocator(llm)
    assert check.num_blocks == 2048 and check.matches
    assert check.num_tensors == 2 * preset_config("tiny").num_hidden_layers
    assert check.table().rows[-1]["value"] is True


def test_fragmentation_run_reads_the_allocator(llm):
    wl = ex.fragmentation_workload(llm, 8, 24, 16)
    run = ex.fragmentation_run(llm, wl, 4, progress=False)
    bs = run.block_size
    assert run.max_tokens_cap == max(wl.output_lens)
    for tok, paged, req, full, n in zip(run.tokens, run.paged, run.reserve_request,
                                        run.reserve_max_len, run.running):
        assert tok <= paged <= tok + n * (bs - 1)  # only the end of each last block is empty
        assert full == n * run.max_model_len and req <= full
    blocks = [b for ids, _ in run.snapshot.values() for b in ids]
    assert len(blocks) == len(set(blocks)), "two requests share a block"
    rows = run.table().rows
    assert [r["allocation"].split(",")[0] for r in rows] == ["paged blocks", "contiguous", "contiguous"]
    share = [float(r["slots holding a token"].rstrip("%")) for r in rows]
    assert share[0] > share[2]


# --- 03 ---------------------------------------------------------------------------------------

def test_decode_batch_sweep(llm):
    points = ex.decode_batch_sweep(llm, (4, 1, 2), context_len=16, steps=4, progress=False)
    assert [p.batch for p in points] == [1, 2, 4]
    assert [len(p.outputs) for p in points] == [1, 2, 4]
    assert all(p.step_seconds > 0 and p.tokens_per_s == pytest.approx(p.batch / p.itl_seconds)
               for p in points)
    floors = ex.batch_floors(llm, fake_ceilings(), points)
    assert floors[0] <= floors[1] <= floors[2]
    assert [r["batch"] for r in ex.decode_table(points, floors).rows] == [1, 2, 4]
    assert [p[0] for p in ex.decode_points(llm, points)] == ["B=1", "B=2", "B=4"]
    with pytest.raises(ValueError, match="max_num_seqs|KV|blocks|exceeds"):
        ex.decode_batch_sweep(llm, (4096,), context_len=16, steps=1, progress=False)


def test_prefill_batch_sweep_and_the_gain_table(llm):
    points = ex.prefill_batch_sweep(llm, (4, 1, 2), prompt_len=32, reps=2, progress=False)
    assert [p.num_prompts for p in points] == [1, 2, 4]
    assert all(len(p.times) == 2 and p.prompt_len == 32 for p in points)
    assert all(p.tokens_per_s == pytest.approx(p.num_prompts * 32 / p.step_seconds) for p in points)
    decode = ex.decode_batch_sweep(llm, (1, 2, 8), context_len=16, steps=3, progress=False)
    rows = ex.batching_gain_table(decode, points).rows
    assert [r["sequences in the step"] for r in rows] == [1, 2, 4, 8]
    assert rows[0]["decode gain"] == rows[0]["prefill gain"] == "1.0x"
    assert rows[2]["decode gain"] == "" and rows[3]["prefill gain"] == ""  # measured by one side only
    assert rows[1]["decode tokens/s"] == pytest.approx(2 / decode[1].step_seconds)
    with pytest.raises(ValueError, match="KV blocks"):
        ex.prefill_batch_sweep(llm, (16,), prompt_len=4000, reps=1, progress=False)


def fake_point(batch, tokens_per_s, tpot_s):
    """A DecodePoint whose requests each report the given TPOT (2 tokens, 1 gap)."""
    metrics = SimpleNamespace(arrival_time=0.0, first_scheduled_time=0.0, first_token_time=1.0,
                              token_times=[1.0, 1.0 + tpot_s], finished_time=1.0 + tpot_s)
    out = SimpleNamespace(prompt_token_ids=[7], token_ids=[1, 2], metrics=metrics, finished=True,
                          finish_reason="length")
    return ex.DecodePoint(batch, 16, 1.0, batch / tokens_per_s, [out] * batch)


def test_scaling_knee_and_goodput():
    points = [fake_point(1, 100, 0.010), fake_point(2, 195, 0.0102), fake_point(4, 380, 0.0105),
              fake_point(8, 420, 0.019)]
    assert ex.scaling_knee(points) == 8  # per sequence: 100, 97.5, 95, 52.5 tokens/s: all >= 50
    assert ex.scaling_knee(points + [fake_point(16, 500, 0.03)]) == 8  # 31 tokens/s each: < 50
    assert ex.scaling_knee(points, efficiency=0.9) == 4
    small, big, target = ex.itl_target(points)
    assert (small, big) == (1, 2) or (small, big) == (2, 4)
    rows = ex.goodput_table(points, 0.015).rows  # request goodput: requests/s within the SLO
    want = [round(b / (1 + t), 2) for b, t in ((1, 0.010), (2, 0.0102), (4, 0.0105))] + [0.0]
    assert [r["goodput requests/s"] for r in rows] == want
    assert rows[3]["meet SLO"] == "0/8" and rows[3]["requests/s"] == round(8 / 1.019, 2)


def test_itl_target_sits_between_the_pair():
    points = [fake_point(1, 100, 0.010), fake_point(2, 200, 0.012), fake_point(4, 300, 0.020)]
    small, big, target = ex.itl_target(points)
    assert (small, big) == (1, 2) and 0.010 < target < 0.012
    with pytest.raises(ValueError, match="B and 2B"):
        ex.itl_target([fake_point(1, 100, 0.01), fake_point(3, 200, 0.01)])


def test_datasheet_critical_batches():
    rows = {r["device"]: r for r in ex.datasheet_critical_batches("bfloat16").rows}
    assert rows["H100 SXM"]["critical batch"] == 295


# --- 04 ---------------------------------------------------------------------------------------

def test_toy_policy_steps():
    rows = {r["policy"]: r for r in ex.toy_policy_steps([2, 8, 3, 8, 1, 5], 2).rows}
    assert rows["static"]["steps"] == 21 and rows["continuous"]["steps"] == 14
    assert rows["static"]["finish step per request"] == [2, 8, 11, 16, 17, 21]


def test_serving_and_policies(llm):
    wl = ex.serving_workload(llm, 6, 2, (8, 16), (2, 6), load=0.8)
    assert len(wl) == 6 and all(8 <= n <= 16 for n in wl.input_lens)
    assert 0 < wl.arrival_times[-1] and "capacity" in wl.description
    results = ex.compare_policies(llm, wl, 2, progress=False)
    assert list(results) == ["static", "continuous"]
    for r in results.values():
        assert all(o.finished for o in r.outputs) and r.config.max_num_seqs == 2
    for rec in results["static"].trace:  # static: a batch forms, then only decodes until it empties
        kinds = {e.kind for e in rec.entries}
        assert kinds in ({"prefill"}, {"decode"}), f"static step mixes {kinds}"
    assert results["static"].device_label.startswith("static batching, measured on")
    rows = ex.policy_table(results).rows
    assert [r["policy"] for r in rows] == ["static", "continuous"]
    assert all(r["output tokens/s"] > 0 for r in rows)
