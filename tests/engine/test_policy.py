"""Each scheduling policy (engine/policy.py) on exact scenarios, the Scheduler driven alone (no model):
which requests run in which step, with how many tokens."""

from __future__ import annotations

import pytest

from nanoserve import EngineConfig, SamplingParams
from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.policy import (
    ContinuousBatching,
    PrefillFirstBatching,
    StaticBatching,
    WholePromptBatching,
)
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler


def run(prompts, steps, **config):
    """prompts: name -> (prompt length, max_tokens, arrival). -> the policy and, per step,
    [(name, tokens scheduled)]."""
    cfg = EngineConfig(**{**dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=8,
                                 enable_prefix_caching=False), **config})
    sched = Scheduler(cfg, KVCacheManager(cfg.num_kv_blocks, cfg.block_size, enable_caching=False))
    for i, (name, (n, max_tokens, arrival)) in enumerate(prompts.items()):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sched.add_request(Request(name, list(range(10 * i + 1, 10 * i + 1 + n)), params, arrival,
                                  max_len=64))
    trace = []
    for now in range(steps):
        out = sched.schedule(float(now))
        trace.append([(s.request_id, len(s.token_ids)) for s in out.seqs])
        sched.update_from_output(out, {s.request_id: 1 for s in out.seqs if s.sample}, float(now))
        sched.check_invariants()
    return sched.policy, trace


def test_continuous_chunks_a_prompt_to_the_budget_left():
    policy, trace = run({"A": (4, 4, 0), "B": (10, 4, 0)}, 3)
    assert isinstance(policy, ContinuousBatching) and policy.name == "continuous"
    assert trace == [[("A", 4), ("B", 4)], [("A", 1), ("B", 6)], [("A", 1), ("B", 1)]]


def test_whole_prompt_gives_a_prompt_past_the_budget_a_step_alone():
    policy, trace = run({"A": (4, 4, 0), "B": (10, 4, 0)}, 3, enable_chunked_prefill=False)
    assert type(policy) is WholePromptBatching
    # step 0: B (10 tokens) does not fit beside A; step 1: B runs alone, A's decode waits
    assert trace == [[("A", 4)], [("B", 10)], [("A", 1), ("B", 1)]]


def test_prefill_first_admits_before_serving_running_requests():
    prompts = {"A": (4, 4, 0), "B": (3, 4, 1)}
    policy, trace = run(prompts, 3, enable_chunked_prefill=False, priority="prefill")
    assert type(policy) is PrefillFirstBatching
    assert trace == [[("A", 4)], [("B", 3)], [("A", 1), ("B", 1)]]
    _, decode_first = run(prompts, 3, enable_chunked_prefill=False)
    assert decode_first[1] == [("A", 1), ("B", 3)]


@pytest.mark.parametrize("chunked", [True, False])
def test_static_admits_nobody_until_the_batch_has_finished(chunked):
    # A finishes at its first token; B decodes 3 steps; C waits for the whole batch to end
    prompts = {"A": (4, 1, 0), "B": (4, 3, 0), "C": (4, 2, 0)}
    policy, trace = run(prompts, 5, max_num_seqs=2, scheduling_policy="static",
                        enable_chunked_prefill=chunked)
    assert isinstance(policy, StaticBatching) and policy.name.startswith("static")
    assert trace == [[("A", 4), ("B", 4)], [("B", 1)], [("B", 1)], [("C", 4)], [("C", 1)]]
    _, continuous = run(prompts, 2, max_num_seqs=2, enable_chunked_prefill=chunked)
    assert continuous[1] == [("B", 1), ("C", 4)]  # the freed seat is taken at once
