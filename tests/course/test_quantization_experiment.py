"""course.experiments.quantization and kv_dtype (lesson 13) on the tiny preset: each weight format
loads the engine it names, the floors count the bytes as stored (the lm_head too), the fp8 cache
holds twice the blocks, and the timing helpers refuse what they cannot time."""

import math

import pytest
import torch

from nanoserve.config import EngineConfig
from nanoserve.course.experiments import kv_dtype
from nanoserve.course.experiments import quantization as qx
from nanoserve.engine.llm import engine_of
from nanoserve.measure.slo import parse_slo
from tests.course.test_experiments import fake_ceilings

MODEL = "preset:tiny"


@pytest.mark.parametrize("fmt", list(qx.WEIGHT_FORMATS))
def test_each_weight_format_loads_the_engine_it_names(fmt):
    dtype, method, lm_head = qx.WEIGHT_FORMATS[fmt]
    model = engine_of(qx.load(MODEL, fmt, num_kv_blocks=8)).model
    assert model.embed_tokens.weight.dtype == getattr(torch, dtype)
    down = model.layers[0].mlp.down_proj
    assert hasattr(down, "qweight") == (method is not None)
    if method:
        assert down.qweight.dtype == {"int8": torch.int8, "fp8": torch.float8_e4m3fn}[method]
    assert (model.lm_head_quant is not None) == lm_head


def test_an_unknown_weight_format_is_refused_naming_it_and_the_choices():
    with pytest.raises(ValueError, match=r"'int4'.*int8 \+ lm_head"):
        qx.load(MODEL, "int4")


def test_the_floor_counts_each_formats_bytes_as_stored_the_lm_head_too():
    c = fake_ceilings(bw=10e9)
    floors = {f: qx.decode_floor(qx.load(MODEL, f, num_kv_blocks=8), 1, 32, c)
              for f in ("float32", "bfloat16", "int8", "int8 + lm_head")}
    for nbytes, seconds in floors.values():
        assert seconds == pytest.approx(nbytes / 10e9)
    bf16, int8, head = (floors[f][0] for f in ("bfloat16", "int8", "int8 + lm_head"))
    assert floors["float32"][0] > bf16 > int8 > head
    weight = engine_of(qx.load(MODEL, "bfloat16", num_kv_blocks=8)).model.lm_head_weight()
    vocab, hidden = weight.shape
    # the lm_head's bf16 bytes become one byte a weight and one fp32 scale a row
    assert int8 - head == pytest.approx(vocab * hidden * 2 - (vocab * hidden + 4 * vocab))


def test_weight_formats_itl_times_each_format_against_its_floor():
    c = fake_ceilings(bw=10e9)
    rows = qx.weight_formats_itl(MODEL, ("bfloat16", "int8 + lm_head"), 16, 2, c)
    assert [r.weight_format for r in rows] == ["bfloat16", "int8 + lm_head"]
    assert all(r.itl_s > 0 and r.floor_s == pytest.approx(r.weight_bytes / 10e9) for r in rows)
    table = qx.weights_table(rows).rows
    assert table[1]["speed-up vs bfloat16"] == round(rows[0].itl_s / rows[1].itl_s, 2)
    assert table[1]["floor / measured"] == f"{rows[1].floor_s / rows[1].itl_s:.0%}"


def test_prefill_time_times_the_whole_prompt_in_one_step_or_refuses():
    llm = qx.load(MODEL, "int8", num_kv_blocks=16, max_num_batched_tokens=64)
    assert qx.prefill_time(llm, 48, reps=2) > 0
    with pytest.raises(ValueError, match="prompt_len=100.*max_num_batched_tokens=64"):
        qx.prefill_time(llm, 100)


def test_prefill_times_time_one_prompt_on_each_engine_whole():
    times = qx.prefill_times(MODEL, 40)
    assert list(times) == ["bf16", "int8 weights", "fp8 KV"] and all(t > 0 for t in times.values())


def test_the_kv_share_is_the_attentions_bytes_and_shrinks_with_an_fp8_cache():
    llms = {kv: qx.load(MODEL, "bfloat16", kv, num_kv_blocks=64) for kv in ("auto", "fp8")}
    share = {kv: qx.kv_share(llm, 4, 200) for kv, llm in llms.items()}
    cost = qx.decode_step_cost(llms["auto"], 4, 200)
    assert share["auto"] == pytest.approx(cost.bytes["attention"] / cost.total_bytes)
    assert 0 < share["fp8"] < share["auto"] < 1
    assert qx.kv_share(llms["auto"], 4, 800) > share["auto"]  # more context, more K/V per step


def test_the_fp8_cache_holds_twice_the_blocks_of_bf16_in_the_same_memory():
    memory = 3 * 2**17
    rows = [kv_dtype.capacity(kv_dtype.kv_engine(MODEL, "bfloat16", kv, memory), 40)
            for kv in kv_dtype.KV_DTYPES]
    auto, fp8 = rows
    assert (auto.cache_dtype, fp8.cache_dtype) == ("bfloat16", "float8_e4m3fn")
    assert fp8.num_kv_blocks in (2 * auto.num_kv_blocks, 2 * auto.num_kv_blocks + 1)
    # 40 tokens take three blocks of 16
    assert auto.max_batch == auto.num_kv_blocks // 3 and fp8.max_batch == fp8.num_kv_blocks // 3
    assert kv_dtype.capacity_table(rows, memory, 40).rows[1]["blocks vs first"] == round(
        fp8.num_kv_blocks / auto.num_kv_blocks, 2)


def test_serve_workload_scores_every_request_at_the_slo_it_was_given():
    llm = kv_dtype.kv_engine(MODEL, "bfloat16", "fp8", 3 * 2**17)
    slo = kv_dtype.slo_for(0.01, 8)
    assert parse_slo(slo) == pytest.approx({"ttft": 0.12, "tpot": 0.04})
    run = kv_dtype.serve_workload(llm, 6, 16, 8, 200.0, slo)
    assert len(run.outputs) == 6 and all(len(o.token_ids) == 8 for o in run.outputs)
    assert 0 <= run.attainment <= 1 and run.goodput == pytest.approx(run.attainment * 6 / run.duration)
    assert 1 <= run.max_running <= 6 and run.throughput > 0
    assert run.goodput_at("ttft<=1000s") == pytest.approx(6 / run.duration)  # every request is within it


def test_decode_step_time_refuses_a_batch_the_cache_cannot_run_at_once():
    llm = qx.load(MODEL, "bfloat16", num_kv_blocks=6)  # three sequences of 24 + 5 tokens, not four
    assert kv_dtype.decode_step_time(llm, 2, 24, 4) > 0
    with pytest.raises(RuntimeError, match="no decode step ran all 4 sequences"):
        kv_dtype.decode_step_time(llm, 4, 24, 4)


def test_kv_magnitudes_reads_a_float_cache_and_refuses_an_fp8_one():
    prompts = [list(range(3, 19))]
    k, v = kv_dtype.kv_magnitudes(kv_dtype.kv_engine(MODEL, "bfloat16", "auto", 3 * 2**17), prompts)
    assert k > 0 and v > 0
    with pytest.raises(ValueError, match="kv_cache_dtype='auto'"):
        kv_dtype.kv_magnitudes(kv_dtype.kv_engine(MODEL, "bfloat16", "fp8", 3 * 2**17), prompts)


def test_the_quality_variants_are_engine_configs_differing_from_the_reference_as_named():
    fields = {name: EngineConfig(**kw) for name, kw in qx.QUALITY_VARIANTS.items()}
    assert fields["fp8 KV"].kv_cache_dtype == "fp8" and fields["fp8 KV"].quantization is None
    assert fields["int8 + lm_head"].quantization_lm_head and not fields["int8 weights"].quantization_lm_head
    assert fields["fp8 weights"].quantization == "fp8"


def test_load_sweep_offers_multiples_of_what_the_first_engine_serves_all_at_once():
    llms = [kv_dtype.kv_engine(MODEL, "bfloat16", kv, 3 * 2**17) for kv in kv_dtype.KV_DTYPES]
    saturated, runs = kv_dtype.load_sweep(llms, 6, 16, 8, (0.5, 2.0), "ttft<=1000s")
    assert [r.kv_cache_dtype for r in saturated] == ["auto", "fp8"]
    assert all(math.isinf(r.rate) and len(r.outputs) == 6 for r in saturated)
    base = saturated[0].served_rate
    assert [r.kv_cache_dtype for r in runs] == ["auto", "fp8", "auto", "fp8"]
    assert [r.rate for r in runs] == pytest.approx([0.5 * base, 0.5 * base, 2 * base, 2 * base])
    for r in runs:  # the loose SLO holds every request: goodput is what was served
        assert r.goodput == pytest.approx(r.served_rate) and r.attainment == 1
    rows = kv_dtype.goodput_table(saturated + runs, "ttft<=1000s").rows
    assert [row["offered req/s"] for row in rows[:3]] == ["all at once", "all at once", round(0.5 * base, 2)]


def test_long_context_steps_time_a_decode_of_the_whole_batch_over_each_cache():
    times = kv_dtype.long_context_steps(MODEL, "bfloat16", 3, 80, steps=2)
    assert list(times) == list(kv_dtype.KV_DTYPES) and all(t > 0 for t in times.values())
