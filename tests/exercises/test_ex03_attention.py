"""Exercise 3 (attention over the mixed batch), checked against reference.paged_attention.

The basic cases have as many kv heads as query heads, so a grouped-query (GQA) slip fails only
the GQA tasks; every message starts with the error and names the token, its request and the
query heads that differ.
"""

from dataclasses import replace

import pytest
import torch
from exercise_checks import drive, graded, make_engine, workload
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.kernels import AttentionMetadata, reference, use_kernels
from nanoserve.presets import preset_config


@pytest.fixture(scope="module")
def ex(load):
    return load("ex03_attention")


def batch(seqs, num_heads=2, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=40, dtype=torch.float32):
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
    return q, k_cache, v_cache, attn, head_dim ** -0.5


def one_request(attend_one_request):
    """paged_attention's arguments -> attend_one_request on the (single) request's gathered context."""
    def run(q, k_cache, v_cache, attn, scale):
        (seq_len,) = attn.seq_lens.tolist()
        k, v = (reference.gather_kv(c, attn.block_tables[0], seq_len) for c in (k_cache, v_cache))
        return attend_one_request(q, k, v, scale)
    return run


def check(fn, seqs, what, cpu_lists=(True, False), **shape):
    """fn(paged_attention's arguments) must match the reference on the batch `seqs`."""
    q, k_cache, v_cache, attn, scale = batch(seqs, **shape)
    want = reference.paged_attention(q, k_cache, v_cache, attn, scale)
    qsl, lens = attn.query_start_loc.tolist(), attn.seq_lens.tolist()
    for with_lists in cpu_lists:
        lists = dict(query_start_loc_cpu=qsl, seq_lens_cpu=lens) if with_lists else {}
        got = fn(q, k_cache, v_cache, replace(attn, **lists), scale)
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"output {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}: {what}")
        tol = dict(atol=2e-5, rtol=1e-4) if want.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        bad = ~torch.isclose(got.float(), want.float(), **tol).all(-1)  # (T, num_heads): rows that differ
        if bad.any():
            t = int(bad.any(-1).nonzero()[0])
            b = next(i for i in range(len(seqs)) if qsl[i] <= t < qsl[i + 1])
            pos = lens[b] - seqs[b][0] + t - qsl[b]
            err = (got[t].float() - want[t].float()).abs().max()
            heads = bad[t].nonzero().flatten().tolist()
            raise AssertionError(
                f"off by {err:.2g} at token {t} (request {b}, position {pos}: {seqs[b][0]} new after "
                f"{seqs[b][1]} cached), query heads {heads} of {q.shape[1]}: {what}")


def gqa(num_heads, num_kv_heads):
    g = num_heads // num_kv_heads
    return f"GQA, {num_heads} query heads over {num_kv_heads} kv heads: head h reads kv head h // {g}"


# -- task 1: one request, its context already gathered -------------------------------------------

def test_one_request_whole_prompt(ex):
    check(one_request(ex.attend_one_request), [(6, 0)], "a whole 6-token prompt (causal mask)", [True])


def test_one_request_decode(ex):
    check(one_request(ex.attend_one_request), [(1, 9)], "one decode token sees all 10 keys", [True])


def test_one_request_chunk_after_cached_tokens(ex):
    check(one_request(ex.attend_one_request), [(3, 4)],
          "3 new tokens after 4 cached: positions 4, 5, 6 (the mask is offset by 4)", [True])


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (6, 2), (4, 1)])
def test_one_request_grouped_query_attention(ex, num_heads, num_kv_heads):
    check(one_request(ex.attend_one_request), [(3, 4)], gqa(num_heads, num_kv_heads), [True],
          num_heads=num_heads, num_kv_heads=num_kv_heads)


# -- task 2: the flattened batch through the paged cache -----------------------------------------

def test_decode_tokens(ex):
    check(ex.paged_attention, [(1, 6), (1, 0), (1, 13), (1, 3)], "a batch of decode tokens")


def test_whole_prompts(ex):
    check(ex.paged_attention, [(5, 0), (9, 0), (1, 0)], "whole prompts prefilled from scratch")


def test_chunks_after_a_cached_prefix(ex):
    check(ex.paged_attention, [(3, 4), (6, 9), (2, 1)], "prefill chunks after cached tokens")


def test_mixed_batch_of_decodes_and_chunks(ex):
    check(ex.paged_attention, [(1, 9), (7, 0), (1, 2), (4, 8), (1, 0)], "a mixed batch")


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (6, 2), (4, 1)])
def test_grouped_query_attention(ex, num_heads, num_kv_heads):
    check(ex.paged_attention, [(1, 5), (4, 3)], gqa(num_heads, num_kv_heads),
          num_heads=num_heads, num_kv_heads=num_kv_heads)


def test_bfloat16(ex):
    check(ex.paged_attention, [(1, 7), (5, 2)], "bf16 inputs (softmax in fp32, output in bf16)",
          dtype=torch.bfloat16)


@graded(25)
@given(seqs=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 12)), min_size=1, max_size=5),
       block_size=st.sampled_from([1, 4, 8]), heads=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([4, 16]))
def test_random_batches(ex, seqs, block_size, heads, head_dim):
    check(ex.paged_attention, seqs, f"random batch, block_size {block_size}", num_heads=heads,
          num_kv_heads=heads, head_dim=head_dim, block_size=block_size, num_blocks=64)


def test_engine_generates_the_same_tokens_with_your_attention(ex):
    """Plugged into the engine (chunked prefill, prefix cache hits): greedy ids unchanged. The
    model is preset:tiny with as many kv heads as query heads: GQA has tasks of its own."""
    tiny = preset_config("tiny")
    model = replace(tiny, num_key_value_heads=tiny.num_attention_heads)
    reqs = workload(seed=3, num_requests=6, prompt_lens=(3, 40), max_tokens=(2, 6))
    cfg = dict(enable_chunked_prefill=True, max_num_batched_tokens=16, model=model)
    want = [o.token_ids for o in drive(make_engine(**cfg), reqs)]
    engine = make_engine(**cfg)
    use_kernels(engine, paged_attention=ex.paged_attention)
    got = [o.token_ids for o in drive(engine, reqs)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"request {i} generated {g} with your attention, {w} with the reference's"
