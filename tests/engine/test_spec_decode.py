"""Speculative decoding (ngram): greedy output is HF transformers' token for token (fp32) for every
k, beside chunked prefill, prefix-cache hits, preemption and mixed batches; drafts are accepted
on the trained demo model; max_tokens and stop tokens hold inside an accepted run; nothing leaks."""

import pytest
import torch

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams, SpeculativeConfig
from nanoserve.errors import InvalidRequest
from nanoserve.kernels import cpu_build
from nanoserve.model import DEMO_MODEL_DIR
from tests.conftest import FakeExecutor, assert_no_leaks

G = torch.Generator().manual_seed(1)
BASE = [torch.randint(0, 512, (n,), generator=G).tolist() for n in (5, 9, 3)]
# repeated pieces, so prompt lookup has something to find; lengths across block boundaries
PROMPTS = [BASE[0] * 4, BASE[1] * 3 + BASE[0], BASE[2] * 7, BASE[1], [7], BASE[0] * 2 + BASE[2] * 3]
MAX_TOKENS = 14


def ngram(k, **kw):
    return dict(method="ngram", num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=3) | kw


def hf_greedy(hf, prompts, max_tokens):
    refs = []
    for p in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              do_sample=False)
        refs.append(out[0, len(p):].tolist())
    return refs


@pytest.fixture(scope="module")
def reference(hf_models):
    hf, folder = hf_models("llama")
    return folder, hf_greedy(hf, PROMPTS, MAX_TOKENS)


CONFIGS = {
    "chunk8": dict(max_num_batched_tokens=8),
    "chunk64-no-prefix-cache": dict(max_num_batched_tokens=64, enable_prefix_caching=False),
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=40),
    "heavy-preemption": dict(num_kv_blocks=18, max_num_batched_tokens=16),
}


@pytest.mark.parametrize("name, k", [("chunk8", k) for k in (1, 2, 3, 4, 5)] + [
    ("chunk64-no-prefix-cache", 4), ("no-chunking", 2), ("heavy-preemption", 1),
    ("heavy-preemption", 3), ("heavy-preemption", 5)])
def test_greedy_speculation_equals_hf(reference, name, k):
    folder, refs = reference
    kw = dict(block_size=4, num_kv_blocks=256) | CONFIGS[name]
    llm = LLM(folder, config=EngineConfig(**kw, speculative_config=ngram(k)))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    for round_ in range(2):  # the second round hits the prefix cache
        outs = llm.generate(PROMPTS, params)
        for p, o, ref in zip(PROMPTS, outs, refs):
            assert o.token_ids == ref, f"{name} k={k} round {round_}: prompt of {len(p)} tokens"
    st = llm.engine.stats
    assert st.spec_decode_num_drafts > 0 and st.spec_decode_num_draft_tokens > st.spec_decode_num_drafts - 1
    assert len(st.spec_decode_num_accepted_tokens_per_pos) == k
    if name == "heavy-preemption":
        assert st.preemptions > 0
    if kw.get("enable_prefix_caching", True):
        assert st.cached_prompt_tokens > 0
    assert_no_leaks(llm.engine)


@pytest.fixture(scope="module")
def demo():
    """The trained demo model without speculation, and prompts that repeat a line of a held-out
    play three times (the model's greedy output loops on some: prompt lookup guesses right)."""
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(DEMO_MODEL_DIR, dtype=torch.float32).eval()
    plain = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=128))
    text = open(f"{DEMO_MODEL_DIR}/heldout.txt").read()
    lines = [t for t in text.splitlines() if len(t) > 30][:4]
    prompts = [plain.engine.encode(" ".join([t] * 3)) for t in reversed(lines)]
    prompts.append(plain.engine.encode("The king, the king, the king,"))
    return hf, plain, prompts


@pytest.mark.parametrize("k", [3])
def test_demo_model_accepts_drafts_and_equals_hf(demo, k):
    hf, plain, prompts = demo
    refs = hf_greedy(hf, prompts, 24)
    llm = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=128, max_num_batched_tokens=64),
              speculative_config=ngram(k, prompt_lookup_min=2, prompt_lookup_max=4))
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    st = llm.engine.stats
    assert st.spec_decode_num_accepted_tokens > 0, "no draft accepted: the accept path is not tested"
    assert sum(st.spec_decode_num_accepted_tokens_per_pos) == st.spec_decode_num_accepted_tokens
    trace = [e for r in llm.engine.trace for e in r.entries]
    assert sum(e.num_accepted_tokens for e in trace) == st.spec_decode_num_accepted_tokens
    assert sum(e.num_draft_tokens for e in trace) == st.spec_decode_num_draft_tokens
    assert_no_leaks(llm.engine)


def test_max_tokens_holds_inside_an_accepted_run(demo):
    _, plain, prompts = demo
    llm = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=128),
              speculative_config=ngram(5, prompt_lookup_min=2, prompt_lookup_max=4))
    full = plain.generate(prompts[:1], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    for max_tokens in (12, 14, 17, 20):
        p = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        o = llm.generate(prompts[:1], p)[0]
        assert o.token_ids == full.token_ids[:max_tokens] and o.finish_reason == "length"
    assert llm.engine.stats.spec_decode_num_accepted_tokens > 0
    assert_no_leaks(llm.engine)


@pytest.mark.slow
@pytest.mark.skipif(not cpu_build.available(), reason="the C++ CPU ops are not built here")
@pytest.mark.parametrize("quantization", [None, "int8", "fp8"])
def test_bf16_at_batch_1_speculation_changes_no_bit(quantization):
    """In bf16 a verify row is computed as the one-row decode step it replaces (the GEMV, over bf16
    weights or 8-bit codes, and the decode attention sum a row as they would alone), so at batch 1
    speculation changes no token of the real model, where fp32 is checked against HF above.
    (Before, 11 of 16 of lesson 12's requests differed somewhere in 96 tokens.) Verifies of more
    rows than GEMV_ROWS go to oneDNN or torch's int8 matmul, whose rounding may differ."""
    from nanoserve.model import fetch
    folder = fetch.fetch_named("smollm2-135m")  # cached on a machine that has run it once
    config = EngineConfig(num_kv_blocks=64, max_num_batched_tokens=256, quantization=quantization)
    plain = LLM(folder, "cpu", "bfloat16", config=config)
    spec = LLM(folder, "cpu", "bfloat16", config=config,
               speculative_config=ngram(4, prompt_lookup_min=2, prompt_lookup_max=4))
    text = open(f"{DEMO_MODEL_DIR}/heldout.txt").read()
    lines = [t for t in text.splitlines() if len(t) > 30]
    prompts = [f"Repeat this text exactly:\n{lines[i]} {lines[i + 1]}\n\n" for i in (0, 5, 10)]
    prompts += ["Explain what a KV cache is.", "Write a short story about a lighthouse keeper."]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    for p in prompts:
        assert spec.generate([p], params)[0].token_ids == plain.generate([p], params)[0].token_ids, p
    assert spec.engine.stats.spec_decode_num_accepted_tokens > 0


def periodic_engine(k=5, **kw):
    """The real scheduler over FakeExecutor, whose output repeats every 5 positions: a prompt of
    two periods makes every draft right, from the first decode on."""
    executor = FakeExecutor(vocab_size=500, block_size=4, period=5)
    config = EngineConfig(**(dict(block_size=4, num_kv_blocks=64) | kw))
    return LLMEngine.from_executor(executor, config, speculative_config=ngram(k)), executor


def run(engine, prompt, params):
    rid = engine.add_request(prompt, params)
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished and o.request_id == rid:
                return o


def test_stop_eos_and_max_tokens_end_an_accepted_run_where_decoding_would():
    engine, ex = periodic_engine()
    rid = "0"
    prompt = [ex.token(rid, i) for i in range(10)]
    pattern = [ex.token(rid, i) for i in range(10, 30)]
    o = run(engine, prompt, SamplingParams(max_tokens=20, temperature=0))
    assert o.token_ids == pattern
    assert engine.stats.spec_decode_num_accepted_tokens >= 12  # runs of 5 accepted drafts + 1
    for i, stop in enumerate(pattern[:5]):  # each token of the period, first seen at index i
        engine, ex = periodic_engine()
        o = run(engine, prompt, SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[stop]))
        assert (o.token_ids, o.finish_reason) == (pattern[:i + 1], "stop")
    engine, ex = periodic_engine()
    ex.model_config.eos_token_id = pattern[3]
    engine = LLMEngine.from_executor(ex, engine.config)
    o = run(engine, prompt, SamplingParams(max_tokens=20, temperature=0))
    assert (o.token_ids, o.finish_reason) == (pattern[:4], "eos")
    # the step that ended it had accepted drafts past the stop: they were dropped, not emitted
    last = [s for s in ex.steps if s.seqs and s.seqs[0].spec_token_ids][-1]
    assert len(last.seqs[0].spec_token_ids) > 1
    for max_tokens in (1, 2, 3, 6, 7, 13):
        engine, ex = periodic_engine()
        o = run(engine, prompt, SamplingParams(max_tokens=max_tokens, temperature=0))
        assert (o.token_ids, o.finish_reason) == (pattern[:max_tokens], "length")
        assert all(s.start + len(s.token_ids) <= len(prompt) + max_tokens
                   for step in ex.steps for s in step.seqs), \
            "a draft was checked past max_tokens"
        assert_no_leaks(engine)


def test_abort_mid_speculation_and_disable_by_batch_size(demo):
    _, plain, prompts = demo
    llm = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=128),
              speculative_config=ngram(4, prompt_lookup_min=2, prompt_lookup_max=4))
    engine = llm.engine
    ids = [engine.add_request(p, SamplingParams(max_tokens=30, temperature=0)) for p in prompts]
    while not any(r.spec_token_ids for r in engine.requests.values()):
        engine.step()
    for rid in ids[:3]:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    assert_no_leaks(engine)
    # three running requests reach the limit: no drafts at all
    off = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=128), speculative_config=ngram(
        4, prompt_lookup_min=2, prompt_lookup_max=4, disable_by_batch_size=3))
    off.generate(prompts[:3], SamplingParams(max_tokens=12, temperature=0))
    assert off.engine.stats.spec_decode_num_drafts == 0
    off.generate(prompts[:2], SamplingParams(max_tokens=12, temperature=0))
    assert off.engine.stats.spec_decode_num_drafts > 0


@pytest.mark.parametrize("bad, match", [
    (dict(method="medusa", num_speculative_tokens=2), "method='medusa'"),
    (dict(method="ngram"), "num_speculative_tokens=None"),
    (dict(method="ngram", num_speculative_tokens=0), "num_speculative_tokens=0"),
    (dict(method="ngram", num_speculative_tokens=2, prompt_lookup_min=3, prompt_lookup_max=2),
     "prompt_lookup_min=3 must be <= prompt_lookup_max=2"),
    (dict(method="ngram", num_speculative_tokens=2, disable_by_batch_size=0), "disable_by_batch_size=0"),
    (dict(method="ngram", num_speculative_tokens=2, lookahead=3), "lookahead"),
    ("{not json", "not JSON"),
    (dict(method="draft_model", num_speculative_tokens=2), "model=None"),
])
def test_bad_speculative_config_names_the_value(bad, match):
    with pytest.raises(InvalidRequest, match=match) as err:
        EngineConfig(speculative_config=bad)
    assert err.value.param == "speculative_config"


def test_speculative_config_defaults_are_vllms():
    c = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (4, 4)
    assert SpeculativeConfig(model="some/model", num_speculative_tokens=2).method == "draft_model"
    assert EngineConfig().num_speculative_tokens == 0


def test_drafts_are_dropped_before_they_would_preempt_a_request():
    engine, ex = periodic_engine(num_kv_blocks=6)  # two prompts of 11 tokens: 3 blocks each
    prompts = [[ex.token(rid, i) for i in range(11)] for rid in ("0", "1")]
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=4, temperature=0))
    engine.step()  # both prefills: every block in use, drafts proposed
    assert all(r.spec_token_ids for r in engine.requests.values())
    outs = engine.step()  # each decode fits its last block; its drafts would need more
    assert len(outs) == 2 and engine.stats.preemptions == 0
    assert engine.stats.spec_decode_num_drafts == 0
