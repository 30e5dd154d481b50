"""Each Triton kernel against its torch reference (the specification), plus known answers.

On CPU the kernels run under the Triton interpreter, which costs time per program instance, so
the shapes are tiny. Outputs come from NaN-poisoned allocations (`poisoned`), so an element a
kernel forgets to write fails the comparison. The interpreter rounds fp32 -> bf16 by truncation
(a GPU rounds to nearest), hence the looser bf16 tolerance.
"""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_cases import CASES, TOL, loop_attention, paged_batch

from nanoserve.kernels import reference

# ---------------------------------------------------------------- rms_norm

@pytest.mark.parametrize("shape", [(1, 16), (7, 33), (3, 4, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(triton_ops, device, poisoned, shape, dtype, with_residual):
    x = torch.randn(shape, device=device).to(dtype)
    weight = torch.randn(shape[-1], device=device).to(dtype)
    residual = torch.randn_like(x) if with_residual else None
    got = triton_ops.rms_norm(x, weight, 1e-6, residual)
    want = reference.rms_norm(x, weight, 1e-6, residual)
    if with_residual:
        torch.testing.assert_close(got[1], want[1], **TOL[dtype])
        got, want = got[0], want[0]
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_rms_norm_of_a_strided_view(triton_ops, device, poisoned):
    qkv = torch.randn(5, 3 * 2 * 16, device=device)
    q = qkv[:, :2 * 16].view(5, 2, 16)  # the qk-norm input: a view into the fused projection
    weight = torch.randn(16, device=device)
    torch.testing.assert_close(triton_ops.rms_norm(q, weight, 1e-6),
                               reference.rms_norm(q, weight, 1e-6), **TOL[torch.float32])


def test_rms_norm_of_a_constant_vector_is_the_weight(triton_ops, device, poisoned):
    x = torch.full((3, 24), 1.0, device=device)
    weight = torch.arange(24, dtype=torch.float32, device=device)
    out, residual = triton_ops.rms_norm(x, weight, 0.0, residual=torch.ones_like(x))
    assert torch.equal(residual, torch.full_like(x, 2.0))
    assert torch.equal(out, weight.expand(3, 24))  # 2 / sqrt(mean(2^2)) == 1 exactly


# ---------------------------------------------------------------- silu_and_mul

@pytest.mark.parametrize("shape", [(1, 2 * 16), (5, 2 * 40), (2, 3, 2 * 1100)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_and_mul_matches_reference(triton_ops, device, poisoned, shape, dtype):
    """1100 values a row: two program instances across it, the second partly masked."""
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    got = triton_ops.silu_and_mul(x)
    assert got.shape == (*shape[:-1], shape[-1] // 2)
    torch.testing.assert_close(got, reference.silu_and_mul(x), **TOL[dtype])


# ---------------------------------------------------------------- rotary_embedding

def cos_sin_cache(max_pos: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = base ** -(torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)  # (max_pos, head_dim/2)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # (max_pos, head_dim)


@pytest.mark.parametrize("T, num_heads, num_kv_heads, head_dim",
                         [(1, 1, 1, 16), (5, 4, 2, 32), (9, 3, 1, 24)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rotary_matches_reference(triton_ops, device, poisoned, T, num_heads, num_kv_heads,
                                  head_dim, dtype):
    qkv = torch.randn(T, (num_heads + 2 * num_kv_heads) * head_dim, device=device).to(dtype)
    q = qkv[:, :num_heads * head_dim].view(T, num_heads, head_dim)  # strided, as in the model
    k = qkv[:, num_heads * head_dim:][:, :num_kv_heads * head_dim].view(T, num_kv_heads, head_dim)
    positions = torch.randint(0, 100, (T,), device=device)
    cache = cos_sin_cache(100, head_dim).to(device)
    for got, want in zip(triton_ops.rotary_embedding(positions, q, k, cache),
                         reference.rotary_embedding(positions, q, k, cache)):
        torch.testing.assert_close(got, want, **TOL[dtype])


def test_rotary_known_angles(triton_ops, device, poisoned):
    cache = torch.zeros(2, 8, device=device)
    cache[0, :4] = 1.0  # position 0: cos 1, sin 0 (identity)
    cache[1, 4:] = 1.0  # position 1: cos 0, sin 1 (a quarter turn: (x1, x2) -> (-x2, x1))
    q = torch.randn(2, 1, 8, device=device)
    k = torch.randn(2, 1, 8, device=device)
    q_out, k_out = triton_ops.rotary_embedding(torch.tensor([0, 1], device=device), q, k, cache)
    for x, out in ((q, q_out), (k, k_out)):
        assert torch.equal(out[0], x[0])
        assert torch.equal(out[1], torch.cat((-x[1, :, 4:], x[1, :, :4]), dim=-1))


# ---------------------------------------------------------------- reshape_and_cache

@pytest.mark.parametrize("dtype, cache_dtype", [(torch.float32, torch.float32),
                                                (torch.float32, torch.float16),
                                                (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("num_kv_heads, head_dim, block_size", [(1, 16, 4), (3, 24, 8)])
def test_reshape_and_cache_matches_reference(triton_ops, device, dtype, cache_dtype,
                                             num_kv_heads, head_dim, block_size):
    T, num_blocks = 11, 5
    kv = torch.randn(T, 2 * num_kv_heads * head_dim, device=device).to(dtype)
    k, v = (t.view(T, num_kv_heads, head_dim) for t in kv.chunk(2, dim=-1))  # strided views
    slots = torch.randperm(num_blocks * block_size, device=device)[:T]
    slots[[2, 7]] = -1  # padding tokens: must not be written
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, float("nan"), dtype=cache_dtype, device=device) for _ in range(4)]
    triton_ops.reshape_and_cache(k, v, caches[0], caches[1], slots)
    reference.reshape_and_cache(k, v, caches[2], caches[3], slots)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------- paged_attention

@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 2), (6, 2), (8, 2)])
def test_paged_attention_matches_reference(triton_ops, device, poisoned, case, num_heads,
                                           num_kv_heads):
    batch = paged_batch(CASES[case], num_heads, num_kv_heads, 24, 8, torch.float32, device)
    got = triton_ops.paged_attention(*batch, scale=24 ** -0.5)
    torch.testing.assert_close(got, reference.paged_attention(*batch, 24 ** -0.5),
                               **TOL[torch.float32])


@pytest.mark.parametrize("dtype, block_size, head_dim", [
    (torch.float16, 16, 32), (torch.bfloat16, 8, 16), (torch.float32, 5, 24), (torch.float16, 4, 20)])
def test_paged_attention_dtypes_and_block_sizes(triton_ops, device, poisoned, dtype, block_size,
                                                head_dim):
    seqs = CASES["mixed"]
    batch = paged_batch(seqs, 4, 1, head_dim, block_size, dtype, device)
    q, k_cache, v_cache, attn = batch
    with_lists = replace(attn, query_start_loc_cpu=attn.query_start_loc.tolist(),
                         seq_lens_cpu=attn.seq_lens.tolist())
    got = triton_ops.paged_attention(q, k_cache, v_cache, with_lists, head_dim ** -0.5)
    torch.testing.assert_close(got, reference.paged_attention(*batch, head_dim ** -0.5), **TOL[dtype])


@settings(max_examples=8, deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([1, 1, 2, 5, 17])),
                     min_size=1, max_size=4),
       group=st.sampled_from([1, 2, 3, 4]), num_kv_heads=st.integers(1, 2),
       head_dim=st.sampled_from([16, 20, 32]), block_size=st.sampled_from([4, 8, 16]))
def test_paged_attention_random_batches(triton_ops, device, seqs, group, num_kv_heads, head_dim,
                                        block_size):
    batch = paged_batch(seqs, group * num_kv_heads, num_kv_heads, head_dim, block_size,
                        torch.float32, device)
    torch.testing.assert_close(triton_ops.paged_attention(*batch, 0.3),
                               reference.paged_attention(*batch, 0.3), **TOL[torch.float32])


def test_attention_to_a_single_key_returns_its_value(triton_ops, device, poisoned):
    q, k_cache, v_cache, attn = paged_batch([(0, 1)], 4, 2, 16, 4, torch.float32, device)
    out = triton_ops.paged_attention(q, k_cache, v_cache, attn, 1.0)
    v = v_cache[attn.block_tables[0, 0], 0]  # (num_kv_heads, head_dim)
    assert torch.equal(out[0], v.repeat_interleave(2, dim=0))


def test_zero_queries_average_the_visible_values(triton_ops, device, poisoned):
    context, n = 5, 6  # a chunk starting mid-block: causal mask offset by the cached prefix
    q, k_cache, v_cache, attn = paged_batch([(context, n)], 2, 1, 16, 4, torch.float32, device)
    out = triton_ops.paged_attention(torch.zeros_like(q), k_cache, v_cache, attn, 1.0)
    v = reference.gather_kv(v_cache, attn.block_tables[0], context + n)[:, 0]  # (L, head_dim)
    for j in range(n):
        want = v[:context + j + 1].mean(0)
        torch.testing.assert_close(out[j], want.expand(2, 16), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("bug", [dict(see_ahead=1), dict(skip_context=True),
                                 dict(kv_head_of=lambda h, group, num_kv_heads: h % num_kv_heads)])
def test_cases_catch_plausible_bugs(device, bug):
    """The comparison cases above are sharp enough: each mutant disagrees with the reference."""
    seqs = CASES["mixed"]
    q, k_cache, v_cache, attn = paged_batch(seqs, 4, 2, 16, 8, torch.float32, device)
    want = reference.paged_attention(q, k_cache, v_cache, attn, 0.25)
    args = (q, k_cache, v_cache, attn.block_tables, seqs, 0.25)
    torch.testing.assert_close(loop_attention(*args), want, **TOL[torch.float32])
    assert not torch.allclose(loop_attention(*args, **bug), want, atol=1e-3)


def test_kernels_in_a_fresh_process(in_process):
    """Only when triton was imported in this process before the interpreter could be chosen."""
    if in_process:
        pytest.skip("the kernels ran in this process")
    assert "NANOSERVE_KERNEL_TESTS_CHILD" not in os.environ, "no interpreter even in a fresh process"
    env = dict(os.environ, TRITON_INTERPRET="1", NANOSERVE_KERNEL_TESTS_CHILD="1")
    here = Path(__file__).parent
    run = subprocess.run([sys.executable, "-m", "pytest", str(here), "-q", "-p", "no:cacheprovider"],
                         cwd=here.parent.parent, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
