"""The C++ decode attention (cpu_attention.cpp) against the torch reference and the token loop.

Shapes cover both ways the op splits work (a work item per sequence when there are enough
sequences for every thread, else per sequence and kv head), head_dim 64 and 128 (fixed at compile
time) and 32 (read at run time), GQA groups of 1 to 4, block sizes that do and don't divide the
context, q as a strided view of a fused qkv row, and fp32/bf16/fp16 caches. Outputs start as NaN,
so an element the op forgets to write fails.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_cases import CASES, TOL, loop_attention, paged_batch

from nanoserve.kernels import cpu_attention, reference

pytestmark = pytest.mark.skipif(not cpu_attention.available(),
                                reason=f"C++ op not built: {cpu_attention.unavailable_reason()}")


def decode_batch(lens, num_heads, num_kv_heads, head_dim, block_size, dtype, strided_q=True):
    """q (D, kvh, g, hd) for one decode token per sequence, optionally a view into wider rows
    as the fused qkv projection gives it, over a shuffled paged cache; NaN-filled output."""
    q, k_cache, v_cache, attn = paged_batch([(n - 1, 1) for n in lens], num_heads, num_kv_heads,
                                            head_dim, block_size, dtype, "cpu")
    if strided_q:
        wide = torch.randn(len(lens), (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
        wide[:, :num_heads * head_dim] = q.flatten(1)
        q = wide[:, :num_heads * head_dim].view(len(lens), num_heads, head_dim)
    qd = q.view(len(lens), num_kv_heads, num_heads // num_kv_heads, head_dim)
    od = torch.full(qd.shape, float("nan"), dtype=dtype)
    return qd, od, k_cache, v_cache, attn.block_tables, attn.seq_lens


def reference_decode(qd, k_cache, v_cache, tables, lens, scale):
    """The reference's answer for single-token queries qd (D, kvh, g, hd), a sequence at a time."""
    D, kvh, g, hd = qd.shape
    rows = [reference.sequence_attention(qd[i].reshape(1, kvh * g, hd), k_cache, v_cache, tables[i],
                                         lens[i], scale) for i in range(D)]
    return torch.cat(rows).view_as(qd)


@pytest.mark.parametrize("D", [1, 3, 17])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(12, 4, 64), (4, 4, 128), (8, 2, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_op_matches_the_reference(D, num_heads, num_kv_heads, head_dim, dtype):
    torch.manual_seed(D)
    lens = torch.randint(1, 90, (D,)).tolist()
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch(lens, num_heads, num_kv_heads,
                                                              head_dim, 16, dtype)
    cpu_attention.decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, lens, 0.125)
    want = reference_decode(qd, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(od, want, **TOL[dtype])


@settings(max_examples=10, deadline=None)
@given(lens=st.lists(st.integers(1, 70), min_size=1, max_size=12), group=st.sampled_from([1, 2, 3, 4]),
       num_kv_heads=st.integers(1, 3), head_dim=st.sampled_from([8, 16, 64]),
       block_size=st.sampled_from([1, 5, 16]), strided_q=st.booleans())
def test_op_matches_the_token_loop(lens, group, num_kv_heads, head_dim, block_size, strided_q):
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch(
        lens, group * num_kv_heads, num_kv_heads, head_dim, block_size, torch.float32, strided_q)
    cpu_attention.decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, lens, 0.3)
    want = loop_attention(qd.reshape(len(lens), -1, head_dim), k_cache, v_cache, tables,
                          [(n - 1, 1) for n in lens], 0.3)
    torch.testing.assert_close(od.view_as(want), want, **TOL[torch.float32])


@settings(max_examples=10, deadline=None)
@given(lens=st.lists(st.integers(1, 70), min_size=1, max_size=12), group=st.sampled_from([1, 3]),
       num_kv_heads=st.integers(1, 3), head_dim=st.sampled_from([32, 64, 128]),
       block_size=st.sampled_from([1, 5, 16, 32]))
def test_bf16_matches_the_token_loop(lens, group, num_kv_heads, head_dim, block_size):
    """bf16 caches: on a CPU with AVX512-BF16 the op pairs tokens (odd blocks end in a half pair)
    and reads 16 keys at a time (blocks of 32 hold two such runs); elsewhere the generic path."""
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch(
        lens, group * num_kv_heads, num_kv_heads, head_dim, block_size, torch.bfloat16)
    cpu_attention.decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, lens, 0.3)
    want = loop_attention(qd.reshape(len(lens), -1, head_dim), k_cache, v_cache, tables,
                          [(n - 1, 1) for n in lens], 0.3)
    torch.testing.assert_close(od.view_as(want).float(), want.float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("group", range(1, 9))
@pytest.mark.parametrize("head_dim, block_size", [(64, 5), (64, 16), (128, 7)])
def test_bf16_gqa_groups(group, head_dim, block_size):
    """Every GQA group size, odd and even context lengths and block sizes: the bf16 V pass takes
    a kv head's query heads up to four at a time (two at head_dim 128), a group of 7 as 4 + 3."""
    lens = [1, 2, 17, 30, 33, 48]
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch(
        lens, group * 2, 2, head_dim, block_size, torch.bfloat16)
    cpu_attention.decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, lens, 0.3)
    want = loop_attention(qd.reshape(len(lens), -1, head_dim), k_cache, v_cache, tables,
                          [(n - 1, 1) for n in lens], 0.3)
    torch.testing.assert_close(od.view_as(want).float(), want.float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("D", [3, 17])
def test_threads_and_work_split_do_not_change_a_bit(D):
    """Each query head's output is computed by one thread in the same order, however the
    sequences are split into work items (per kv head below 4 sequences a thread, else whole)."""
    torch.manual_seed(D)
    lens = torch.randint(1, 90, (D,)).tolist()
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch(lens, 12, 4, 64, 16, torch.float32)
    outs, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2, 8):
            torch.set_num_threads(n)
            cpu_attention.decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, lens, 0.125)
            outs.append(od.clone())
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_a_softmax_of_huge_scores_stays_finite():
    """Scores of +-1e4: the max is subtracted before e^x, and e^(very negative) is 0, not NaN."""
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch([40, 7], 4, 2, 16, 4, torch.float32)
    qd = qd * 1e3
    cpu_attention.decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, [40, 7], 1.0)
    want = reference_decode(qd, k_cache, v_cache, tables, [40, 7], 1.0)
    torch.testing.assert_close(od, want, **TOL[torch.float32])


VERIFY = [(30, 1), (40, 5), (17, 8), (2, 3), (9, 9)]  # decodes, then verifies of 2-7 drafts, a chunk


@pytest.mark.parametrize("seqs", [CASES["decode"], CASES["mixed"], CASES["prefill"], VERIFY])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_of_mixed_batches(seqs, dtype):
    """Decode rows and sequences of up to MULTI_QUERY_ROWS query tokens from the op, longer
    prefills from the reference, all in their places."""
    batch = paged_batch(seqs, 6, 2, 16, 4, dtype, "cpu")
    got = cpu_attention.paged_attention(*batch, 0.25)
    torch.testing.assert_close(got, reference.paged_attention(*batch, 0.25), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_verify_row_equals_the_decode_step_it_replaces(dtype):
    """Row j of a 5-token verify, computed beside the others, is bit for bit what a lone decode
    of that token (its context: the cached tokens and drafts 0..j) computes."""
    q, k_cache, v_cache, attn = paged_batch([(40, 5)], 6, 2, 16, 4, dtype, "cpu")
    got = cpu_attention.paged_attention(q, k_cache, v_cache, attn, 0.25)
    for j in range(5):
        qd = q[j:j + 1].view(1, 2, 3, 16)
        od = torch.empty_like(qd)
        n = 40 + j + 1
        cpu_attention.decode_attention(qd, od, k_cache, v_cache, attn.block_tables, torch.tensor([n]), [n],
                                       0.25)
        assert torch.equal(got[j], od.view(6, 16)), j


def test_shapes_the_op_does_not_take_go_to_the_torch_path(monkeypatch):
    """head_dim 20 is not whole 8-float vectors: grouped_decode_attention computes it, same answer."""
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch([9, 30], 4, 2, 20, 4, torch.float32)
    monkeypatch.setattr(torch.ops.nanoserve_cpu, "decode_attention", None, raising=False)
    cpu_attention.decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, [9, 30], 0.2)
    want = reference_decode(qd, k_cache, v_cache, tables, [9, 30], 0.2)
    torch.testing.assert_close(od, want, **TOL[torch.float32])


def test_the_op_refuses_what_it_cannot_read():
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch([9], 4, 2, 16, 4, torch.float32)
    q = qd.reshape(1, 4, 16)
    with pytest.raises(RuntimeError, match="int32"):
        torch.ops.nanoserve_cpu.decode_attention(q, od.view(1, 4, 16), k_cache, v_cache,
                                                 tables.long(), seq_lens, 0.2)
    with pytest.raises(RuntimeError, match="dtype"):
        torch.ops.nanoserve_cpu.decode_attention(q, od.view(1, 4, 16), k_cache.half(),
                                                 v_cache.half(), tables, seq_lens, 0.2)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gather_bytes", [1, 49152, 2**30])
def test_torch_decode_groups_agree_with_the_reference(monkeypatch, dtype, gather_bytes):
    """The torch path attends decodes in cache-sized groups: 1 sequence, a few, or all at once.
    (49152 bytes: 9 sequences of up to 60 tokens run as groups of 3, 16 blocks of 2 x 512 bytes.)"""
    monkeypatch.setattr(cpu_attention, "DECODE_GATHER_BYTES", gather_bytes)
    lens = [60, 1, 17, 33, 4, 59, 8, 25, 41]
    qd, od, k_cache, v_cache, tables, seq_lens = decode_batch(lens, 6, 2, 16, 4, dtype)
    cpu_attention.grouped_decode_attention(qd, od, k_cache, v_cache, tables, seq_lens, lens, 0.25)
    torch.testing.assert_close(od, reference_decode(qd, k_cache, v_cache, tables, lens, 0.25), **TOL[dtype])
