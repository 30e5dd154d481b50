"""EngineConfig.kv_cache_dtype: an fp8 (e4m3) KV cache holds twice the blocks of bf16 and four
times those of fp32 in the same memory, and the engine's guarantees hold over it.

Greedy output over an fp8 cache is not the same as over a float one (each K/V value keeps 3
mantissa bits), so against "auto" it is held to an agreement target: teacher-forced argmax
agreement >= 90% on the demo model's own greedy continuations (measured 97.5% in fp32) and
perplexity within 2%. Among fp8 engines, greedy output is exact again: quantization is
deterministic, so prefix caching, preemption, chunked prefill, speculative decoding and a
disaggregated hand-off never change it.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams
from nanoserve.engine.kv_cache import kv_bytes_per_block, kv_cache_torch_dtype
from nanoserve.errors import InvalidRequest
from nanoserve.measure.quality import compare, prompt_logits
from nanoserve.sim.devices import DEVICES, model_shape, num_kv_blocks
from tests.conftest import assert_no_leaks
from tests.engine.disagg_engines import GREEDY, decode, prefill, run, segments

FP8 = torch.float8_e4m3fn
PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed", "KING HENRY:\nWhat say you",
           "JULIET:\nO Romeo", "HAMLET:\nThe king"]


def blocks(dtype: str, kv: str, memory: int = 2**22) -> LLM:
    return LLM("preset:tiny", "cpu", dtype, config=EngineConfig(kv_cache_memory=memory,
                                                                 kv_cache_dtype=kv))


def test_fp8_holds_twice_the_blocks_of_bf16_and_four_times_fp32_in_the_same_memory():
    bf16, fp32 = blocks("bfloat16", "auto").engine, blocks("float32", "auto").engine
    for model_dtype, base in (("bfloat16", bf16), ("float32", fp32)):
        for name in ("fp8",) if model_dtype == "float32" else ("fp8", "fp8_e4m3"):
            fp8 = blocks(model_dtype, name).engine
            assert fp8.kv_cache_dtype == FP8 and fp8.dtype == getattr(torch, model_dtype)
            assert fp8.num_kv_blocks == base.num_kv_blocks * (4 if model_dtype == "float32" else 2)
            held = sum(t.nbytes for kv in fp8.executor.kv_caches for t in kv)
            assert held == fp8.num_kv_blocks * kv_bytes_per_block(fp8.model_config, 16, FP8) <= 2**22
            assert all(t.dtype == FP8 for kv in fp8.executor.kv_caches for t in kv)
    # the simulator sizes its cache with the same arithmetic
    cfg, h100 = model_shape("llama-3-8b"), DEVICES["H100-SXM"]
    auto = num_kv_blocks(h100, cfg, "bfloat16")
    assert num_kv_blocks(h100, cfg, "bfloat16", kv_cache_dtype="fp8") in (2 * auto, 2 * auto + 1)


@pytest.mark.parametrize("value", ["int4", "fp16", "e4m3", "", None, 8, "FP8"])
def test_unknown_kv_cache_dtypes_are_refused_naming_the_value(value):
    with pytest.raises(InvalidRequest, match="kv_cache_dtype") as e:
        EngineConfig(kv_cache_dtype=value)
    assert e.value.param == "kv_cache_dtype" and repr(value) in str(e.value)
    assert "'fp8'" in str(e.value) and "'auto'" in str(e.value)
    if isinstance(value, str) and value:
        with pytest.raises(InvalidRequest, match=repr(value)):
            LLM("preset:tiny", kv_cache_dtype=value)
        with pytest.raises(ValueError, match=repr(value)):
            kv_cache_torch_dtype(value, "float32")


def test_serve_takes_kv_cache_dtype_and_refuses_others(capsys):
    from nanoserve.serve.server import add_cli_args
    ap = add_cli_args(argparse.ArgumentParser())
    assert ap.parse_args(["--kv-cache-dtype", "fp8"]).kv_cache_dtype == "fp8"
    assert ap.parse_args([]).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        ap.parse_args(["--kv-cache-dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def demo_pair():
    make = lambda kv: LLM(None, "cpu", "float32", config=EngineConfig(  # noqa: E731
        num_kv_blocks=64, kv_cache_dtype=kv))
    return make("auto"), make("fp8")


def test_fp8_greedy_agrees_with_auto_on_the_demo_model(demo_pair):
    auto, fp8 = demo_pair
    outs = auto.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    seqs = [o.prompt_token_ids + o.token_ids for o in outs]
    for o, seq in zip(outs, seqs):  # the measure reproduces the engine's own greedy choices
        n = len(o.prompt_token_ids)
        assert prompt_logits(auto, seq).argmax(-1)[n - 1:-1].tolist() == o.token_ids
    a = compare(fp8, auto, seqs)
    assert a.argmax_agreement >= 0.90, a
    assert abs(a.perplexity_change) < 0.02, a
    assert a.max_logit_error > 0, "the fp8 engine computed exactly what auto did: is it fp8?"


def fp8_engine(num_kv_blocks=64, **config) -> LLM:
    return LLM(None, "cpu", "float32", config=EngineConfig(num_kv_blocks=num_kv_blocks,
                                                          kv_cache_dtype="fp8", **config))


def test_fp8_greedy_is_unchanged_by_prefix_caching_preemption_chunking_and_speculation(demo_pair):
    _, plain = demo_pair  # prefix caching on, enough blocks, 512-token steps
    shared = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."
    prompts = [shared + p for p in ("\n\nFirst Citizen:", "\n\nSecond Citizen:", "\n\nMENENIUS:")]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    want = [o.token_ids for o in fp8_engine(enable_prefix_caching=False).generate(prompts, params)]
    got = [o.token_ids for o in plain.generate(prompts, params)]
    assert got == want and plain.engine.stats.cached_prompt_tokens > 0
    tight = fp8_engine(num_kv_blocks=6, max_num_batched_tokens=16)  # chunks; preempts
    assert [o.token_ids for o in tight.generate(prompts, params)] == want
    assert tight.engine.stats.preemptions > 0
    spec = fp8_engine(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                          "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    assert [o.token_ids for o in spec.generate(prompts, params)] == want  # rejected drafts roll back
    assert spec.engine.stats.spec_decode_num_draft_tokens > spec.engine.stats.spec_decode_num_accepted_tokens
    for llm in (plain, tight, spec):
        assert_no_leaks(llm.engine)


def test_fp8_disaggregated_hand_off_equals_colocated_and_moves_half_the_bytes(hf_models):
    _, folder = hf_models("llama")

    def engine(role, kv_cache_dtype):
        config = EngineConfig(block_size=16, num_kv_blocks=96, max_num_batched_tokens=64,
                              kv_cache_dtype=kv_cache_dtype)
        return LLMEngine(folder, "cpu", "bfloat16", 0, config, kv_transfer_config={"kv_role": role})

    prompts = [[(7 * i + 3 * j) % 400 + 10 for j in range(n)] for i, n in enumerate((15, 33, 47))]
    colocated = LLM(folder, "cpu", "bfloat16", config=EngineConfig(num_kv_blocks=96, kv_cache_dtype="fp8"))
    want = [o.token_ids for o in colocated.generate(prompts, SamplingParams(max_tokens=8, **GREEDY))]
    moved = {}
    for kv in ("auto", "fp8"):
        p, d = engine("kv_producer", kv), engine("kv_consumer", kv)
        try:
            outs = decode(d, prompts, prefill(p, prompts), 8)
            if kv == "fp8":
                assert [o.token_ids for o in outs] == want
            moved[kv] = d.executor.kv_connector.stats.load_bytes
            assert d.stats.prefill_tokens_computed == 0
            run(d)
            assert_no_leaks(d)
        finally:
            p.shutdown()
            d.shutdown()
    assert moved["fp8"] * 2 == moved["auto"] > 0
    assert not segments()


@pytest.mark.slow
def test_fp8_kv_on_the_real_model_agrees_with_bf16():
    """SmolLM2-135M in bf16: fp8 KV against the bf16 cache, teacher-forced on bf16's greedy
    continuations, >= 90% argmax agreement and perplexity within 2% (measured: 94.3% and +0.2%;
    bf16 itself agrees with fp32 on 98.1% of these positions)."""
    from nanoserve.model import fetch
    folder = fetch.fetch_named("smollm2-135m")  # cached on a machine that has run it once
    make = lambda kv: LLM(folder, "cpu", "bfloat16", config=EngineConfig(  # noqa: E731
        num_kv_blocks=64, kv_cache_dtype=kv))
    auto, fp8 = make("auto"), make("fp8")
    prompts = ["What is the capital of France?", "Write a haiku about the sea.",
               "Explain what a KV cache is in one sentence.", "List three prime numbers."]
    outs = auto.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    a = compare(fp8, auto, [o.prompt_token_ids + o.token_ids for o in outs])
    assert a.argmax_agreement >= 0.90 and abs(a.perplexity_change) < 0.02, a
