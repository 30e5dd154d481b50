"""measure/quality.py: teacher-forced logits through an engine's own model and KV dtype, and the
agreement, logit error and perplexity computed from them."""

import math

import pytest
import torch

from nanoserve import LLM, EngineConfig
from nanoserve.measure.quality import compare, prompt_logits


@pytest.fixture(scope="module")
def tiny():
    return LLM("preset:tiny", "cpu", "float32", config=EngineConfig(num_kv_blocks=32))


def test_an_engine_agrees_with_itself_and_its_perplexity_is_its_mean_nll(tiny):
    seqs = [[5, 9, 200, 31, 7, 7, 12], [40, 41, 42, 43]]
    a = compare(tiny, tiny, seqs)
    assert a.positions == 11 and a.argmax_agreement == 1.0 and a.max_logit_error == 0.0
    nll = 0.0
    for s in seqs:
        logp = torch.log_softmax(prompt_logits(tiny, s), -1)
        nll -= sum(float(logp[i, s[i + 1]]) for i in range(len(s) - 1))
    assert a.perplexity == pytest.approx(math.exp(nll / 9)) and a.perplexity_change == 0.0


def test_prompt_logits_leave_the_engines_cache_alone_and_check_lengths(tiny):
    engine = tiny.engine
    before = [k.clone() for k, _ in engine.executor.kv_caches[:1]]
    logits = prompt_logits(tiny, [3, 4, 5])
    assert logits.shape == (3, engine.model_config.vocab_size) and logits.dtype == torch.float32
    assert torch.equal(engine.executor.kv_caches[0][0], before[0]), "prompt_logits wrote the engine's cache"
    with pytest.raises(ValueError, match="1 to max_model_len"):
        prompt_logits(tiny, [])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        compare(tiny, tiny, [[3]])
