"""The flash prefill kernel (triton_prefill.py) against the torch reference: varlen batches of
prefill chunks that start past position 0, over a shuffled paged cache, GQA groups 1/2/4,
fp32/fp16/bf16, small and default tiles. Under the interpreter (CPU) shapes stay small."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_cases import TOL, loop_attention, paged_batch

from nanoserve.kernels import reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def flash(triton_ops):
    from nanoserve.kernels import triton_prefill
    return triton_prefill


def prefill_rows(flash, batch, scale, block_m, block_n):
    """flash_prefill over all of the batch's sequences -> (T, num_heads, head_dim)."""
    q, k_cache, v_cache, attn = batch
    out = torch.full_like(q, float("nan"))
    qsl = attn.query_start_loc.tolist()
    flash.flash_prefill(q, k_cache, v_cache, out, attn.query_start_loc, attn.seq_lens,
                        attn.block_tables, qsl[-1] - qsl[0], scale, block_m=block_m, block_n=block_n)
    return out


@settings(max_examples=10, deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(0, 45), st.integers(2, 40)), min_size=1, max_size=3),
       group=st.sampled_from([1, 2, 4]), num_kv_heads=st.integers(1, 2),
       head_dim=st.sampled_from([16, 24, 32]), block_size=st.sampled_from([4, 8, 16]),
       dtype=st.sampled_from(DTYPES), tiles=st.sampled_from([(16, 16), (32, 16), (16, 32)]))
def test_flash_prefill_matches_reference(flash, device, seqs, group, num_kv_heads, head_dim,
                                         block_size, dtype, tiles):
    batch = paged_batch(seqs, group * num_kv_heads, num_kv_heads, head_dim, block_size, dtype, device)
    got = prefill_rows(flash, batch, 0.3, *tiles)
    torch.testing.assert_close(got, reference.paged_attention(*batch, 0.3), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 2, 4])
def test_default_tiles_chunks_past_zero(flash, device, poisoned, dtype, group):
    """Default tiles (64 x 64): a chunk starting mid-tile past a long cached context (unmasked key
    tiles, then the diagonal ones), a prompt of several query tiles, a short one."""
    seqs = [(100, 90), (0, 150), (7, 3)]
    batch = paged_batch(seqs, 2 * group, 2, 32, 16, dtype, device)
    got = prefill_rows(flash, batch, 32 ** -0.5, 64, 64)
    torch.testing.assert_close(got, reference.paged_attention(*batch, 32 ** -0.5), **TOL[dtype])


def test_paged_attention_sends_chunks_to_the_flash_kernel(triton_ops, flash, device, poisoned,
                                                          monkeypatch):
    """In a mixed batch the decodes go to the decode kernel and only the sequences after them to
    flash_prefill, with offsets that start at the first prefill's row."""
    seqs = [(5, 1), (30, 1), (0, 20), (13, 9)]
    batch = paged_batch(seqs, 4, 2, 16, 8, torch.float32, device)
    calls = []
    real = flash.flash_prefill

    def spy(q, k, v, out, qsl, lens, tables, num_tokens, scale, **kw):
        calls.append((qsl.tolist(), lens.tolist(), num_tokens))
        return real(q, k, v, out, qsl, lens, tables, num_tokens, scale, **kw)

    monkeypatch.setattr("nanoserve.kernels.triton_attention.flash_prefill", spy)
    got = triton_ops.paged_attention(*batch, 0.25)
    assert calls == [([2, 22, 31], [20, 22], 29)]
    want = loop_attention(batch[0], batch[1], batch[2], batch[3].block_tables, seqs, 0.25)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("bug", ["see_ahead", "skip_context"])
def test_the_comparison_catches_plausible_bugs(flash, device, bug):
    """A kernel that let a token see the next one, or ignored the cached context, would fail."""
    seqs = [(20, 12), (0, 9)]
    batch = paged_batch(seqs, 4, 2, 16, 8, torch.float32, device)
    got = prefill_rows(flash, batch, 0.25, 16, 16)
    wrong = loop_attention(batch[0], batch[1], batch[2], batch[3].block_tables, seqs, 0.25,
                           **{bug: 1 if bug == "see_ahead" else True})
    assert not torch.allclose(got, wrong, **TOL[torch.float32])
    torch.testing.assert_close(got, loop_attention(batch[0], batch[1], batch[2],
                                                   batch[3].block_tables, seqs, 0.25),
                               **TOL[torch.float32])


def test_sequences_whose_rows_start_past_the_first_tile(flash, device, poisoned):
    """paged_attention passes the sequences after the decodes: offsets that start at row qsl[D],
    possibly tiles past 0. The grid counts tiles from there."""
    seqs = [(0, 40), (9, 21), (30, 5)]
    batch = paged_batch(seqs, 4, 2, 16, 8, torch.float32, device)
    q, k_cache, v_cache, attn = batch
    out = torch.full_like(q, float("nan"))
    qsl = attn.query_start_loc.tolist()
    flash.flash_prefill(q, k_cache, v_cache, out, attn.query_start_loc[1:], attn.seq_lens[1:],
                        attn.block_tables[1:], qsl[-1] - qsl[1], 0.25, block_m=16, block_n=16)
    want = reference.paged_attention(*batch, 0.25)
    torch.testing.assert_close(out[qsl[1]:], want[qsl[1]:], **TOL[torch.float32])
    assert out[:qsl[1]].isnan().all()  # rows of the sequences it was not given stay untouched
