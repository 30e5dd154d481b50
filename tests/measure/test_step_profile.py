"""step_profile: the split of a step's wall time covers the step and leaves the engine as it was."""

import pytest

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.measure.step_profile import PARTS, step_profile


@pytest.fixture(scope="module")
def llm():
    return LLM("preset:tiny", device="cpu", dtype="float32",
               config=EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64))


@pytest.mark.parametrize("batch, context, prefill", [(1, 9, False), (4, 40, False), (3, 20, True)])
def test_parts_cover_the_step_and_the_engine_is_left_clean(llm, batch, context, prefill):
    model = llm.engine.model
    ops = model.layers[0].ops
    free = llm.engine.kv_manager.num_free_blocks
    p = step_profile(llm, batch, context, prefill=prefill, steps=3)
    assert set(p.parts_ms) == set(PARTS) and p.steps == (1 if prefill else 3)
    assert all(v >= 0 for v in p.parts_ms.values()), p.parts_ms  # "other" = step - timed parts
    assert p.parts_ms["linear"] > 0 and p.parts_ms["attention"] > 0 and p.parts_ms["norm"] > 0
    assert str(p).startswith(("prefill" if prefill else "decode") + f" batch {batch} x {context}")
    # nothing of the profiling stays behind
    assert not llm.engine.has_unfinished() and llm.engine.kv_manager.num_free_blocks == free
    assert all(m.ops is ops for m in model.modules() if "ops" in vars(m))
    assert "compute_logits" not in vars(model)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert not any("profile" in k for m in model.modules() for k in vars(m))
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0))
    assert len(out[0].token_ids) == 3


def test_a_batch_that_decodes_while_others_still_prefill(llm):
    """8 x 30 tokens take several 64-token steps to prefill; early sequences decode meanwhile."""
    p = step_profile(llm, 8, 30, steps=2)
    assert p.steps == 2 and not llm.engine.has_unfinished()


def test_refuses_what_it_cannot_time(llm):
    with pytest.raises(ValueError, match="max_num_batched_tokens=64"):
        step_profile(llm, 2, 40, prefill=True)
    with pytest.raises(ValueError, match="max_num_seqs=8"):
        step_profile(llm, 9, 4)
    rid = llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    try:
        with pytest.raises(ValueError, match="idle engine"):
            step_profile(llm, 1, 8)
    finally:
        llm.engine.abort(rid)


def test_host_is_the_step_outside_the_model(llm, monkeypatch):
    """Work the engine does around the model (here a scheduler slowed by 20 ms a step) is host,
    not model time."""
    import time
    base = step_profile(llm, 2, 8, steps=3)
    assert 0 < base.parts_ms["host"] < base.step_ms
    schedule = llm.engine.scheduler.schedule

    def slow(*args, **kwargs):
        time.sleep(0.02)
        return schedule(*args, **kwargs)

    monkeypatch.setattr(llm.engine.scheduler, "schedule", slow)
    p = step_profile(llm, 2, 8, steps=3)
    assert p.parts_ms["host"] >= base.parts_ms["host"] + 19
    assert p.parts_ms["other"] < base.parts_ms["other"] + 10


def test_an_8_bit_models_linears_count_as_linear(monkeypatch):
    """QuantizedLinear's matmuls over codes are linear time, not "other": a linear slowed by
    5 ms a call adds at least 5 ms per decoder linear to "linear"."""
    import time

    llm = LLM("preset:tiny", device="cpu", dtype="bfloat16", quantization="int8",
              config=EngineConfig(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=32))
    cls = type(llm.engine.model.layers[0].mlp.down_proj)  # QuantizedCpuLinear, or the reference's
    forward = cls.forward

    def slow(self, x):
        time.sleep(0.005)
        return forward(self, x)
    monkeypatch.setattr(cls, "forward", slow)
    n = sum(isinstance(m, cls) for m in llm.engine.model.modules())
    p = step_profile(llm, 1, 8, steps=2)
    assert n > 0 and p.parts_ms["linear"] >= 5 * n, (n, p.parts_ms)
    assert p.parts_ms["other"] < 5 * n, p.parts_ms


def test_a_quantized_lm_head_counts_as_linear_once(monkeypatch):
    """compute_logits is timed as linear, so the lm_head's codes (a quantized linear called from
    it) must not be timed again. On a clock that moves only while the lm_head runs (a second a
    call, one call a step), "linear" is one second a step, not two, and nothing goes negative."""
    from types import SimpleNamespace

    from nanoserve.measure import step_profile as sp
    llm = LLM("preset:tiny", device="cpu", dtype="bfloat16", config=EngineConfig(
        max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=32, quantization="int8",
        quantization_lm_head=True))
    head = llm.engine.model.lm_head_quant
    forward, now = head.forward, [0.0]

    def one_second(x):
        now[0] += 1.0
        return forward(x)
    monkeypatch.setattr(head, "forward", one_second)
    monkeypatch.setattr(sp, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    p = step_profile(llm, 1, 8, steps=3)
    assert p.parts_ms["linear"] == 1000.0 and p.step_ms == 1000.0, p.parts_ms
    assert all(v == 0.0 for k, v in p.parts_ms.items() if k != "linear"), p.parts_ms


def test_step_profiles_interleave_rounds_and_keep_each_batchs_median_round(llm, monkeypatch):
    from nanoserve.measure import step_profile as sp
    calls, times = [], iter([5.0, 9.0, 1.0, 2.0, 3.0, 30.0])  # rounds of (batch 1, batch 4)

    def fake(llm, batch, context, steps):
        calls.append(batch)
        ms = next(times)
        return sp.StepProfile(f"batch {batch}", steps, ms, dict.fromkeys(sp.PARTS, ms / len(sp.PARTS)))
    monkeypatch.setattr(sp, "step_profile", fake)
    profiles = sp.step_profiles(llm, (1, 4), 16, steps=2, rounds=3)
    assert calls == [1, 4, 1, 4, 1, 4]  # every round runs every batch size
    assert [p.label for p in profiles] == ["batch 1", "batch 4"]
    assert [p.step_ms for p in profiles] == [3.0, 9.0]  # the median round, as it measured it
