"""Exercise 4 (continuous batching, no chunking): one test or more per rule of the exercise's
docstring, each naming its rule when it fails (test_exercise_guards.py checks that every rule has
a test here and a mutant that breaks it).

Most tests plug the student's ContinuousScheduler into LLMEngine(scheduler_cls=...) or
LLM(scheduler=...) and check what the engine did: greedy outputs, the step trace, the blocks.
Rules 4 and 5 are checked on exact scenarios, the scheduler driven on its own.
"""

import pytest
from exercise_checks import (
    TickClock,
    appearances,
    assert_limits,
    assert_no_leaks,
    assert_same_outputs,
    drive,
    make_engine,
    preempted_at,
    time_limit,
    workload,
)
from scheduler_scenarios import (
    assert_no_admission_after_preemption,
    assert_preempts_the_newest,
    out_of_blocks,
)

from nanoserve import LLM, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def ex(load):
    return load("ex04_scheduler")


@pytest.fixture(scope="module")
def scheduler(ex):
    return ex.ContinuousScheduler


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_outputs_match_builtin_scheduler(scheduler, seed):
    reqs = workload(seed, num_requests=10, prompt_lens=(3, 40), max_tokens=(1, 10))
    engine = make_engine(scheduler)
    outs = drive(engine, reqs)
    assert_same_outputs(outs, reqs)
    assert_no_leaks(engine)


def test_plugs_into_LLM_generate(scheduler):
    prompts = [list(range(1, 20)), list(range(30, 37)), list(range(5, 45))]
    cfg = EngineConfig(block_size=8, num_kv_blocks=32, max_num_seqs=2, max_num_batched_tokens=48,
                       enable_chunked_prefill=False)
    params = SamplingParams(max_tokens=5, temperature=0.0)
    llm = LLM("preset:tiny", device="cpu", dtype="float32", config=cfg, scheduler=scheduler,
              clock=TickClock())
    with time_limit(60, "LLM.generate with your scheduler"):
        got = [o.token_ids for o in llm.generate(prompts, params)]
    builtin = LLM("preset:tiny", device="cpu", dtype="float32", config=cfg)
    want = [o.token_ids for o in builtin.generate(prompts, params)]
    assert got == want, f"LLM(..., scheduler=yours).generate gave {got}, the built-in scheduler {want}"
    assert_no_leaks(llm.engine)


@pytest.mark.parametrize("budget, seats", [(48, 4), (20, 2), (64, 8)])
def test_budget_and_seats_respected(scheduler, budget, seats):
    """Rules 1 and 2."""
    reqs = workload(5, num_requests=12, prompt_lens=(2, 20), max_tokens=(1, 8), arrival_gap=1)
    engine = make_engine(scheduler, max_num_batched_tokens=budget, max_num_seqs=seats)
    drive(engine, reqs)
    assert_limits(engine, rules=("rule 1: ", "rule 2: "))


def test_running_requests_decode_every_step(scheduler):
    """Rule 3: running requests are served before admissions, so a new prompt never stalls a decode."""
    reqs = workload(7, num_requests=10, prompt_lens=(10, 16), max_tokens=(3, 9), arrival_gap=4)
    engine = make_engine(scheduler, max_num_batched_tokens=16, max_num_seqs=4)
    drive(engine, reqs)
    pre = preempted_at(engine)
    for rid, seen in appearances(engine).items():
        steps = [i for i, _, _ in seen]
        gaps = [(a, b) for a, b in zip(steps, steps[1:]) if b != a + 1
                and not any(a <= p < b for p in pre.get(rid, []))]
        assert not gaps, (f"rule 3: request {rid} ran in step {gaps[0][0]} and next in step {gaps[0][1]}: "
                          f"running requests are served every step, before any admission")


def test_preempts_the_newest_request(scheduler):
    """Rule 4: A gets the free block, B gets C's (C is the newest, preempted), C is not served."""
    assert_preempts_the_newest(out_of_blocks(scheduler))


def test_no_admission_in_a_step_that_preempted(scheduler):
    """Rule 5: after preempting C, the step admits nobody (C, back at the queue's head, nor D)."""
    assert_no_admission_after_preemption(out_of_blocks(scheduler))


def test_admits_in_arrival_order(scheduler):
    """Rule 6: first come, first served."""
    reqs = workload(11, num_requests=12, prompt_lens=(4, 30), max_tokens=(1, 6), arrival_gap=2)
    engine = make_engine(scheduler, max_num_batched_tokens=32, max_num_seqs=3)
    outs = drive(engine, reqs)
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i][2], i))
    firsts = [outs[i].metrics.first_scheduled_time for i in order]
    for (i, fi), (j, fj) in zip(zip(order, firsts), zip(order[1:], firsts[1:])):
        assert fi <= fj, (f"rule 6: request {j} (arrived at {reqs[j][2]}) was admitted at {fj}, before "
                          f"request {i} (arrived at {reqs[i][2]}) at {fi}: first come, first served")


def test_reuses_cached_prefix_at_admission(scheduler):
    """Rule 7."""
    prefix = list(range(100, 132))  # 4 full blocks of 8
    reqs = ((tuple(prefix + [7, 8, 9]), 2, 0), (tuple(prefix + [1, 2, 3, 4, 5]), 2, 40))
    engine = make_engine(scheduler)
    outs = drive(engine, reqs)
    b = outs[1]
    assert b.num_cached_tokens == 32, (
        f"rule 7: the second request shares a 32-token prefix with a finished one but got "
        f"{b.num_cached_tokens} cached tokens: use kv.get_computed_blocks at admission")
    prefill = [n for _, kind, n in appearances(engine)[b.request_id] if kind == "prefill"]
    assert prefill == [5], f"rule 7: only the 5 uncached tokens should be computed, got {prefill}"
    assert_same_outputs(outs, reqs)


def test_prompts_are_admitted_whole(scheduler):
    """Rule 8: no chunking (prompts arrive close enough together to compete for a step's budget)."""
    reqs = workload(1, num_requests=10, prompt_lens=(3, 40), max_tokens=(2, 6))
    engine = make_engine(scheduler)
    outs = drive(engine, reqs)
    for o in outs:
        prefills = [(i, n) for i, kind, n in appearances(engine)[o.request_id] if kind == "prefill"]
        assert len(prefills) == 1, (
            f"rule 8: request {o.request_id} was prefilled in {len(prefills)} steps {prefills}: without "
            f"chunked prefill a prompt runs in one step")
        n = len(o.prompt_token_ids) - o.num_cached_tokens
        assert prefills[0][1] == n, (
            f"rule 8: request {o.request_id}: prefill of {prefills[0][1]} tokens, expected {n} (prompt "
            f"{len(o.prompt_token_ids)} minus {o.num_cached_tokens} cached)")


def test_admits_as_soon_as_a_seat_frees(scheduler):
    """Rule 8: continuous, not static, batching: C takes A's seat the step after A finishes."""
    reqs = ((tuple(range(1, 9)), 2, 0), (tuple(range(20, 29)), 12, 0), (tuple(range(40, 47)), 4, 0))
    engine = make_engine(scheduler, max_num_seqs=2)
    outs = drive(engine, reqs)
    seen = appearances(engine)
    a, c = outs[0].request_id, outs[2].request_id
    a_last, c_first = seen[a][-1][0], seen[c][0][0]
    assert c_first == a_last + 1, (
        f"rule 8: A finished in step {a_last} but waiting C was admitted only in step {c_first}: a freed "
        f"seat goes to the next waiting request at once")


def test_preempts_when_blocks_run_out(scheduler):
    """Rule 4 in the engine: 12 blocks of 4 tokens can't hold four 30-token requests: preempt,
    recompute, same output."""
    reqs = tuple((tuple(range(10 * i + 1, 10 * i + 11)), 20, i) for i in range(5))
    engine = make_engine(scheduler, block_size=4, num_kv_blocks=12, max_num_seqs=4)
    outs = drive(engine, reqs)
    assert_same_outputs(outs, reqs)
    assert_limits(engine, rules=("rule 1: ", "rule 2: "))
    assert_no_leaks(engine)


def test_all_blocks_return_to_the_pool(scheduler):
    reqs = workload(9, num_requests=8, prompt_lens=(1, 30), max_tokens=(1, 12))
    engine = make_engine(scheduler, num_kv_blocks=40)
    drive(engine, reqs)
    assert_no_leaks(engine)
