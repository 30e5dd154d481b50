"""Fuzz: thousands of engine steps of random adds, aborts, bad requests and injected failures.

The real scheduler and KV manager run over tests.conftest.FakeExecutor, which also checks every
KV read. Throughout: both check_invariants hold, bad requests are refused with InvalidRequest and
change nothing. Afterwards: every block is back, no request read another prefix's KV, every
failure is explained by an injection, and every request that finished normally has exactly the
tokens a clean run (the same requests, nothing else) gives it.
"""

import dataclasses
import random

import pytest

from nanoserve import EngineConfig, LLMEngine, SamplingParams
from nanoserve.errors import InvalidRequest
from tests.conftest import FakeExecutor, assert_no_leaks

VOCAB = 500
STEPS = 1200  # engine steps per configuration, before draining
CONFIGS = {
    "chunked-caching-preempting": dict(block_size=4, num_kv_blocks=40, max_num_batched_tokens=24,
                                       max_num_seqs=6),
    "no-chunking": dict(block_size=4, num_kv_blocks=48, max_num_batched_tokens=32, max_num_seqs=8,
                        enable_chunked_prefill=False),
    "static-block-2": dict(block_size=2, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=4,
                           scheduling_policy="static"),
    # drafts checked beside prefill chunks, rolled back, preempted and aborted mid-check; the clean
    # run below decodes without speculation, so every good request must match it token for token
    "speculative-ngram-preempting": dict(
        block_size=4, num_kv_blocks=20, max_num_batched_tokens=24, max_num_seqs=6,
        speculative_config=dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                prompt_lookup_max=3)),
}
PERIOD = {"speculative-ngram-preempting": 5}  # FakeExecutor output that repeats: drafts accepted


def bad_request(rng: random.Random, engine: LLMEngine, live: list[str]):
    """(param the refusal must name, a call that makes the bad request)."""
    ok = [1, 2, 3]
    mutated = SamplingParams()
    mutated.seed = "x"  # changed after it was checked: add_request checks its own copy
    cases = [
        ("prompt", lambda: engine.add_request([])),
        ("prompt", lambda: engine.add_request([1, 2.5])),
        ("prompt", lambda: engine.add_request([True, 2])),
        ("prompt", lambda: engine.add_request([1, VOCAB])),
        ("prompt", lambda: engine.add_request("some text")),
        ("prompt", lambda: engine.add_request([7] * (engine.max_model_len + 1))),
        ("seed", lambda: engine.add_request(ok, mutated)),
        ("seed", lambda: engine.add_request(ok, SamplingParams(seed="x"))),
        ("temperature", lambda: engine.add_request(ok, SamplingParams(temperature=float("nan")))),
        ("stop_token_ids", lambda: engine.add_request(ok, SamplingParams(stop_token_ids=5))),
        ("stop_token_ids", lambda: engine.add_request(ok, SamplingParams(stop_token_ids=[VOCAB]))),
        ("max_tokens", lambda: engine.add_request(ok, SamplingParams(max_tokens=10_000))),
        ("sampling_params", lambda: engine.add_request(ok, {"max_tokens": 4})),
    ]
    if live:
        rid = rng.choice(live)
        cases.append(("request_id", lambda: engine.add_request(ok, request_id=rid)))
    return rng.choice(cases)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fuzz_engine_never_loses_or_changes_a_good_request(name, seed):
    rng = random.Random(f"{name}-{seed}")
    config = EngineConfig(**CONFIGS[name])
    executor = FakeExecutor(vocab_size=VOCAB, block_size=config.block_size, period=PERIOD.get(name))
    engine = LLMEngine.from_executor(executor, config)
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 20))] for _ in range(4)]
    requests, final, aborted, injected = {}, {}, set(), set()
    step_failures = 0

    def collect(outs):
        for o in outs:
            if o.finished:
                assert o.request_id not in final, f"{o.request_id} finished twice"
                final[o.request_id] = o

    def add_good():  # 1-3 requests sharing a prefix (at times a new one): some share a step
        prefix = rng.choice(prefixes + [[rng.randrange(1, VOCAB) for _ in range(20)]])
        for _ in range(rng.choice([1, 1, 2, 3])):
            prompt = prefix[:rng.randint(1, 20)] + [rng.randrange(1, VOCAB)
                                                    for _ in range(rng.randint(0, 12))]
            params = SamplingParams(max_tokens=rng.randint(1, 12), temperature=rng.choice([0, 0.7]),
                                    top_k=rng.choice([-1, 0, 5]), ignore_eos=rng.random() < 0.5,
                                    stop_token_ids=rng.sample(range(1, 100), rng.choice([0, 0, 3])))
            rid = engine.add_request(prompt, params)
            requests[rid] = (prompt, params)

    while engine.num_steps < STEPS or engine.has_unfinished():
        assert engine.num_steps < 20 * STEPS, "the workload does not drain"
        live = list(engine.requests)
        action = rng.random() if engine.num_steps < STEPS else 1.0
        if action < 0.25:
            add_good()
        elif action < 0.35:
            param, make = bad_request(rng, engine, live)
            before = (list(engine.requests), engine.kv_manager.num_free_blocks)
            with pytest.raises(InvalidRequest) as err:
                make()
            assert err.value.param == param, f"{err.value} names {err.value.param!r}, not {param!r}"
            assert (list(engine.requests), engine.kv_manager.num_free_blocks) == before
        elif action < 0.40 and live:
            rid = rng.choice(live)
            collect([engine.abort(rid)])
            aborted.add(rid)
        elif action < 0.45 and live:
            rid = rng.choice(live)
            executor.fail[rid] = rng.choice(["before", "sample"])
            injected.add(rid)
        elif action < 0.47 and live:
            executor.fail_step = True
            step_failures += 1
        collect(engine.step())
        engine.kv_manager.check_invariants()
        engine.scheduler.check_invariants()

    assert engine.num_steps >= 1000
    assert_no_leaks(engine)
    assert not executor.kv_errors, executor.kv_errors[:3]
    assert set(final) == set(requests), "a request never finished"
    assert set(executor.finished) >= set(final), "the executor was not told a request left"
    normal = {}
    for rid, o in final.items():
        if o.finish_reason == "abort":
            assert rid in aborted
        elif o.finish_reason == "error":
            assert o.error and (rid in injected or o.error.startswith("the step failed")), o.error
        else:
            assert o.finish_reason in ("length", "stop") and o.error is None
            normal[rid] = o
    stats = engine.stats
    assert stats.failed_requests == sum(o.finish_reason == "error" for o in final.values())
    assert len(normal) > len(requests) // 3, "too few requests finished normally to compare"
    assert step_failures and any(o.finish_reason == "error" for o in final.values())
    if config.speculative_config is not None:
        assert stats.spec_decode_num_accepted_tokens > 0 and stats.preemptions > 0
        assert stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens

    clean = LLMEngine.from_executor(FakeExecutor(vocab_size=VOCAB, block_size=config.block_size,
                                                 period=PERIOD.get(name)),
                                    dataclasses.replace(config, speculative_config=None))
    for rid in normal:
        clean.add_request(*requests[rid], request_id=rid)
    want = {}
    while clean.has_unfinished():
        want.update({o.request_id: o for o in clean.step() if o.finished})
    for rid, o in normal.items():
        assert (o.token_ids, o.finish_reason) == (want[rid].token_ids, want[rid].finish_reason), rid
