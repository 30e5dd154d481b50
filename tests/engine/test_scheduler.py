"""Scheduling: greedy output never depends on chunking, prefix-cache hits, preemption or policy;
scheduler invariants hold on random workloads (hypothesis)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams
from tests.conftest import FakeExecutor, assert_no_leaks

G = torch.Generator().manual_seed(0)
SYSTEM = torch.randint(0, 512, (24,), generator=G).tolist()  # a shared "system prompt" (6 blocks of 4)
PROMPTS = [
    torch.randint(0, 512, (n,), generator=G).tolist() for n in (3, 17, 40, 8, 1, 33)
] + [SYSTEM + [7, 8, 9], SYSTEM + [7, 8, 10, 11], SYSTEM, SYSTEM[:16]]  # 24 and 16: multiples of block_size
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def reference(hf_models):
    """HF transformers' greedy continuation of every prompt (fp32, CPU)."""
    hf, folder = hf_models("llama")
    refs = []
    for p in PROMPTS:
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                              do_sample=False)
        refs.append(out[0, len(p):].tolist())
    return folder, refs


CONFIGS = {
    "chunk8": dict(max_num_batched_tokens=8),
    "chunk13": dict(max_num_batched_tokens=13),
    "chunk64-no-prefix-cache": dict(max_num_batched_tokens=64, enable_prefix_caching=False),
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=32),
    "no-chunking-prefill-priority": dict(enable_chunked_prefill=False, max_num_batched_tokens=32,
                                         priority="prefill"),
    "static": dict(scheduling_policy="static", max_num_seqs=3, max_num_batched_tokens=16),
    "heavy-preemption": dict(num_kv_blocks=16, max_num_batched_tokens=16),
    "seq-cap-2-partial-cap-1": dict(max_num_seqs=2, max_num_partial_prefills=1, max_num_batched_tokens=10),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_output_is_independent_of_scheduling(reference, name):
    folder, refs = reference
    kw = dict(block_size=4, num_kv_blocks=256) | CONFIGS[name]
    llm = LLM(folder, config=EngineConfig(**kw))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    # twice: the second round hits the prefix cache for every prompt
    for round_ in range(2):
        outs = llm.generate(PROMPTS, params)
        for p, o, ref in zip(PROMPTS, outs, refs):
            assert o.token_ids == ref, f"{name} round {round_}: prompt of {len(p)} tokens differs from HF"
    st_ = llm.engine.stats
    if name == "heavy-preemption":
        assert st_.preemptions > 0
    if kw.get("enable_prefix_caching", True):
        assert st_.cached_prompt_tokens > 0
        assert any(o.num_cached_tokens > 0 for o in outs)
    assert_no_leaks(llm.engine)


def fake_engine(**kw):
    """The real scheduler and KV manager with a model-free executor (fast, for property tests)
    that checks every KV read."""
    executor = FakeExecutor(block_size=kw.get("block_size", EngineConfig.block_size))
    return LLMEngine.from_executor(executor, EngineConfig(**kw)), executor.steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 20), st.integers(0, 5)), min_size=1,
                  max_size=12),
    block_size=st.sampled_from([1, 4, 16]),
    budget=st.integers(4, 64),
    max_num_seqs=st.integers(1, 8),
    chunked=st.booleans(),
    caching=st.booleans(),
    policy=st.sampled_from(["continuous", "static"]),
    priority=st.sampled_from(["decode", "prefill"]),
    spare_blocks=st.integers(0, 40),
    shared=st.booleans(),
)
def test_scheduler_invariants_on_random_workloads(lens, block_size, budget, max_num_seqs, chunked, caching,
                                                  policy, priority, spare_blocks, shared):
    longest = max(p + o for p, o, _ in lens)
    num_blocks = -(-longest // block_size) + spare_blocks
    eng, steps = fake_engine(block_size=block_size, num_kv_blocks=num_blocks, max_num_batched_tokens=budget,
                             max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked,
                             enable_prefix_caching=caching, scheduling_policy=policy, priority=priority)
    now = [0.0]
    eng.clock = lambda: now[0]
    prefix = list(range(50, 80))
    want = {}
    for i, (p, o, arrive) in enumerate(lens):
        prompt = (prefix[:p] if shared else []) + [(i * 7 + j) % 90 + 5 for j in range(p)]
        prompt = prompt[:max(p, 1)]
        rid = eng.add_request(prompt, SamplingParams(max_tokens=o, ignore_eos=True),
                              arrival_time=float(arrive))
        want[rid] = o
    done = {}
    for _ in range(10_000):
        if not eng.has_unfinished():
            break
        n_before = len(steps)
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
        if len(steps) > n_before:
            out = steps[-1]
            lone_prompt = not chunked and len(out.seqs) == 1 and not out.seqs[0].is_decode
            assert out.num_scheduled_tokens <= budget or lone_prompt, "token budget exceeded"
            assert len(out.seqs) <= max_num_seqs and len(eng.scheduler.running) <= max_num_seqs
            assert len({s.request_id for s in out.seqs}) == len(out.seqs)
        eng.kv_manager.check_invariants()
        eng.scheduler.check_invariants()
        now[0] += 1.0
    assert not eng.has_unfinished(), "workload did not finish"
    assert {rid: len(o.token_ids) for rid, o in done.items()} == want
    assert all(o.finish_reason == "length" for o in done.values())
    assert not eng.executor.kv_errors, eng.executor.kv_errors[:3]
    assert_no_leaks(eng)


def test_shared_prefix_cuts_prefill_by_the_shared_fraction():
    prefix = list(range(10, 10 + 96))  # 96 shared tokens = 6 blocks of 16
    prompts = [prefix + [200 + i, 300 + i] for i in range(8)]
    computed = {}
    for caching in (False, True):
        eng, _ = fake_engine(block_size=16, num_kv_blocks=200, enable_prefix_caching=caching)
        for p in prompts:
            eng.add_request(p, SamplingParams(max_tokens=2, ignore_eos=True))
            while eng.has_unfinished():  # one after another, as a chat service would see them
                eng.step()
        computed[caching] = eng.stats.prefill_tokens_computed
    total = sum(map(len, prompts))
    shared_fraction = 96 * 7 / total  # every prompt after the first finds the prefix cached
    assert computed[False] == total
    assert computed[True] <= total * (1 - shared_fraction) + 1e-9


def test_long_prompt_with_chunking_never_exceeds_budget_and_without_it_stalls_decodes():
    for chunked in (True, False):
        eng, steps = fake_engine(block_size=16, num_kv_blocks=400, max_num_batched_tokens=64,
                                 enable_chunked_prefill=chunked)
        now = [0.0]
        eng.clock = lambda: now[0]
        for i in range(4):
            eng.add_request([5 + i] * 8, SamplingParams(max_tokens=40, ignore_eos=True), arrival_time=0.0)
        eng.add_request(list(range(5, 5 + 1000)), SamplingParams(max_tokens=4, ignore_eos=True),
                        arrival_time=5.0)
        while eng.has_unfinished():
            eng.step()
            now[0] += 1.0
        sizes = [o.num_scheduled_tokens for o in steps]
        if chunked:
            assert max(sizes) <= 64
            # decodes keep flowing in every step the long prompt is being prefilled
            assert all(o.num_decode_tokens > 0 for o in steps if o.num_prefill_tokens > 100 // 2)
        else:
            assert max(sizes) == 1000  # the whole prompt in one step, alone
            lone = [o for o in steps if o.num_prefill_tokens == 1000]
            assert lone[0].num_decode_tokens == 0  # every decoder stalled for that step
