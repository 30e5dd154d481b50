"""Paged attention in Triton: a flash-attention loop that reads K/V through the block table.

Same contract as `reference.paged_attention`: one call handles a flattened mixed batch of
prefill chunks and decode tokens. The leading single-token queries (decodes; the only rows in
a CUDA graph) run in the kernel below, which packs a kv head's query heads into one tile; the
sequences after them (prefill chunks) in the flash prefill kernel (triton_prefill.py).
Each query token sits at position seq_len - q_len + j and attends causally over its
sequence's cached prefix and the chunk so far; query heads share a kv head in groups (GQA).

An fp8 cache is read at one byte a value and dequantized in the tile (times k_scale, v_scale).
Left out on purpose: split-KV ("flash-decoding") for long decode contexts,
sliding windows, ALiBi, autotuning. On CPU this runs only under TRITON_INTERPRET=1.
"""

import torch
import triton
import triton.language as tl

from nanoserve.kernels.metadata import AttentionMetadata
from nanoserve.kernels.triton_prefill import flash_prefill

BLOCK_N = 32  # keys per inner-loop step; independent of the cache's block_size


# One program instance = one query tile of one sequence x one kv head.
# Its BLOCK_M = BLOCK_Q * GROUP_PAD rows are BLOCK_Q query tokens x the GROUP query heads that
# read this kv head, so each K/V tile is loaded once for the whole group.
# Tiles: q, acc (BLOCK_M, BLOCK_D); k, v (BLOCK_N, BLOCK_D); scores (BLOCK_M, BLOCK_N).
@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, scale, k_scale, v_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,  # q/out strides: token, head (head_dim is 1)
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, kv head
    stride_bt, block_size,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq, q_tile, kv_head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:  # the grid is sized for the longest chunk
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # tokens cached before this step's chunk

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = q_tile * BLOCK_Q + rows // GROUP_PAD  # token index within the chunk
    head = kv_head * GROUP + rows % GROUP_PAD  # query head
    row_ok = (tok < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = context_len + tok  # (BLOCK_M,) absolute position of each row's token
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_off = (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0).to(tl.float32)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)  # running max of scores
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, BLOCK_D], tl.float32)  # running sum of p * v
    # The tile's last token sees keys up to its own position; nothing past kv_end is needed.
    kv_end = tl.minimum(seq_len, context_len + (q_tile + 1) * BLOCK_Q)
    for start in range(0, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)  # key positions in the sequence
        pos_ok = pos < kv_end
        block = tl.load(block_tables_ptr + seq * stride_bt + pos // block_size, mask=pos_ok, other=0)
        kv_off = (block.to(tl.int64)[:, None] * stride_cb + (pos % block_size)[:, None] * stride_cs
                  + kv_head * stride_ch + d[None, :])
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        # (BLOCK_N, BLOCK_D); the scales are an fp8 cache's (1.0 for a float cache)
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32) * k_scale
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32) * v_scale

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # (BLOCK_M, BLOCK_N)
        visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])  # causal, offset by context
        s = tl.where(visible, s, float("-inf"))
        # Online softmax: rescale what we have by exp(old max - new max), then add this tile.
        # Key 0 is visible to every row, so m_new is finite from the first tile on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    o_off = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float, k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    """Triton version of `reference.paged_attention`; same arguments, returns (T, num_heads, head_dim)."""
    block_tables, query_start_loc, seq_lens = attn.block_tables, attn.query_start_loc, attn.seq_lens
    T, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.stride(-1) == 1 and num_heads % num_kv_heads == 0
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((T, num_heads, head_dim), dtype=q.dtype, device=q.device)
    num_seqs = seq_lens.shape[0]
    if T == 0 or num_seqs == 0:
        return out
    qsl = attn.query_start_loc_cpu  # the grid's size is a host number: CUDA graphs pass it fixed
    if qsl is None:
        qsl = query_start_loc.tolist()
    D = attn.decode_count(qsl)  # leading single-token queries here; the rest: the flash kernel
    if D < num_seqs:
        flash_prefill(q, k_cache, v_cache, out, query_start_loc[D:], seq_lens[D:], block_tables[D:],
                      qsl[num_seqs] - qsl[D], scale, k_scale=k_scale, v_scale=v_scale)
    if D == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_q = max(1, 16 // group_pad)  # 16 rows a tile at least: tl.dot on a GPU needs them
    grid = (D, 1, num_kv_heads)  # one query token per sequence: one tile
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens, scale,
        float(k_scale), float(v_scale), q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), block_size,
        HEAD_DIM=head_dim, GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=BLOCK_N,
        # fp16/bf16 values are exact in TF32, so tensor cores lose nothing; fp32 asks for full dots.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
