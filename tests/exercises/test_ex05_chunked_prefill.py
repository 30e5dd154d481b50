"""Exercise 5 (chunked prefill), run inside the real engine with enable_chunked_prefill=True."""

import pytest
from exercise_checks import (
    appearances,
    assert_limits,
    assert_no_leaks,
    assert_same_outputs,
    drive,
    make_engine,
    preempted_at,
    workload,
)
from scheduler_scenarios import (
    assert_no_admission_after_preemption,
    assert_preempts_the_newest,
    out_of_blocks,
)

CHUNKED = dict(enable_chunked_prefill=True, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def scheduler(load):
    return load("ex05_chunked_prefill").ChunkedScheduler


@pytest.mark.parametrize("seed", [0, 1])
def test_long_prompts_match_builtin_scheduler(scheduler, seed):
    reqs = workload(seed, num_requests=8, prompt_lens=(1, 90), max_tokens=(1, 8))
    engine = make_engine(scheduler, **CHUNKED)
    outs = drive(engine, reqs)
    assert_same_outputs(outs, reqs)
    assert_no_leaks(engine)


@pytest.mark.parametrize("budget, seats", [(16, 4), (7, 2), (32, 8)])
def test_budget_and_seats_respected(scheduler, budget, seats):
    reqs = workload(4, num_requests=10, prompt_lens=(1, 60), max_tokens=(1, 6), arrival_gap=1)
    engine = make_engine(scheduler, enable_chunked_prefill=True, max_num_batched_tokens=budget,
                         max_num_seqs=seats)
    drive(engine, reqs)
    assert_limits(engine)


def test_chunks_fill_the_budget(scheduler):
    """A prompt is cut only where the step's budget runs out: every step with a partial chunk is full."""
    reqs = workload(6, num_requests=8, prompt_lens=(20, 70), max_tokens=(2, 6), arrival_gap=2)
    engine = make_engine(scheduler, **CHUNKED)
    drive(engine, reqs)
    budget = engine.config.max_num_batched_tokens
    pre = preempted_at(engine)
    chunks = 0
    for rid, seen in appearances(engine).items():
        for (i, kind, n), (j, next_kind, _) in zip(seen, seen[1:]):
            if kind == next_kind == "prefill" and not any(i <= p <= j for p in pre.get(rid, [])):
                chunks += 1
                assert engine.trace[i].num_tokens == budget, (
                    f"rules 3 and 8: step {i} cut request {rid}'s prompt after {n} tokens, but the step "
                    f"held {engine.trace[i].num_tokens} tokens of its {budget}-token budget: cut a prompt "
                    f"only where the budget runs out, n = min(tokens still needed, budget left)")
    assert chunks, "no prompt was split into chunks, though prompts are longer than the budget"


def test_prefill_continues_next_to_decodes(scheduler):
    """While a long prompt is chunked, requests already decoding keep getting tokens."""
    reqs = ((tuple(range(1, 6)), 12, 0), (tuple(range(10, 100)), 2, 2))
    engine = make_engine(scheduler, **CHUNKED)
    outs = drive(engine, reqs)
    a, b = (o.request_id for o in outs)
    seen = appearances(engine)
    b_prefill = [i for i, kind, _ in seen[b] if kind == "prefill"]
    a_steps = {i for i, _, _ in seen[a]}
    assert len(b_prefill) >= 5, f"a 90-token prompt at budget 16 ran in {len(b_prefill)} steps"
    stalled = [i for i in b_prefill if i not in a_steps and i <= seen[a][-1][0]]
    assert not stalled, f"request A got no token in steps {stalled} while B's prompt was prefilled"
    assert_same_outputs(outs, reqs)


def test_preemption_with_chunks(scheduler):
    reqs = tuple((tuple(range(20 * i + 1, 20 * i + 31)), 14, i) for i in range(5))
    engine = make_engine(scheduler, block_size=4, num_kv_blocks=14, max_num_seqs=4, **CHUNKED)
    outs = drive(engine, reqs)
    assert_same_outputs(outs, reqs)
    assert_limits(engine)
    assert_no_leaks(engine)


def test_preempts_the_newest_request(scheduler):
    """Exercise 4's rule 4, chunking on: A gets the free block, B gets C's (C is the newest)."""
    assert_preempts_the_newest(out_of_blocks(scheduler, enable_chunked_prefill=True))


def test_no_admission_in_a_step_that_preempted(scheduler):
    """Exercise 4's rule 5, chunking on: after preempting C the step admits nobody."""
    assert_no_admission_after_preemption(out_of_blocks(scheduler, enable_chunked_prefill=True))


def test_reuses_cached_prefix(scheduler):
    prefix = list(range(200, 240))  # 5 full blocks of 8
    reqs = ((tuple(prefix + [1, 2]), 2, 0), (tuple(prefix + [3, 4, 5, 6, 7, 8]), 2, 40))
    engine = make_engine(scheduler, **CHUNKED)
    outs = drive(engine, reqs)
    assert outs[1].num_cached_tokens == 40, (
        f"the second request shares 40 tokens with a finished one, got {outs[1].num_cached_tokens} cached")
    computed = sum(n for _, kind, n in appearances(engine)[outs[1].request_id] if kind == "prefill")
    assert computed == 6, f"only the 6 uncached prompt tokens should be computed, got {computed}"
    assert_same_outputs(outs, reqs)
