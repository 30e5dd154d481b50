"""Exercise 3 (attention over the mixed batch), checked against reference.paged_attention."""

from dataclasses import replace

import pytest
import torch
from exercise_checks import drive, graded, make_engine, workload
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.kernels import AttentionMetadata, reference, use_kernels


@pytest.fixture(scope="module")
def ex(load):
    return load("ex03_attention")


def batch(seqs, num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=40, dtype=torch.float32):
    """seqs: [(q_len, cached_len)]. -> the paged_attention arguments, caches filled at random."""
    g = torch.Generator().manual_seed(len(seqs) * 1000 + sum(q + c for q, c in seqs))
    lens = [q + c for q, c in seqs]
    width = max(-(-n // block_size) for n in lens)
    num_blocks = max(num_blocks, len(seqs) * width)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm[:len(seqs) * width].view(len(seqs), width).to(torch.int32)  # distinct blocks
    qsl = [0]
    for q, _ in seqs:
        qsl.append(qsl[-1] + q)
    q = torch.randn(qsl[-1], num_heads, head_dim, generator=g).to(dtype)
    attn = AttentionMetadata(torch.tensor(qsl, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
                             tables)
    return (q, k_cache, v_cache, attn, head_dim ** -0.5), qsl, lens


def check(ex, seqs, what, **shape):
    (q, k_cache, v_cache, attn, scale), qsl, lens = batch(seqs, **shape)
    want = reference.paged_attention(q, k_cache, v_cache, attn, scale)
    for cpu_lists in ((qsl, lens), (None, None)):
        attn = replace(attn, query_start_loc_cpu=cpu_lists[0], seq_lens_cpu=cpu_lists[1])
        got = ex.paged_attention(q, k_cache, v_cache, attn, scale)
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"{what}: output {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}")
        tol = dict(atol=2e-5, rtol=1e-4) if want.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        bad = ~torch.isclose(got.float(), want.float(), **tol).all(-1).all(-1)  # (T,) tokens that differ
        if bad.any():
            t = int(bad.nonzero()[0])
            b = next(i for i in range(len(seqs)) if qsl[i] <= t < qsl[i + 1])
            pos = lens[b] - seqs[b][0] + t - qsl[b]
            raise AssertionError(
                f"{what}: token {t} (request {b}: {seqs[b][0]} new tokens after {seqs[b][1]} cached, "
                f"this one at position {pos}) differs from the reference by "
                f"{(got[t].float() - want[t].float()).abs().max():.3g}")


def test_decode_tokens(ex):
    check(ex, [(1, 6), (1, 0), (1, 13), (1, 3)], "a batch of decode tokens")


def test_whole_prompts(ex):
    check(ex, [(5, 0), (9, 0), (1, 0)], "whole prompts prefilled from scratch")


def test_chunks_after_a_cached_prefix(ex):
    check(ex, [(3, 4), (6, 9), (2, 1)], "prefill chunks after cached tokens (causal mask offset)")


def test_mixed_batch_of_decodes_and_chunks(ex):
    check(ex, [(1, 9), (7, 0), (1, 2), (4, 8), (1, 0)], "a mixed batch")


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (4, 1), (6, 2)])
def test_grouped_query_attention(ex, num_heads, num_kv_heads):
    check(ex, [(1, 5), (4, 3)], f"{num_heads} query heads over {num_kv_heads} kv heads",
          num_heads=num_heads, num_kv_heads=num_kv_heads)


def test_bfloat16(ex):
    check(ex, [(1, 7), (5, 2)], "bf16 inputs", dtype=torch.bfloat16)


@graded(25)
@given(seqs=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 12)), min_size=1, max_size=5),
       block_size=st.sampled_from([1, 4, 8]), heads=st.sampled_from([(2, 1), (4, 2), (2, 2)]),
       head_dim=st.sampled_from([4, 16]))
def test_random_batches(ex, seqs, block_size, heads, head_dim):
    check(ex, seqs, f"random batch {seqs}, block_size {block_size}", num_heads=heads[0],
          num_kv_heads=heads[1], head_dim=head_dim, block_size=block_size, num_blocks=64)


def test_engine_generates_the_same_tokens_with_your_attention(ex):
    """Plugged into the engine (chunked prefill, prefix cache hits): greedy ids unchanged."""
    reqs = workload(seed=3, num_requests=6, prompt_lens=(3, 40), max_tokens=(2, 6))
    cfg = dict(enable_chunked_prefill=True, max_num_batched_tokens=16)
    want = [o.token_ids for o in drive(make_engine(**cfg), reqs)]
    engine = make_engine(**cfg)
    use_kernels(engine, paged_attention=ex.paged_attention)
    got = [o.token_ids for o in drive(engine, reqs)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"with your attention request {i} generated {g}, the reference attention {w}"
