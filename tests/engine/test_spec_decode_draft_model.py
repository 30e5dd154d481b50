"""Speculative decoding with a draft model: greedy output is HF transformers' with a different
random draft of the same vocabulary (chunked prefill, preemption, mixed batches); the target as its
own draft accepts every draft; a draft of another vocabulary is refused naming both sizes; the
draft's own KV blocks all come back."""

import pytest

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.errors import InvalidRequest
from nanoserve.model import DEMO_MODEL_DIR
from tests.conftest import assert_no_leaks, make_hf_model
from tests.engine.test_spec_decode import MAX_TOKENS, PROMPTS, hf_greedy


@pytest.fixture(scope="module")
def models(hf_models, tmp_path_factory):
    hf, folder = hf_models("llama")
    draft = str(tmp_path_factory.mktemp("draft"))
    make_hf_model("llama", draft, seed=7)  # same shape and vocabulary, other weights
    return folder, draft, hf_greedy(hf, PROMPTS, MAX_TOKENS)


def draft_leaks(engine):
    kv = engine.proposer.kv
    kv.check_invariants()
    assert not kv.req_to_blocks and kv.num_free_blocks == kv.num_blocks


@pytest.mark.parametrize("k, kw", [(1, dict(max_num_batched_tokens=8)),
                                   (3, dict(num_kv_blocks=18, max_num_batched_tokens=16))])
def test_greedy_with_a_random_draft_equals_hf(models, k, kw):
    folder, draft, refs = models
    config = EngineConfig(**(dict(block_size=4, num_kv_blocks=256) | kw))
    llm = LLM(folder, config=config, speculative_config=dict(method="draft_model", model=draft,
                                                              num_speculative_tokens=k))
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
    assert [o.token_ids for o in outs] == refs
    st = llm.engine.stats
    assert st.spec_decode_num_draft_tokens > 0
    if "num_kv_blocks" in kw:
        assert st.preemptions > 0
    assert_no_leaks(llm.engine)
    draft_leaks(llm.engine)


def test_the_target_as_its_own_draft_accepts_every_draft():
    plain = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=128))
    text = open(f"{DEMO_MODEL_DIR}/heldout.txt").read()
    prompts = [plain.engine.encode(text[i:i + 150]) for i in (0, 400, 900)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    llm = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=128, max_num_batched_tokens=64),
              speculative_config=dict(method="draft_model", model=DEMO_MODEL_DIR, num_speculative_tokens=4))
    engine = llm.engine
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    st = engine.stats
    assert st.spec_decode_num_draft_tokens > 20
    assert st.spec_decode_num_accepted_tokens == st.spec_decode_num_draft_tokens
    # abort mid-speculation: the draft's blocks come back too
    ids = [engine.add_request(p, SamplingParams(max_tokens=30, temperature=0)) for p in prompts]
    while not any(r.spec_token_ids for r in engine.requests.values()):
        engine.step()
    for rid in ids:
        engine.abort(rid)
    assert_no_leaks(engine)
    draft_leaks(engine)


def test_a_draft_of_another_vocabulary_is_refused(models):
    folder, _, _ = models
    with pytest.raises(InvalidRequest, match="vocab_size=512, the target model 4096") as err:
        LLM(DEMO_MODEL_DIR, speculative_config=dict(method="draft_model", model=folder,
                                                     num_speculative_tokens=2))
    assert err.value.param == "speculative_config"


def test_a_draft_model_needs_a_real_target():
    from nanoserve import LLMEngine
    from tests.conftest import FakeExecutor
    with pytest.raises(InvalidRequest, match="needs a real target model"):
        LLMEngine.from_executor(FakeExecutor(), EngineConfig(num_kv_blocks=8), speculative_config=dict(
            method="draft_model", model="preset:tiny", num_speculative_tokens=2))


