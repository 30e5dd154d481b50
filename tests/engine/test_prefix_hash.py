"""Prefix-cache hashes: sha256 over (parent hash, token ids), and a hit compares the tokens, so a
hash collision is a miss, never another prompt's KV."""

import numpy as np
import pytest

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams
from nanoserve.engine import kv_cache
from nanoserve.engine.kv_cache import hash_block
from tests.conftest import FakeExecutor, assert_no_leaks

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def test_chained_hash_names_the_whole_prefix_and_is_stable():
    shared = hash_block(hash_block(None, (1, 2, 3, 4)), (5, 6, 7, 8))  # as lesson 06 calls it
    assert shared == hash_block(hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8])
    assert shared != hash_block(hash_block(None, (9, 9, 9, 9)), (5, 6, 7, 8))
    assert isinstance(shared, bytes) and len(shared) == 32  # a sha256 digest
    # Python's hash() maps -1 and -2 to the same value, so hash((None, (-1,))) collides with
    # hash((None, (-2,))): the builtin hash of a block can collide; sha256 separates them
    assert hash((None, (-1,))) == hash((None, (-2,)))
    assert hash_block(None, (-1,)) != hash_block(None, (-2,))


def test_every_block_hashing_alike_never_serves_another_prefixs_kv(monkeypatch):
    """The worst collision: every block gets the same hash. The fake executor checks every KV
    read; outputs and reads stay right, and identical prompts still hit their first block."""
    monkeypatch.setattr(kv_cache, "hash_block", lambda parent, tokens: b"same")
    config = EngineConfig(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16)
    engine = LLMEngine.from_executor(FakeExecutor(block_size=4), config)
    prompts = {"a": list(range(10, 23)), "b": list(range(50, 63)), "a-again": list(range(10, 23))}
    final = {}
    for rid, prompt in prompts.items():  # one after another: each finds the others' blocks cached
        engine.add_request(prompt, GREEDY, request_id=rid)
        while engine.has_unfinished():
            final.update({o.request_id: o for o in engine.step() if o.finished})
    assert not engine.executor.kv_errors, engine.executor.kv_errors
    assert final["b"].num_cached_tokens == 0
    assert final["a-again"].num_cached_tokens == 4  # block 0 matches; block 1's entry is a's block 0
    assert_no_leaks(engine)


def test_forced_collision_on_a_real_model_is_a_miss(hf_models, monkeypatch):
    """B's first block is made to hash like A's: B must compute its own KV and generate what it
    generates with no prefix cache at all."""
    _, folder = hf_models("llama")
    a, b = [11, 12, 13, 14, 15, 16, 17, 18, 19], [21, 22, 23, 24, 15, 16, 17, 18, 19]
    plain = LLM(folder, config=EngineConfig(block_size=4, num_kv_blocks=64, enable_prefix_caching=False))
    want = plain.generate([b], GREEDY)[0].token_ids
    real = kv_cache.hash_block
    monkeypatch.setattr(kv_cache, "hash_block", lambda parent, tokens: real(
        parent, tuple(a[:4]) if tuple(tokens) == tuple(b[:4]) else tokens))
    llm = LLM(folder, config=EngineConfig(block_size=4, num_kv_blocks=64))
    llm.generate([a], GREEDY)
    out = llm.generate([b], GREEDY)[0]
    assert out.num_cached_tokens == 0, "a colliding hash served another prompt's blocks"
    assert out.token_ids == want
    assert_no_leaks(llm.engine)


@pytest.mark.parametrize("as_array", [np.array, list])
def test_numpy_prompts_hash_like_lists(as_array):
    """Token ids are converted to Python ints on the way in, so the same prompt hits the cache
    whatever container it came in (pickled NumPy ints would hash differently)."""
    engine = LLMEngine.from_executor(FakeExecutor(block_size=4),
                                     EngineConfig(block_size=4, num_kv_blocks=32))
    prompt = list(range(40, 53))
    for p in (prompt, as_array(np.array(prompt, dtype=np.int64))):
        engine.add_request(p, GREEDY)
        while engine.has_unfinished():
            outs = engine.step()
    assert outs[0].num_cached_tokens == 12
