"""Engine behaviour: bad input errors, finish reasons, sampling, streaming, abort, no leaks."""

import pytest

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams
from tests.conftest import assert_no_leaks


@pytest.fixture(scope="module")
def llm():
    return LLM("preset:tiny", config=EngineConfig(block_size=4, num_kv_blocks=64, max_model_len=64,
                                                  max_num_batched_tokens=32))


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens=0"),
    (dict(temperature=-0.5), "temperature=-0.5"),
    (dict(top_p=0.0), "top_p=0.0"),
    (dict(top_p=1.5), "top_p=1.5"),
    (dict(top_k=-3), "top_k=-3"),
])
def test_bad_sampling_params_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_requests_are_rejected_and_nothing_in_flight_is_lost(llm):
    eng = llm.engine
    keep = eng.add_request([1, 2, 3], SamplingParams(max_tokens=5, temperature=0))
    with pytest.raises(ValueError, match="empty"):
        eng.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="70 tokens.*max_model_len=64"):
        eng.add_request(list(range(70)), SamplingParams())
    with pytest.raises(ValueError, match="token id 5000"):
        eng.add_request([1, 5000], SamplingParams())
    with pytest.raises(ValueError, match="text prompts need a model with a tokenizer"):
        llm.generate(["hello"])
    done = {}
    while eng.has_unfinished():
        done.update({o.request_id: o for o in eng.step() if o.finished})
    assert len(done[keep].token_ids) == 5
    assert_no_leaks(eng)


def test_bad_engine_setup_names_the_value(tmp_path):
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        LLM("preset:nope")
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        LLM(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="block_size=0"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="scheduling_policy='fifo'"):
        EngineConfig(scheduling_policy="fifo")
    with pytest.raises(ValueError, match="dtype='float8'"):
        LLM("preset:tiny", dtype="float8")
    with pytest.raises(ValueError, match="max_model_len=99999"):
        LLM("preset:tiny", config=EngineConfig(max_model_len=99999))
    small = LLM("preset:tiny", config=EngineConfig(block_size=4, num_kv_blocks=3))
    with pytest.raises(ValueError, match="needs 5 KV blocks.*num_kv_blocks=3"):
        small.generate([[1] * 10], SamplingParams(max_tokens=10))
    assert_no_leaks(small.engine)


def test_finish_reasons_length_stop_eos_and_max_model_len(llm):
    base = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0))[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 6
    stop_tok = base.token_ids[2]
    o = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[stop_tok]))[0]
    assert o.finish_reason == "stop" and o.token_ids == base.token_ids[:base.token_ids.index(stop_tok) + 1]
    eng = llm.engine
    eng.model_config.eos_token_id = stop_tok
    try:
        o = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0))[0]
        assert o.finish_reason == "eos" and o.token_ids[-1] == stop_tok
        o = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
        assert o.token_ids == base.token_ids
    finally:
        eng.model_config.eos_token_id = None
    o = llm.generate([list(range(1, 61))], SamplingParams(max_tokens=20, temperature=0))[0]
    assert o.finish_reason == "length" and len(o.token_ids) == 4  # 60 + 4 = max_model_len
    assert_no_leaks(eng)


def test_metrics_timestamps_are_ordered(llm):
    o = llm.generate([[9, 9, 9, 9, 9]], SamplingParams(max_tokens=8, temperature=0))[0]
    m = o.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert len(m.token_times) == 8 and m.token_times == sorted(m.token_times)
    assert m.token_times[0] == m.first_token_time and m.token_times[-1] == m.finished_time


def test_seeded_sampling_is_reproducible_and_independent_of_batch(llm):
    p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    alone = llm.generate([[3, 1, 4, 1, 5]], p)[0].token_ids
    mixed = llm.generate([[2, 7], [3, 1, 4, 1, 5], [8] * 9],
                         [SamplingParams(max_tokens=5, temperature=1.0), p, SamplingParams(max_tokens=3)])
    assert mixed[1].token_ids == alone
    unseeded = {tuple(llm.generate([[3, 1, 4, 1, 5]],
                                   SamplingParams(max_tokens=12, temperature=1.0))[0].token_ids)
                for _ in range(3)}
    assert len(unseeded) > 1, "temperature sampling without a seed should vary"


def test_top_k_1_is_greedy(llm):
    g = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0))[0].token_ids
    k1 = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=1.5, top_k=1))[0].token_ids
    assert g == k1


def test_stream_yields_deltas_with_timestamps_and_abort_frees_blocks(llm):
    eng = llm.engine
    deltas = {}
    for o in llm.stream([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=5, temperature=0)):
        deltas.setdefault(o.request_id, []).extend(o.new_token_ids)
        assert len(o.metrics.token_times) == len(o.token_ids)
        if o.finished:
            assert deltas[o.request_id] == o.token_ids
    assert len(deltas) == 2
    it = llm.stream([[1, 2, 3, 4, 5, 6, 7]], SamplingParams(max_tokens=30, temperature=0))
    next(it)
    it.close()  # closing the stream aborts the request
    assert_no_leaks(eng)


def test_abort_mid_prefill_and_mid_decode_leaves_no_block(llm):
    eng = llm.engine
    a = eng.add_request(list(range(100, 149)), SamplingParams(max_tokens=10))  # 49 > budget 32
    b = eng.add_request([1, 2], SamplingParams(max_tokens=10))
    eng.step()  # a is mid-prefill
    assert eng.requests[a].num_computed_tokens < 49
    eng.step()
    eng.step()  # b is decoding
    out = eng.abort(b)
    assert out.finished and out.finish_reason == "abort"
    eng.abort(a)
    assert eng.abort("nope") is None
    assert not eng.has_unfinished()
    assert_no_leaks(eng)


def test_custom_clock_and_future_arrivals():
    now = [0.0]
    eng = LLMEngine("preset:tiny", config=EngineConfig(num_kv_blocks=32), clock=lambda: now[0])
    rid = eng.add_request([1, 2, 3], SamplingParams(max_tokens=2), arrival_time=5.0)
    assert eng.step() == [] and eng.next_arrival() == 5.0
    now[0] = 5.0
    while eng.has_unfinished():
        outs = eng.step()
        now[0] += 0.5
    assert outs[0].request_id == rid and outs[0].metrics.first_scheduled_time == 5.0


def test_generate_raises_instead_of_spinning_when_a_scheduler_makes_no_progress():
    from nanoserve.engine.scheduler import Scheduler, SchedulerOutput

    class Idle(Scheduler):
        def schedule(self, now):
            return SchedulerOutput()

    llm = LLM("preset:tiny", config=EngineConfig(num_kv_blocks=16), scheduler=Idle)
    with pytest.raises(RuntimeError, match="scheduled nothing while requests"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
