"""One bad request never harms another: failures injected while a step runs finish only the
requests they are tied to (finish_reason "error", blocks freed), and the engine goes on."""

import pytest
import torch

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams
from nanoserve.engine.sampler import Sampler
from tests.conftest import FakeExecutor, assert_no_leaks

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def fake_engine(**kw):
    config = EngineConfig(**(dict(block_size=4, num_kv_blocks=64) | kw))
    return LLMEngine.from_executor(FakeExecutor(block_size=config.block_size), config)


def run(engine, limit=1000) -> dict:
    """Step until idle. -> final output per request id."""
    final = {}
    for _ in range(limit):
        if not engine.has_unfinished():
            return final
        final.update({o.request_id: o for o in engine.step() if o.finished})
    raise AssertionError("the engine did not drain")


def clean_tokens(prompts: dict, params=GREEDY) -> dict:
    """What each request generates on an engine that only ever saw these requests."""
    engine = fake_engine()
    for rid, prompt in prompts.items():
        engine.add_request(prompt, params, request_id=rid)
    return {rid: o.token_ids for rid, o in run(engine).items()}


@pytest.mark.parametrize("when", ["before", "sample"])
def test_failure_tied_to_one_request_finishes_only_that_request(when):
    engine = fake_engine()
    prompts = {"a": [5, 6, 7, 8, 9], "bad": [11, 12, 13], "c": [20, 21]}
    for rid, prompt in prompts.items():
        engine.add_request(prompt, GREEDY, request_id=rid)
    engine.executor.fail["bad"] = when
    outs = {o.request_id: o for o in engine.step()}
    assert outs["bad"].finished and outs["bad"].finish_reason == "error"
    assert "injected" in outs["bad"].error and outs["bad"].token_ids == []
    assert {"a", "c"} <= set(outs) and not outs["a"].finished  # they got their first token
    final = run(engine)
    assert {rid: final[rid].token_ids for rid in ("a", "c")} == clean_tokens(
        {rid: prompts[rid] for rid in ("a", "c")})
    assert "bad" in engine.executor.finished and engine.stats.failed_requests == 1
    assert_no_leaks(engine)
    assert not engine.executor.kv_errors


def test_failure_tied_to_nobody_fails_that_step_only_and_the_engine_goes_on():
    engine = fake_engine(max_num_seqs=2)
    for rid in ("a", "b", "later"):
        engine.add_request([1, 2, 3, 4, 5], GREEDY, request_id=rid)
    engine.executor.fail_step = True
    outs = {o.request_id: o for o in engine.step()}
    assert set(outs) == {"a", "b"}  # the two seats; "later" was not in the step
    assert all(o.finish_reason == "error" and o.error.startswith("the step failed: RuntimeError")
               for o in outs.values())
    engine.add_request([9, 8, 7], GREEDY, request_id="new")
    final = run(engine)
    assert final["later"].finish_reason == "length" and final["new"].finish_reason == "length"
    assert final["later"].token_ids == clean_tokens({"later": [1, 2, 3, 4, 5]})["later"]
    assert_no_leaks(engine)
    assert not engine.executor.kv_errors


def test_a_request_that_hit_a_failed_requests_blocks_in_the_same_step_is_recomputed():
    """B takes a prefix-cache hit on blocks A is writing in the same step; A fails before the
    step runs, so nobody writes them: B is preempted and recomputed, never served them."""
    shared = list(range(30, 42))  # 3 full blocks of 4
    engine = fake_engine(max_num_batched_tokens=64)
    engine.add_request(shared + [1], GREEDY, request_id="A")
    engine.add_request(shared + [2], GREEDY, request_id="B")
    engine.executor.fail["A"] = "before"
    outs = {o.request_id: o for o in engine.step()}
    assert outs["A"].finish_reason == "error" and engine.stats.preemptions == 1
    final = run(engine)
    assert final["B"].token_ids == clean_tokens({"B": shared + [2]})["B"]
    assert final["B"].num_cached_tokens == 12  # its first admission did hit A's blocks
    assert not engine.executor.kv_errors, engine.executor.kv_errors
    assert_no_leaks(engine)


@pytest.fixture(scope="module")
def llm():
    return LLM("preset:tiny", config=EngineConfig(block_size=4, num_kv_blocks=128,
                                                  max_num_batched_tokens=64))


PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14]]


def test_model_runner_sampler_failure_for_one_request(llm, monkeypatch):
    """The issue's case: a seed the generator rejects fails that request, not the engine."""
    want = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    eng = llm.engine
    ids = [eng.add_request(p, GREEDY) for p in PROMPTS]
    bad = eng.add_request([3, 3, 3], SamplingParams(max_tokens=6, temperature=1.0, seed=1))
    eng.requests[bad].params.seed = "x"  # past validation: the sampler itself fails
    final = run(eng)
    assert final[bad].finish_reason == "error" and "manual_seed" in final[bad].error
    assert [final[i].token_ids for i in ids] == want
    assert_no_leaks(eng)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == want  # still serving


def test_model_runner_sampler_raising_is_tied_to_its_request(llm, monkeypatch):
    want = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    eng = llm.engine
    ids = [eng.add_request(p, GREEDY) for p in PROMPTS]
    doomed = eng.add_request([4, 4, 4], SamplingParams(max_tokens=6, temperature=1.0, seed=3))
    gen = Sampler._gen

    def failing_gen(self, request_id, params):
        if request_id == doomed:
            raise RuntimeError("generator exploded")
        return gen(self, request_id, params)
    monkeypatch.setattr(Sampler, "_gen", failing_gen)
    final = run(eng)
    assert final[doomed].error == "sampling failed: RuntimeError: generator exploded"
    assert [final[i].token_ids for i in ids] == want
    assert_no_leaks(eng)


def test_model_failure_fails_the_step_and_the_engine_stays_usable(llm, monkeypatch):
    want = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    eng = llm.engine
    model = eng.executor.forward
    calls = []

    def broken_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second step: mid-decode
            raise torch.cuda.OutOfMemoryError("injected")
        return model(*args, **kwargs)
    monkeypatch.setattr(eng.executor, "forward", broken_once)
    outs = llm.generate(PROMPTS, GREEDY)
    assert all(o.finish_reason == "error" and "OutOfMemoryError" in o.error for o in outs)
    assert all(len(o.token_ids) == 1 for o in outs)  # the first step's token is kept
    assert_no_leaks(eng)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == want
