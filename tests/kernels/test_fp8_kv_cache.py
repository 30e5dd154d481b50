"""The fp8 (e4m3) KV cache in the kernels: the reference's quantizing write and dequantizing read
are the specification; the CPU backend and Triton (interpreted off a GPU) match it.

Tolerances: attention over an fp8 cache equals the same attention over the dequantized cache to
the fp32 tolerance (the read is exactly `from_cache`), and is within 0.05 RMS and 0.25 at most
of the attention over the unquantized cache for unit-normal K/V: e4m3 rounds to 3 mantissa bits,
a relative error of at most 2^-4 per value (300 random cases of these shapes: 0.028 RMS and 0.17
at most, the worst of each).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_cases import CASES, TOL, paged_batch

from nanoserve.kernels import cpu_attention, cpu_layer_ops, reference

FP8 = torch.float8_e4m3fn
RMS, MAX_ABS = 0.05, 0.25


def quantized(k_cache, v_cache, k_scale, v_scale):
    return reference.to_cache(k_cache, FP8, k_scale), reference.to_cache(v_cache, FP8, v_scale)


seqs_strategy = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None)
@given(seqs=seqs_strategy, kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]),
       head_dim=st.sampled_from([8, 16, 64]), block_size=st.sampled_from([4, 16]),
       k_scale=st.sampled_from([1.0, 0.05, 3.0]), v_scale=st.sampled_from([1.0, 0.25]))
def test_fp8_attention_is_attention_over_the_dequantized_cache(seqs, kv_heads, group, head_dim,
                                                               block_size, k_scale, v_scale):
    q, k, v, attn = paged_batch(seqs, kv_heads * group, kv_heads, head_dim, block_size,
                                torch.float32, "cpu")
    k8, v8 = quantized(k, v, k_scale, v_scale)
    scale = head_dim ** -0.5
    got = reference.paged_attention(q, k8, v8, attn, scale, k_scale, v_scale)
    deq = reference.paged_attention(q, k8.float() * k_scale, v8.float() * v_scale, attn, scale)
    torch.testing.assert_close(got, deq, **TOL[torch.float32])
    exact = reference.paged_attention(q, k, v, attn, scale)
    assert (got - exact).pow(2).mean().sqrt() < RMS
    assert (got - exact).abs().max() < MAX_ABS
    # the CPU backend (the C++ decode attention reading e4m3, prefill rows as the reference does
    # them) gives the reference's answer, where the C++ ops build (cpu_build.py)
    if cpu_attention.available():
        torch.testing.assert_close(cpu_attention.paged_attention(q, k8, v8, attn, scale, k_scale, v_scale),
                                   got, **TOL[torch.float32])


@settings(max_examples=20, deadline=None)
@given(lens=st.lists(st.integers(1, 70), min_size=1, max_size=6), kv_heads=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 3, 4, 7]), head_dim=st.sampled_from([32, 64, 128, 192]),
       block_size=st.sampled_from([1, 5, 16, 32]), k_scale=st.sampled_from([1.0, 0.05]),
       v_scale=st.sampled_from([1.0, 0.25]))
def test_bf16_queries_over_an_fp8_cache(lens, kv_heads, group, head_dim, block_size, k_scale, v_scale):
    """bf16 queries: on a CPU with AVX512-BF16 and VBMI the C++ op looks each code up as its bf16
    value and runs the bf16 kernel's dot products (head_dim a multiple of 64: 192 checks a third
    64-value chunk; 32 takes the generic path); elsewhere the generic path. Either gives the
    reference's attention over the dequantized cache to bf16's tolerance."""
    if not cpu_attention.available():
        pytest.skip("C++ ops not built")
    q, k, v, attn = paged_batch([(n - 1, 1) for n in lens], kv_heads * group, kv_heads, head_dim,
                                block_size, torch.bfloat16, "cpu")
    k8, v8 = quantized(k.float(), v.float(), k_scale, v_scale)
    scale = head_dim ** -0.5
    want = reference.paged_attention(q, k8, v8, attn, scale, k_scale, v_scale)
    got = cpu_attention.paged_attention(q, k8, v8, attn, scale, k_scale, v_scale)
    torch.testing.assert_close(got.float(), want.float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_write_stores_k_over_scale_saturated(backend, dtype):
    write = reference.reshape_and_cache if backend == "reference" else cpu_layer_ops.reshape_and_cache
    T, H, D, nb, bs = 6, 2, 16, 4, 4
    k = (torch.randn(T, H, D) * 3).to(dtype)
    v = torch.randn(T, H, D).to(dtype)
    k[0, 0, 0], k[1, 1, 3], v[3, 0, 5] = 1e6, -1e6, 1e6  # beyond e4m3's 448 even after the scale
    slots = torch.tensor([5, 0, -1, 15, 8, 2])
    k_cache = torch.full((nb, bs, H, D), float("nan")).to(FP8)
    v_cache = torch.full((nb, bs, H, D), float("nan")).to(FP8)
    write(k, v, k_cache, v_cache, slots, k_scale=0.5, v_scale=2.0)
    flat_k, flat_v = k_cache.view(-1, H, D).float(), v_cache.view(-1, H, D).float()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        want_k = (k[t].float() / 0.5).clamp(-448, 448).to(FP8).float()
        want_v = (v[t].float() / 2.0).clamp(-448, 448).to(FP8).float()
        assert torch.equal(flat_k[slot], want_k) and torch.equal(flat_v[slot], want_v), f"token {t}"
    assert flat_k[5, 0, 0] == 448 and flat_k[0, 1, 3] == -448 and flat_v[15, 0, 5] == 448
    written = torch.zeros(nb * bs, dtype=torch.bool)
    written[[s for s in slots.tolist() if s >= 0]] = True
    assert flat_k[~written].isnan().all(), "a slot not in slot_mapping was written"


def test_an_fp8_cache_holds_a_value_in_one_byte():
    k = torch.randn(3, 2, 8)
    assert reference.to_cache(k, FP8).element_size() == 1
    assert torch.equal(reference.from_cache(reference.to_cache(k, torch.float32), torch.float32), k)


@pytest.mark.parametrize("case", ["decode", "mixed", "long_chunk"])
def test_triton_fp8_cache_write_and_attention_match_the_reference(triton_ops, device, case):
    seqs = CASES[case]
    q, k, v, attn = paged_batch(seqs, 4, 2, 16, 16, torch.float32, device)
    k_scale, v_scale = 0.5, 2.0
    T = q.shape[0]
    new_k, new_v = torch.randn(T, 2, 16, device=device) * 4, torch.randn(T, 2, 16, device=device)
    if device == "cpu":
        # the interpreter's fp32 -> e4m3 cast rounds some values wrongly (it drops the carry
        # when rounding up reaches a power of two: 7.9 -> 4; subnormals too); a GPU converts in
        # hardware. There, values e4m3 holds exactly (times the power-of-two scales) test the
        # kernel's scaling, saturation and slots, not the cast's rounding
        new_k = reference.to_cache(new_k, FP8).float() * k_scale
        new_v = reference.to_cache(new_v, FP8).float() * v_scale
    new_k[1, 0, :2] = torch.tensor([1e4, -1e4])  # saturates at +-448
    slots = torch.randperm(k.shape[0] * k.shape[1], device=device)[:T]
    slots[0] = -1
    caches = {}
    for name, write in (("reference", reference.reshape_and_cache),
                        ("triton", triton_ops.reshape_and_cache)):
        k8, v8 = quantized(k, v, k_scale, v_scale)
        write(new_k, new_v, k8, v8, slots, k_scale=k_scale, v_scale=v_scale)
        caches[name] = (k8, v8)
    for ref, got in zip(caches["reference"], caches["triton"]):
        ref, got = ref.float(), got.float()
        # round to nearest even both ways: on a GPU a tie may still round apart, rarely
        assert (ref != got).float().mean() <= (0 if device == "cpu" else 1e-3)
    k8, v8 = caches["reference"]
    want = reference.paged_attention(q, k8, v8, attn, 0.25, k_scale, v_scale)
    got = triton_ops.paged_attention(q, k8, v8, attn, 0.25, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
def test_a_nan_written_to_an_fp8_cache_stays_nan(request, backend):
    """A clamp to +-448 must not turn NaN into a number (GPU min/max drop NaN unless told)."""
    if backend == "triton":
        device = request.getfixturevalue("device")
        if device == "cpu":
            pytest.skip("the interpreter's fp32 -> e4m3 cast turns NaN into a number; a GPU casts "
                        "in hardware")
        write = request.getfixturevalue("triton_ops").reshape_and_cache
    elif backend == "cpu":
        if not request.getfixturevalue("cpu_ops"):
            pytest.skip("C++ ops not built")
        write, device = cpu_layer_ops.reshape_and_cache, "cpu"
    else:
        write, device = reference.reshape_and_cache, "cpu"
    k = torch.randn(2, 1, 16, device=device)
    v = torch.randn(2, 1, 16, device=device)
    k[0, 0, 3], v[1, 0, 7] = float("nan"), float("nan")
    k_cache, v_cache = (torch.zeros(2, 4, 1, 16, device=device).to(FP8) for _ in range(2))
    write(k, v, k_cache, v_cache, torch.tensor([1, 6], device=device), k_scale=0.5, v_scale=2.0)
    k8, v8 = k_cache.view(-1, 16).float(), v_cache.view(-1, 16).float()
    assert k8[1, 3].isnan() and v8[6, 7].isnan()
    assert k8.isnan().sum() == 1 and v8.isnan().sum() == 1


def test_bf16_queries_read_an_fp8_cache_as_bf16_where_the_cpu_can(cpu_ops):
    """The build targets this CPU (-march=native): with AVX512-BF16 and AVX512-VBMI the fp8 read is
    the bf16 lookup. A guard that drops it would pass every numeric test, slower."""
    if not cpu_ops:
        pytest.skip("C++ ops not built")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(ln for ln in f if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags to check against")
    both = "avx512_bf16" in flags and "avx512vbmi" in flags
    assert cpu_attention.fp8_cache_read() == ("bf16 lookup" if both else "fp32 widening")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_e4m3_code_is_read_as_its_value(cpu_ops, dtype):
    """One key, so the output is its V row times v_scale exactly; that row holds all 256 codes (two
    kv heads of 128), subnormals and NaN included: the C++ read converts each as torch does (into
    fp32, or looked up as bf16 for bf16 queries)."""
    if not cpu_ops:
        pytest.skip("C++ ops not built")
    q, k, v, attn = paged_batch([(0, 1)], 2, 2, 128, 16, dtype, "cpu")
    k8, v8 = quantized(k.float(), v.float(), 1.0, 1.0)
    block = int(attn.block_tables[0, 0])
    v8[block, 0] = torch.arange(256, dtype=torch.uint8).view(FP8).view(2, 128)
    got = cpu_attention.paged_attention(q, k8, v8, attn, 0.1, 1.0, 2.0)
    torch.testing.assert_close(got[0].float(), v8[block, 0].float() * 2.0, rtol=0, atol=0, equal_nan=True)
