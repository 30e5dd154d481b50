"""The C++ layer ops (cpu_layer_ops.cpp) against the torch reference.

RMSNorm, with and without the residual: the reference is HF's order of rounding, so in fp32 the
two agree to float rounding (the sum of squares is added in another order), and in bf16/fp16 to
two units in the last place of the output dtype (an fp32 difference can land the normalised value
on the other side of a rounding boundary, and the weight's multiply rounds again). The residual
stream h = x + residual is one rounded add in both: equal exactly. RoPE rounds once from fp32
(one ulp), on q and k as views into a fused qkv row, leaving v alone (300 tokens of the wider
shapes are split over threads). The cache write is a copy: equal exactly, -1 slots skipped.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.kernels import cpu_build, cpu_layer_ops, reference

pytestmark = pytest.mark.skipif(not cpu_build.available(),
                                reason=f"C++ ops not built: {cpu_build.unavailable_reason()}")

ULP = {torch.float32: 2e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def close(got, want, dtype):
    # within two ulps of the output dtype, relative to the value
    tol = 2 * ULP[dtype] * want.float().abs().clamp(min=1e-3) + 1e-7
    return bool(((got.float() - want.float()).abs() <= tol).all())


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 70), hidden=st.sampled_from([8, 64, 100, 768, 1536]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       with_residual=st.booleans(), scale=st.sampled_from([1e-3, 1.0, 30.0]), seed=st.integers(0, 99))
def test_matches_the_reference(rows, hidden, dtype, with_residual, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(rows, hidden, generator=g)).to(dtype)
    w = (1 + 0.5 * torch.randn(hidden, generator=g)).to(dtype)
    r = (scale * torch.randn(rows, hidden, generator=g)).to(dtype) if with_residual else None
    want = reference.rms_norm(x, w, 1e-6, r)
    got = cpu_layer_ops.rms_norm(x, w, 1e-6, r)
    if with_residual:
        assert torch.equal(got[1], want[1])  # the residual stream: one rounded add in both
        got, want = got[0], want[0]
    assert got.dtype == dtype and got.shape == x.shape
    assert close(got, want, dtype), (got.float() - want.float()).abs().max()


def test_three_dim_input_and_many_threads_agree():
    x, w = torch.randn(3, 50, 768), torch.rand(768) + 0.5
    got = cpu_layer_ops.rms_norm(x, w, 1e-5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_layer_ops.rms_norm(x, w, 1e-5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(got, one)  # a row is one thread's work: the split cannot change it
    assert close(got, reference.rms_norm(x, w, 1e-5), torch.float32)


def test_inputs_the_op_does_not_take_go_to_the_reference():
    qkv = torch.randn(4, 3, 64)
    q = qkv[:, 0]  # a strided view (Qwen3's q_norm gets these)
    w = torch.ones(64)
    assert torch.equal(cpu_layer_ops.rms_norm(q, w, 1e-6), reference.rms_norm(q, w, 1e-6))
    x64 = torch.randn(2, 16, dtype=torch.float64)
    assert cpu_layer_ops.rms_norm(x64, torch.ones(16, dtype=torch.float64), 1e-6).dtype == torch.float64


def test_the_op_refuses_mismatched_tensors():
    x = torch.randn(2, 16)
    with pytest.raises(RuntimeError, match="weight"):
        torch.ops.nanoserve_cpu.rms_norm(torch.empty_like(x), x, torch.ones(8), 1e-6, None, None)
    with pytest.raises(RuntimeError, match="residual and h"):
        torch.ops.nanoserve_cpu.rms_norm(torch.empty_like(x), x, torch.ones(16), 1e-6, x, None)


def qkv_views(qkv, heads, kv_heads, hd):
    """q, k, v as the attention layer takes them: views into the fused projection's rows."""
    T = qkv.shape[0]
    q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    return q.view(T, heads, hd), k.view(T, kv_heads, hd), v.view(T, kv_heads, hd)


@settings(max_examples=30, deadline=None)
@given(T=st.one_of(st.integers(1, 40), st.just(300)), heads=st.sampled_from([1, 4, 12]),
       kv_heads=st.sampled_from([1, 4]), hd=st.sampled_from([8, 64, 128]), seed=st.integers(0, 99),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_rope_matches_the_reference_in_place(T, heads, kv_heads, hd, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    freqs = torch.outer(torch.arange(500.0), 1e4 ** (-torch.arange(0, hd, 2) / hd))
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), -1)  # (500, hd) as the model builds it
    positions = torch.randint(0, 500, (T,), generator=g)
    qkv = torch.randn(T, (heads + 2 * kv_heads) * hd, generator=g).to(dtype)
    want_qkv = qkv.clone()
    q, k, v = qkv_views(qkv, heads, kv_heads, hd)
    wq, wk, _ = qkv_views(want_qkv, heads, kv_heads, hd)
    v_before = v.clone()
    got = cpu_layer_ops.rotary_embedding(positions, q, k, cos_sin)
    want = reference.rotary_embedding(positions, wq, wk, cos_sin)
    assert got[0].data_ptr() == q.data_ptr() and got[1].data_ptr() == k.data_ptr()  # in place
    for a, b in zip(got, want):
        tol = ULP[dtype] * b.float().abs().clamp(min=1e-3) + 1e-7
        assert bool(((a.float() - b.float()).abs() <= tol).all())
    assert torch.equal(v, v_before)


def test_rope_refuses_a_position_past_the_table():
    q, k, _ = qkv_views(torch.randn(2, 32), 2, 1, 8)
    with pytest.raises(RuntimeError, match="position 9"):
        cpu_layer_ops.rotary_embedding(torch.tensor([0, 9]), q, k, torch.zeros(9, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_matches_the_reference(dtype):
    _, k, v = qkv_views(torch.randn(7, 128).to(dtype), 4, 2, 16)
    caches = [torch.zeros(5, 4, 2, 16, dtype=dtype) for _ in range(4)]
    slots = torch.tensor([3, -1, 19, 0, 7, -1, 12])
    cpu_layer_ops.reshape_and_cache(k, v, caches[0], caches[1], slots)
    reference.reshape_and_cache(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0].flatten(0, 1)[19].equal(k[2]) and caches[0].abs().sum() > 0
    with pytest.raises(RuntimeError, match="slot 20"):
        cpu_layer_ops.reshape_and_cache(k, v, caches[0], caches[1], torch.tensor([0, 1, 2, 3, 4, 5, 20]))


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       k_scale=st.sampled_from([0.25, 1.0, 3.0]), v_scale=st.sampled_from([0.5, 1.0, 7.0]),
       magnitude=st.sampled_from([1e-4, 1.0, 600.0]), seed=st.integers(0, 99))
def test_fp8_cache_write_matches_the_reference_byte_for_byte(dtype, k_scale, v_scale, magnitude, seed):
    """Into an e4m3 cache: each value over its scale, rounded to nearest even, saturated at 448
    (magnitude 600 overflows, 1e-4 lands in e4m3's subnormals and below); skipped slots; the
    reference's quantizing write is the specification."""
    g = torch.Generator().manual_seed(seed)
    _, k, v = qkv_views((magnitude * torch.randn(7, 128, generator=g)).to(dtype), 4, 2, 16)
    k[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=dtype)
    caches = [torch.randn(5, 4, 2, 16, generator=g).to(torch.float8_e4m3fn) for _ in range(2)]
    caches += [c.clone() for c in caches]
    slots = torch.tensor([3, -1, 19, 0, 7, -1, 12])
    cpu_layer_ops.reshape_and_cache(k, v, caches[0], caches[1], slots, k_scale, v_scale)
    reference.reshape_and_cache(k, v, caches[2], caches[3], slots, k_scale, v_scale)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 70), d=st.sampled_from([1, 15, 16, 17, 100, 2048]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       scale=st.sampled_from([1e-3, 1.0, 30.0]), seed=st.integers(0, 99))
def test_silu_and_mul_matches_the_reference(rows, d, dtype, scale, seed):
    """Row widths off the 16-value vector (the zero-padded tail), rows split over threads."""
    x = (scale * torch.randn(rows, 2 * d, generator=torch.Generator().manual_seed(seed))).to(dtype)
    got, want = cpu_layer_ops.silu_and_mul(x), reference.silu_and_mul(x)
    assert got.shape == (rows, d) and got.dtype == dtype
    assert close(got, want, dtype)


def test_silu_and_mul_rounds_as_the_reference():
    """bf16: silu rounded to bf16 before the product, every value equal. Edges: 0, a gate far
    below -87 (-0, as torch's), inf, NaN."""
    x = (4 * torch.randn(64, 2 * 2048, generator=torch.Generator().manual_seed(1))).bfloat16()
    assert torch.equal(cpu_layer_ops.silu_and_mul(x), reference.silu_and_mul(x))
    g = torch.tensor([[0.0, -1e30, 2.0, float("inf"), float("nan"), -3.0, 1.0, 1.0]])
    edge = torch.cat((g, torch.ones_like(g)), -1)
    got, want = cpu_layer_ops.silu_and_mul(edge), reference.silu_and_mul(edge)
    assert torch.equal(got[:, :4], want[:, :4]) and torch.equal(got[:, 5:], want[:, 5:])
    assert got[0, 1] == 0 and got[0, 1].signbit() and got[0, 3] == float("inf") and got[0, 4].isnan()


def test_silu_and_mul_of_three_dims_and_what_it_does_not_take():
    x = torch.randn(2, 3, 32)
    assert cpu_layer_ops.silu_and_mul(x).shape == (2, 3, 16)
    assert close(cpu_layer_ops.silu_and_mul(x), reference.silu_and_mul(x), torch.float32)
    strided = torch.randn(4, 64)[:, ::2]  # not contiguous: the reference takes it
    assert torch.equal(cpu_layer_ops.silu_and_mul(strided), reference.silu_and_mul(strided))
    with pytest.raises(RuntimeError, match="out must be"):
        torch.ops.nanoserve_cpu.silu_and_mul(torch.empty(2, 8), torch.randn(2, 32))


def test_bf16_rounding_keeps_denormals():
    """fp32 values under 1.2e-38 round to bf16 denormals, as c10::BFloat16 rounds them (the
    AVX512-BF16 instruction the ops use elsewhere would flush them to zero)."""
    g = torch.Generator().manual_seed(3)
    tiny = (torch.randn(4, 64, generator=g) * 1e-39).bfloat16()  # bf16 denormals, and some zeros
    assert (tiny != 0).sum() > 200 and (tiny.float().abs() < 1.17e-38).all()
    x, r = tiny, tiny.roll(1, 1)
    w = torch.ones(64, dtype=torch.bfloat16)
    got, want = cpu_layer_ops.rms_norm(x, w, 1e-6, r), reference.rms_norm(x, w, 1e-6, r)
    assert torch.equal(got[1], want[1])  # the residual stream x + r: denormal sums
    gate_up = torch.cat((tiny, torch.ones_like(tiny)), -1)  # silu(g) ~ g / 2, times 1
    got, want = cpu_layer_ops.silu_and_mul(gate_up), reference.silu_and_mul(gate_up)
    assert (want != 0).sum() > 200 and torch.equal(got, want)
