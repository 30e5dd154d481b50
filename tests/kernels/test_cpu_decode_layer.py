"""cpu_decode_layer: a step of a few tokens through every decoder layer in one C++ call equals the
op-by-op path bit for bit (the output, the residual stream and the KV caches it writes), wherever it
runs: decodes of up to MAX_ROWS sequences and speculative verifies; and it steps aside (returns
None) where a step or a layer needs other kernels."""

import functools
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve import LLM, EngineConfig, ModelConfig, SamplingParams
from nanoserve.kernels import AttentionMetadata, cpu_decode_layer, use_kernels
from nanoserve.model.llama import run_layers

SHAPE = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [20, 21]]
MANY = [[30 + i, 40 + 2 * i, 50 + 3 * i, 60 + i] for i in range(9)]  # nine sequences: one past MAX_ROWS


@pytest.fixture(autouse=True)
def need_cpu_ops(cpu_ops):
    if not cpu_ops:
        pytest.skip("the C++ CPU ops did not build here")


def distinct_weights(llm):
    """Every layer's norms (and biases) made its own: a random model's are ones (and zeros), which
    a norm of the wrong layer, or a dropped bias, would not show."""
    g = torch.Generator().manual_seed(0)
    for layer in llm.engine.executor.model.layers:
        bias = layer.self_attn.qkv_proj.bias
        draws = [(layer.input_layernorm, 1.0, 0.2), (layer.post_attention_layernorm, 1.0, 0.2)]
        for p, mean, std in draws + ([(bias, 0.0, 0.5)] if bias is not None else []):
            p.data.copy_(torch.randn(p.shape, generator=g) * std + mean)


def checked_engine(llm, seen: list):
    """Every call of the model's decode_layers also runs the layers op by op on a copy of the KV
    caches; the op-by-op result goes on. `seen`: (tokens, fused?, both agree exactly?), recorded
    rather than asserted here: the engine turns an exception in a step into failed requests."""
    ops = llm.engine.executor.model.ops
    fused_fn = ops.decode_layers

    def check(layers, positions, x, kv_caches, attn, cos_sin):
        copies = [tuple(c.clone() for c in kv) for kv in kv_caches]
        fused = fused_fn(layers, positions, x, copies, attn, cos_sin)
        out = run_layers(layers, positions, x, kv_caches, attn, cos_sin)
        same = fused is None or (torch.equal(fused[0], out[0]) and torch.equal(fused[1], out[1]) and all(
            torch.equal(a, b) for copy, kv in zip(copies, kv_caches) for a, b in zip(copy, kv)))
        seen.append((x.shape[0], fused is not None, same))
        return out
    ops.decode_layers = check
    return ops, fused_fn


@pytest.mark.parametrize("dtype,quantization,bias,kv", [
    ("float32", None, False, "auto"), ("bfloat16", None, False, "auto"), ("bfloat16", "int8", False, "auto"),
    ("float32", "fp8", False, "auto"), ("bfloat16", None, True, "auto"), ("bfloat16", "int8", True, "auto"),
    ("bfloat16", None, False, "fp8"), ("float32", "int8", False, "fp8")])
def test_the_layers_in_one_call_equal_the_op_by_op_path(dtype, quantization, bias, kv):
    llm = LLM(replace(SHAPE, attention_bias=bias), device="cpu", dtype=dtype,
              config=EngineConfig(quantization=quantization, max_num_seqs=16, kv_cache_dtype=kv))
    distinct_weights(llm)
    seen = []
    ops, fused_fn = checked_engine(llm, seen)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    try:
        outs = [o for batch in (PROMPTS[:1], PROMPTS[:2], PROMPTS[:3], MANY[:8], MANY)
                for o in llm.generate(batch, params)]
    finally:
        ops.decode_layers = fused_fn
    assert all(o.finish_reason == "length" for o in outs)
    assert all(same for _, _, same in seen)
    # decode steps of 1, 2, 3 and 8 sequences ran it (and prompts of up to MAX_ROWS tokens)
    assert {1, 2, 3, 8} <= {t for t, f, _ in seen if f}
    assert not any(f for t, f, _ in seen if t > cpu_decode_layer.MAX_ROWS)  # long prefills, batch 9


@pytest.mark.parametrize("dtype,quantization", [("float32", None), ("bfloat16", "int8"), ("bfloat16", "fp8")])
def test_a_speculative_verify_runs_in_one_call_with_the_op_by_op_tokens(dtype, quantization):
    """A verify step's rows (the last token and the drafts of a sequence, beside other sequences'
    decodes) run in the one call, each row attending to its causal length; the tokens equal
    the plain engine's run op by op."""
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    prompts = [[7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [11, 12, 13, 11, 12, 13, 11, 12]]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    llm = LLM(SHAPE, device="cpu", dtype=dtype,
              config=EngineConfig(quantization=quantization, speculative_config=spec))
    eager = LLM(SHAPE, device="cpu", dtype=dtype, config=EngineConfig(quantization=quantization,
                                                                      enforce_eager=True))
    seen = []
    ops, fused_fn = checked_engine(llm, seen)
    try:
        outs = [llm.generate(batch, params) for batch in (prompts[:1], prompts)]
    finally:
        ops.decode_layers = fused_fn
    assert all(same for _, _, same in seen)
    assert any(f and t > 2 for t, f, _ in seen)  # verify steps (1 + drafts rows) took it
    stats = llm.engine.scheduler.stats
    assert stats.spec_decode_num_draft_tokens > 0 and stats.spec_decode_num_accepted_tokens > 0
    for batch, out in zip((prompts[:1], prompts), outs):
        assert [o.token_ids for o in out] == [o.token_ids for o in eager.generate(batch, params)]


def test_enforce_eager_and_a_learners_kernel_run_op_by_op_with_the_same_tokens():
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    fused = LLM(SHAPE, device="cpu", dtype="bfloat16")
    eager = LLM(SHAPE, device="cpu", dtype="bfloat16", config=EngineConfig(enforce_eager=True))
    assert fused.engine.executor.model.ops.decode_layers is cpu_decode_layer.decode_layers
    assert not hasattr(eager.engine.executor.model.ops, "decode_layers")
    for batch in (PROMPTS[:1], PROMPTS[:2]):
        assert ([o.token_ids for o in fused.generate(batch, params)] ==
                [o.token_ids for o in eager.generate(batch, params)])
    use_kernels(fused)  # a namespace built for a learner's kernel has no fused layers to skip it
    assert not hasattr(fused.engine.executor.model.ops, "decode_layers")


def test_a_layer_the_op_cannot_take_runs_op_by_op():
    cfg = replace(SHAPE, qk_norm=True)  # Qwen3's norms on q and k run between the qkv linear and rotary
    llm = LLM(cfg, device="cpu", dtype="bfloat16")
    seen = []
    ops, fused_fn = checked_engine(llm, seen)
    try:
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    finally:
        ops.decode_layers = fused_fn
    assert seen and not any(f for _, f, _ in seen)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       quantization=st.sampled_from([None, "int8", "fp8"]), kv=st.sampled_from(["auto", "fp8"]),
       bias=st.booleans())
def test_any_step_of_a_few_tokens_equals_the_op_by_op_layers(data, dtype, quantization, kv, bias):
    """A step of up to MAX_ROWS tokens split any way into sequences (decodes first, then queries
    of several tokens: verifies, short chunks after a prefix of any length), on random block
    tables and KV caches of random contents, through one layer or both of a model's (the second
    takes the first's residual stream): the fused layers' output, residual and cache writes equal
    the op-by-op layers' bit for bit."""
    llm = _llm(dtype, quantization, kv, bias)
    model = llm.engine.executor.model
    layers = model.layers[:data.draw(st.integers(1, SHAPE.num_hidden_layers))]
    # blocks: room for every sequence's table at the widest, MAX_ROWS x (40 + 4) / 4
    block, blocks = 4, 128
    counts = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=cpu_decode_layer.MAX_ROWS))
    counts = sorted(counts, key=lambda n: n > 1)  # single-token queries first, as the runner orders them
    while sum(counts) > cpu_decode_layer.MAX_ROWS:
        counts.pop()
    prior = [data.draw(st.integers(0, 40)) for _ in counts]
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    cache_dtype = torch.float8_e4m3fn if kv == "fp8" else dtype
    kv_caches = [tuple(torch.randn(blocks, block, 2, 32, generator=g).to(cache_dtype) for _ in range(2))
                 for _ in layers]
    lens = [p + n for p, n in zip(prior, counts)]
    width = max(-(-n // block) for n in lens)
    tables = torch.randperm(blocks, generator=g)[:len(counts) * width].view(len(counts), width).int()
    positions = torch.tensor([p + j for p, n in zip(prior, counts) for j in range(n)])
    seq_of = [i for i, n in enumerate(counts) for _ in range(n)]
    slots = torch.tensor([int(tables[i, pos // block]) * block + pos % block
                          for i, pos in zip(seq_of, positions.tolist())])
    qsl = [0, *torch.tensor(counts).cumsum(0).tolist()]
    attn = AttentionMetadata(torch.tensor(qsl, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
                             tables, slots, qsl, lens, num_decodes=counts.count(1))
    x = torch.randn(sum(counts), SHAPE.hidden_size, generator=g).to(dtype)
    fused_caches = [tuple(c.clone() for c in kv) for kv in kv_caches]
    cos_sin = model.cos_sin_cache
    try:
        if kv == "fp8":  # a checkpoint's scales, each layer its own: 1.0 would not show a lost or swapped one
            for layer in layers:
                layer.self_attn.k_scale = data.draw(st.sampled_from([0.5, 1.0, 2.0]))
                layer.self_attn.v_scale = data.draw(st.sampled_from([0.25, 1.0, 4.0]))
        fused = cpu_decode_layer.decode_layers(layers, positions, x, fused_caches, attn, cos_sin)
        assert fused is not None, counts
        out = run_layers(layers, positions, x, kv_caches, attn, cos_sin)
    finally:
        for layer in layers:
            layer.self_attn.k_scale = layer.self_attn.v_scale = 1.0
    assert torch.equal(fused[0], out[0]) and torch.equal(fused[1], out[1]), counts
    for a, b in zip(fused_caches, kv_caches):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), counts


@functools.cache
def _llm(dtype, quantization, kv, bias):
    llm = LLM(replace(SHAPE, attention_bias=bias), device="cpu", dtype=str(dtype).removeprefix("torch."),
              config=EngineConfig(quantization=quantization, kv_cache_dtype=kv))
    distinct_weights(llm)
    return llm
