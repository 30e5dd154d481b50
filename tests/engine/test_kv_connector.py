"""Disaggregated prefill/decode in one process, through the real connector and real shared-memory
segments: greedy output equals colocated serving and HF transformers token for token (fp32, CPU)
on mixed prompts (block-boundary lengths, shared prefixes), prefix caching keeps working on both
sides, and every failure fails only its own request, frees its blocks and leaves no segment."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
import torch

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams
from nanoserve.engine import kv_transport
from nanoserve.errors import InvalidRequest
from tests.conftest import assert_no_leaks
from tests.engine.disagg_engines import GREEDY, corrupt, decode, engine, prefill, run, segments

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model(hf_models):
    return hf_models("llama")


@pytest.fixture(scope="module")
def pair(model):
    """A prefill and a decode engine of the tiny HF llama; fresh prefix caches per test."""
    _, folder = model
    p, d = engine(folder, "kv_producer"), engine(folder, "kv_consumer")
    yield p, d
    p.shutdown()
    d.shutdown()


@pytest.fixture
def fresh(pair):
    """The module's engines with empty prefix caches and no leftovers; checks no leak after."""
    p, d = (LLMEngine.from_executor(e.executor, replace(e.config),
                                    kv_transfer_config=e.kv_connector.config) for e in pair)
    yield p, d
    for e in (p, d):
        assert_no_leaks(e)
        e.shutdown()
    assert not segments(), f"segments left behind: {segments()}"


def prompts_mixed() -> list[list[int]]:
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(10, 500) for _ in range(n)]  # noqa: E731
    shared = ids(32)
    return [ids(15), ids(16), ids(17), ids(32), ids(3), ids(47),
            shared + ids(5), shared + ids(16), shared[:20] + ids(9)]


def colocated(folder, prompts, max_tokens=MAX_TOKENS) -> list[list[int]]:
    llm = LLM(folder, "cpu", "float32", config=EngineConfig(block_size=16, num_kv_blocks=96))
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, **GREEDY))]


def test_disaggregated_equals_colocated_equals_hf(model, fresh):
    hf, folder = model
    p, d = fresh
    prompts = prompts_mixed()
    outs = decode(d, prompts, prefill(p, prompts), MAX_TOKENS)
    got = [o.token_ids for o in outs]
    assert got == colocated(folder, prompts)
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              min_new_tokens=MAX_TOKENS)
        assert tokens == ref[0, len(prompt):].tolist(), f"prompt of {len(prompt)} tokens"
    # prefix caching on both sides: the shared prefix (32 tokens, then 16) computed once, sent once
    assert p.stats.cached_prompt_tokens == d.stats.cached_prompt_tokens == 32 + 16
    assert d.stats.prefill_tokens_computed == 0, "the decode engine recomputed a prompt"
    assert d.stats.transferred_prompt_tokens == sum(map(len, prompts)) - d.stats.cached_prompt_tokens


def test_a_prompt_the_decode_engine_has_cached_loads_nothing(model, fresh):
    p, d = fresh
    prompt = prompts_mixed()[3]  # 32 tokens: two full blocks
    first = decode(d, [prompt], prefill(p, [prompt]), MAX_TOKENS)[0]
    loads = d.executor.kv_connector.stats.loads
    again = decode(d, [prompt], prefill(p, [prompt]), MAX_TOKENS)[0]
    assert again.token_ids == first.token_ids
    assert d.executor.kv_connector.stats.loads == loads, "a fully cached prompt was loaded again"
    assert again.num_cached_tokens == 32 and p.stats.cached_prompt_tokens >= 16


def test_preempted_after_its_load_it_is_recomputed(model):
    """A decode engine short of blocks preempts requests that loaded their KV: they recompute
    their prompt (the segment is gone) and still give the same tokens."""
    _, folder = model
    p, d = engine(folder, "kv_producer"), engine(folder, "kv_consumer", num_kv_blocks=10)
    try:
        rng = random.Random(1)
        prompts = [[rng.randrange(10, 500) for _ in range(20)] for _ in range(6)]
        outs = decode(d, prompts, prefill(p, prompts), 30)
        assert d.stats.preemptions > 0 and d.stats.prefill_tokens_computed > 0
        assert [o.token_ids for o in outs] == colocated(folder, prompts, 30)
        assert_no_leaks(d)
    finally:
        p.shutdown()
        d.shutdown()
    assert not segments()


def test_a_corrupted_transfer_fails_only_its_request(model, fresh):
    """A's segment is corrupted; B shares A's first two blocks and takes them as prefix-cache
    hits in the same step. A fails with an error naming the corruption; B, which would have read
    blocks A's load never filled, is recomputed and gives the right tokens."""
    _, folder = model
    p, d = fresh
    a, b = prompts_mixed()[6], prompts_mixed()[7]
    handoffs = prefill(p, [a, b])
    corrupt(handoffs[0]["kv_handle"])
    outs = decode(d, [a, b], handoffs, MAX_TOKENS)
    assert outs[0].finish_reason == "error" and "corrupted" in outs[0].error, outs[0]
    assert outs[1].token_ids == colocated(folder, [b])[0]
    assert d.stats.preemptions >= 1 and d.stats.failed_requests == 1
    assert d.executor.kv_connector.stats.failed_loads == 1


def test_a_segment_gone_before_the_load_fails_its_request(model, fresh):
    p, d = fresh
    prompt, other = prompts_mixed()[0], prompts_mixed()[1]
    handoffs = prefill(p, [prompt, other])
    ids = [d.add_request(x, SamplingParams(max_tokens=4, **GREEDY), kv_transfer_params=h)
           for x, h in zip((prompt, other), handoffs)]
    assert kv_transport.unlink(handoffs[0]["kv_handle"])
    outs, _ = run(d)
    assert outs[ids[0]].finish_reason == "error" and "not found" in outs[ids[0]].error
    assert outs[ids[1]].finish_reason == "length"


@pytest.mark.parametrize("change, param, match", [
    (lambda h: h.update(kv_handle="nskv1_2_abcdef"), "kv_transfer_params", "not found"),
    (lambda h: h.update(kv_handle="/etc/passwd"), "kv_transfer_params", "not a nanoserve KV segment"),
    (lambda h: h.update(output_token_ids=[]), "kv_transfer_params", "output_token_ids"),
    (lambda h: h.update(output_token_ids=[99999]), "kv_transfer_params", "output_token_ids"),
    (lambda h: h.update(output_token_ids=[1] * 10), "max_tokens", "nothing to decode"),
])
def test_bad_hand_offs_are_refused_before_anything_is_queued(fresh, change, param, match):
    p, d = fresh
    prompt = prompts_mixed()[2]
    handoff = prefill(p, [prompt])[0]
    bad = dict(handoff)
    change(bad)
    with pytest.raises(InvalidRequest, match=match) as e:
        d.add_request(prompt, SamplingParams(max_tokens=10, **GREEDY), kv_transfer_params=bad)
    assert e.value.param == param and not d.has_unfinished()
    with pytest.raises(InvalidRequest, match="another prompt"):
        d.add_request(prompt[:-1], SamplingParams(max_tokens=10), kv_transfer_params=handoff)
    d.add_request(prompt, SamplingParams(max_tokens=4), kv_transfer_params=handoff)
    d.abort(next(iter(d.requests)))  # aborted before it loaded: its segment goes with it
    assert not d.has_unfinished()


def test_roles_and_max_tokens_are_checked(model, fresh):
    _, folder = model
    p, d = fresh
    with pytest.raises(InvalidRequest, match="max_tokens=1") as e:
        p.add_request([5, 6, 7], SamplingParams(max_tokens=2), kv_transfer_params={"do_remote_decode": True})
    assert e.value.param == "max_tokens"
    with pytest.raises(InvalidRequest, match="not a KV producer"):
        d.add_request([5, 6, 7], SamplingParams(max_tokens=1), kv_transfer_params={"do_remote_decode": True})
    with pytest.raises(InvalidRequest, match="not a KV consumer"):
        p.add_request([5, 6, 7], SamplingParams(max_tokens=2), kv_transfer_params={"do_remote_prefill": True})
    with pytest.raises(InvalidRequest, match="no KV connector"):
        LLM(folder, config=EngineConfig(num_kv_blocks=16)).engine.add_request(
            [5, 6], SamplingParams(max_tokens=1), kv_transfer_params={"do_remote_decode": True})
    with pytest.raises(InvalidRequest, match="kv_role='prefill'"):
        engine(folder, "prefill")


def test_the_producer_drops_what_nobody_fetches_and_bounds_what_it_holds(model):
    _, folder = model
    nbytes = 2 * 2 * 16 * 2 * 16 * 4  # 16 tokens of K and V: 2 layers, 2 kv heads, head_dim 16, fp32
    p = engine(folder, "kv_producer", abort_request_timeout=1.0, kv_buffer_size=1.5 * nbytes)
    try:
        rng = random.Random(2)
        a, b, c = ([rng.randrange(10, 500) for _ in range(16)] for _ in range(3))
        first = prefill(p, [a])[0]
        time.sleep(1.2)  # past abort_request_timeout: the next save drops it
        prefill(p, [b])
        assert not kv_transport.exists(first["kv_handle"]) and p.executor.kv_connector.stats.expired == 1
        rid = p.add_request(c, SamplingParams(max_tokens=1, **GREEDY),
                            kv_transfer_params={"do_remote_decode": True})
        outs, handoffs = run(p)  # b's KV is still waiting: c does not fit in kv_buffer_size
        assert outs[rid].finish_reason == "error" and "buffer is full" in outs[rid].error
        assert not handoffs and len(segments()) == 1
        assert_no_leaks(p)
    finally:
        p.shutdown()
    assert not segments(), "shutdown left a segment"


def test_a_hand_off_ended_at_its_first_token_leaves_nothing(model, fresh):
    p, d = fresh
    prompt = prompts_mixed()[0]
    first = prefill(p, [prompt])[0]["output_token_ids"][0]
    p.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0, stop_token_ids=[first]),
                  kv_transfer_params={"do_remote_decode": True})
    outs, handoffs = run(p)
    assert [o.finish_reason for o in outs.values()] == ["stop"] and not handoffs
