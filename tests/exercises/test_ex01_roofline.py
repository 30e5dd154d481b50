"""Exercise 1 (roofline arithmetic), checked against nanoserve.measure.roofline on random shapes."""

import pytest
from exercise_checks import graded
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.config import ModelConfig
from nanoserve.measure.roofline import DeviceCeilings, step_cost
from nanoserve.measure.roofline import critical_batch_size as engine_critical_batch_size
from nanoserve.measure.roofline import decode_step_floor as engine_decode_step_floor
from nanoserve.presets import preset_config


@pytest.fixture(scope="module")
def ex(load):
    return load("ex01_roofline")


def off(got: float, want: float) -> str:
    """How far got is from want, relative: what the printed digits may not show."""
    return f"off by {abs(got - want) / abs(want):.2g} relative" if want else f"off by {abs(got):.2g}"


def model_configs():
    return st.builds(lambda h, heads, kv_div, inter, layers: ModelConfig(
        vocab_size=1000, hidden_size=h * heads, num_attention_heads=heads,
        num_key_value_heads=heads // kv_div, intermediate_size=inter, num_hidden_layers=layers),
        st.sampled_from([8, 16, 64]), st.sampled_from([2, 4, 8]), st.sampled_from([1, 2]),
        st.integers(8, 300), st.integers(1, 4))


def projections(cfg):
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return [(cfg.hidden_size, q + 2 * kv), (q, cfg.hidden_size),
            (cfg.hidden_size, 2 * cfg.intermediate_size), (cfg.intermediate_size, cfg.hidden_size)]


def test_linear_flops_and_bytes_worked_example(ex):
    assert ex.linear_flops(1, 768, 768) == 1_179_648, "linear_flops(1, 768, 768) should be 2*1*768*768"
    assert ex.linear_bytes(1, 768, 768, 4) == 2_365_440, \
        "linear_bytes(1, 768, 768, 4) should be (768*768 weights + 768 in + 768 out) * 4 bytes"


@graded(40)
@given(cfg=model_configs(), tokens=st.integers(1, 600), dtype_bytes=st.sampled_from([2, 4]))
def test_linear_layers_match_step_cost(ex, cfg, tokens, dtype_bytes):
    want = step_cost(cfg, [(tokens, tokens)], dtype_bytes)
    flops = cfg.num_hidden_layers * sum(ex.linear_flops(tokens, i, o) for i, o in projections(cfg))
    nbytes = cfg.num_hidden_layers * sum(ex.linear_bytes(tokens, i, o, dtype_bytes)
                                         for i, o in projections(cfg))
    assert flops == want.flops["linear"], (
        f"linear FLOPs of {tokens} tokens through the model's projections: got {flops}, "
        f"expected {want.flops['linear']}")
    assert nbytes == want.bytes["linear"], (
        f"linear bytes of {tokens} tokens ({dtype_bytes}-byte dtype): got {nbytes}, expected "
        f"{want.bytes['linear']}")


def test_batch_one_linear_intensity_is_low(ex):
    k = 8192
    fp32 = ex.arithmetic_intensity(ex.linear_flops(1, k, k), ex.linear_bytes(1, k, k, 4))
    assert fp32 == pytest.approx(2 * k * k / ((k * k + 2 * k) * 4)), "intensity is FLOPs / bytes"
    big = ex.arithmetic_intensity(ex.linear_flops(256, k, k), ex.linear_bytes(256, k, k, 2))
    assert 200 < big < 256, f"a batch-256 bf16 linear layer should reach ~240 FLOP/byte, got {big:.1f}"


@graded(40)
@given(cfg=model_configs(), q=st.integers(1, 300), cached=st.integers(0, 500),
       dtype_bytes=st.sampled_from([2, 4]))
def test_attention_matches_step_cost(ex, cfg, q, cached, dtype_bytes):
    ctx = q + cached  # prefill from scratch when cached == 0; decode when q == 1
    want = step_cost(cfg, [(q, ctx)], dtype_bytes)
    L, H, KVH, D = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    flops = L * ex.attention_flops(q, ctx, H, D)
    assert flops == want.flops["attention"], (
        f"attention FLOPs of {q} query tokens over a context of {ctx} ({H} heads of {D}): got "
        f"{flops // L} per layer, expected {want.flops['attention'] // L} (causal: count only the "
        f"pairs a query may attend to)")
    nbytes = L * ex.attention_bytes(q, ctx, H, KVH, D, dtype_bytes)
    assert nbytes == want.bytes["attention"], (
        f"attention bytes of ({q}, {ctx}): got {nbytes // L} per layer, expected "
        f"{want.bytes['attention'] // L}")


def test_prefill_attention_is_compute_heavier_than_decode(ex):
    prefill = ex.arithmetic_intensity(ex.attention_flops(1024, 1024, 32, 128),
                                      ex.attention_bytes(1024, 1024, 32, 8, 128, 2))
    decode = ex.arithmetic_intensity(ex.attention_flops(1, 1024, 32, 128),
                                     ex.attention_bytes(1, 1024, 32, 8, 128, 2))
    assert decode < 8 < 100 < prefill, (
        f"attention intensity: decode {decode:.1f} FLOP/byte should be a few, prefill of 1024 tokens "
        f"{prefill:.1f} should be hundreds")


@graded(40)
@given(peak=st.floats(1e10, 1e16), bandwidth=st.floats(1e9, 1e13), dtype_bytes=st.sampled_from([1, 2, 4]))
def test_ridge_point_and_critical_batch_size(ex, peak, bandwidth, dtype_bytes):
    assert ex.ridge_point(peak, bandwidth) == pytest.approx(peak / bandwidth), \
        "ridge point = peak / bandwidth"
    name = {1: "float8_e4m3fn", 2: "bfloat16", 4: "float32"}[dtype_bytes]
    ceilings = DeviceCeilings("cpu", "test", 1, "", "", False, bandwidth, bandwidth, {name: peak})
    want = engine_critical_batch_size(ceilings, name)
    got = ex.critical_batch_size(peak, bandwidth, dtype_bytes)
    assert got == pytest.approx(want), (
        f"critical batch size at {peak:.3g} FLOP/s, {bandwidth:.3g} B/s, {dtype_bytes}-byte weights: "
        f"got {got:.8g}, expected {want:.8g} ({off(got, want)})")


def test_kv_bytes_per_token(ex):
    assert ex.kv_bytes_per_token(12, 4, 64, 4) == 24_576, "K and V, per kv head, per layer, in bytes"
    assert ex.kv_bytes_per_token(32, 8, 128, 2) == 131_072, "llama-3-8b in bf16 holds 128 KiB per token"


@graded(60)
@given(cfg=model_configs(), batch=st.integers(1, 512), ctx=st.integers(1, 8192),
       dtype_bytes=st.sampled_from([2, 4]), bandwidth=st.floats(1e9, 1e13), peak=st.floats(1e11, 1e16))
def test_decode_step_floor_matches_the_engine(ex, cfg, batch, ctx, dtype_bytes, bandwidth, peak):
    name = {2: "bfloat16", 4: "float32"}[dtype_bytes]
    ceilings = DeviceCeilings("cpu", "test", 1, "", "", False, bandwidth, bandwidth, {name: peak})
    want = engine_decode_step_floor(cfg, batch, ctx, ceilings, name)
    got = ex.decode_step_floor(cfg, batch, ctx, dtype_bytes, bandwidth, peak)
    cost = step_cost(cfg, [(1, ctx)] * batch, dtype_bytes)
    assert got == pytest.approx(want), (
        f"decode floor of batch {batch} at context {ctx} ({dtype_bytes}-byte dtype): got {got:.8g} s, "
        f"expected {want:.8g} s ({off(got, want)}): {cost.total_bytes:.8g} bytes (weights once, K and "
        f"V of every sequence, no embedding matrix) over {bandwidth:.3g} B/s, or {cost.total_flops:.8g} "
        f"FLOPs over {peak:.3g} FLOP/s, whichever is longer")


def test_decode_floor_worked_example(ex):
    cfg = preset_config("llama-120m")
    one = ex.decode_step_floor(cfg, 1, 512, 4, 24.5e9, 195e9)
    assert one == pytest.approx(0.01688, rel=1e-3), (
        f"llama-120m fp32, batch 1 at context 512, 24.5 GB/s: got {one:.6g} s, expected about "
        f"0.01688 s; the input embedding is a gather, not a read of the whole matrix")
    many = ex.decode_step_floor(cfg, 16, 2048, 4, 24.5e9, 195e9)
    assert many == pytest.approx(0.04971, rel=1e-3), (
        f"batch 16 at context 2048: got {many:.6g} s, expected about 0.04971 s; every sequence "
        f"reads its own KV cache")
