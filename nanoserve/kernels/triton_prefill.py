"""Flash prefill attention in Triton: the multi-token queries of a step, K/V read from the paged cache.

The sequences with more than one query token this step (prefills, prefill chunks) are one
varlen launch over the flattened batch: program (tile, head) takes BLOCK_M consecutive query
tokens of one sequence and one query head, and streams that sequence's keys through the block
table in BLOCK_N tiles with an online softmax (FlashAttention-2's loop, Dao 2023). Query token i
of a chunk sits at position context_len + i (context_len = seq_len - q_len: what earlier chunks
or a prefix-cache hit left in the cache), so it sees keys 0..context_len + i. Causal block
skipping: keys before the tile's first position are visible to every row and run unmasked;
only the tiles up to the tile's last position are masked; keys past it are never loaded.
GQA: query head h reads kv head h // (num_heads / num_kv_heads).

Tiles are found without a host loop: sequence b's tiles start at (qsl[b] - qsl[0]) // BLOCK_M + b (an
upper bound of the tiles before it, the grid of vLLM's unified Triton attention), and each
program finds its sequence by binary search over query_start_loc; surplus programs return.

An fp8 cache (FP8) is loaded as e4m3 and dequantized in the tile (times k_scale, v_scale, then
the tile's dtype), so its K/V cross memory at one byte a value.
Left out on purpose: autotuning (block sizes are fixed per head size), split-KV, sliding
windows. fp16/bf16 tiles are multiplied as they are, with fp32 accumulation. On CPU this runs
only under TRITON_INTERPRET=1, where bf16 is computed in fp32 (its bf16 arithmetic is wrong).
"""


import torch
import triton
import triton.language as tl

from nanoserve import env

INTERPRETED = env.get("TRITON_INTERPRET") == "1"  # read once: triton reads it at import
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): exp2 is the GPU's native instruction


@triton.jit
def _attend_tile(acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, block_row_ptr, start, kv_end, q_pos,
                 d, d_ok, kv_head, stride_cb, stride_cs, stride_ch, block_size, qk_scale,
                 k_scale, v_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                 NATIVE: tl.constexpr, FP8: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key tile [start, start + BLOCK_N) folded into the running (acc, l_i, m_i)."""
    pos = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions in the sequence
    if MASKED:
        pos_ok = pos < kv_end
        block = tl.load(block_row_ptr + pos // block_size, mask=pos_ok, other=0)
    else:
        block = tl.load(block_row_ptr + pos // block_size)
    kv_off = (block.to(tl.int64)[:, None] * stride_cb + (pos % block_size)[:, None] * stride_cs
              + kv_head * stride_ch + d[None, :])  # (BLOCK_N, BLOCK_D)
    if MASKED:
        kv_mask = pos_ok[:, None] & d_ok[None, :]
    else:
        kv_mask = d_ok[None, :]
    k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    if FP8:  # dequantize: the reference's from_cache, in the tile
        k = k.to(tl.float32) * k_scale
        v = v.to(tl.float32) * v_scale
        if NATIVE:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
    elif not NATIVE:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
    if MASKED:  # causal, offset by the cached context; padding keys past kv_end
        s = tl.where(pos_ok[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    # online softmax: rescale what we have by 2^(old max - new max), then add this tile; every
    # row sees key 0 in its first tile, so m_new is finite from there on
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if NATIVE:
        p = p.to(v.dtype)  # as FlashAttention: probabilities in the input dtype, fp32 accumulation
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


# One program instance = BLOCK_M query tokens of one sequence x one query head.
# Tiles: q, acc (BLOCK_M, BLOCK_D); k, v (BLOCK_N, BLOCK_D); scores (BLOCK_M, BLOCK_N).
@triton.jit
def _flash_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, num_seqs, qk_scale, k_scale, v_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,  # q/out strides: token, head (head_dim is 1)
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, kv head
    stride_bt, block_size,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, NATIVE: tl.constexpr, FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tile, head = tl.program_id(0), tl.program_id(1)
    base = tl.load(query_start_loc_ptr)  # the first sequence's first row in q
    lo, hi = 0, num_seqs  # the last sequence whose first tile is <= this one: in [lo, hi)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if (tl.load(query_start_loc_ptr + mid) - base) // BLOCK_M + mid <= tile:
            lo = mid
        else:
            hi = mid
    seq = lo
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_tile = tile - ((q_start - base) // BLOCK_M + seq)
    if q_tile * BLOCK_M >= q_len:  # a surplus program of the upper-bound grid
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # tokens cached before this step's chunk
    kv_head = head // GROUP

    tok = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) token index within the chunk
    row_ok = tok < q_len
    q_pos = context_len + tok  # absolute position of each row's token
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_off = (q_start + tok).to(tl.int64)[:, None] * stride_qt + head * stride_qh + d[None, :]
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
    if not NATIVE:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of scores (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of 2^(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # running sum of p * v
    block_row_ptr = block_tables_ptr + seq * stride_bt
    first_pos = context_len + q_tile * BLOCK_M  # every row sees the keys before this one
    full_end = (first_pos // BLOCK_N) * BLOCK_N
    kv_end = tl.minimum(seq_len, first_pos + BLOCK_M)  # the last row sees up to kv_end - 1
    for start in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, block_row_ptr,
                                     start, kv_end, q_pos, d, d_ok, kv_head, stride_cb, stride_cs,
                                     stride_ch, block_size, qk_scale, k_scale, v_scale, BLOCK_N,
                                     False, NATIVE, FP8, DOT_PRECISION)
    for start in range(full_end, kv_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, block_row_ptr,
                                     start, kv_end, q_pos, d, d_ok, kv_head, stride_cb, stride_cs,
                                     stride_ch, block_size, qk_scale, k_scale, v_scale, BLOCK_N,
                                     True, NATIVE, FP8, DOT_PRECISION)

    out = acc / l_i[:, None]
    o_off = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def flash_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                  num_tokens: int, scale: float, block_m: int = 64, block_n: int = 64,
                  k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Attention of the sequences in query_start_loc (B + 1,) (offsets into q, need not start at
    0), seq_lens (B,), block_tables (B, max_blocks), written into out's rows. num_tokens: how many
    rows they own (qsl[B] - qsl[0]), a host number that sizes the grid. k_scale, v_scale: an fp8
    cache's scales."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1:]
    block_size, num_kv_heads = k_cache.shape[1:3]
    if num_seqs == 0 or num_tokens == 0:
        return
    # fp16/bf16 tiles go to tl.dot as they are, except bf16 in the interpreter (its bf16
    # arithmetic is wrong: there fp16 tests the native path); fp32 needs full-precision dots
    native = q.dtype == torch.float16 or (q.dtype == torch.bfloat16 and not INTERPRETED)
    grid = (triton.cdiv(num_tokens, block_m) + num_seqs, num_heads)
    _flash_prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens, num_seqs, scale * LOG2E,
        float(k_scale), float(v_scale),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), block_size,
        HEAD_DIM=head_dim, GROUP=num_heads // num_kv_heads, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), NATIVE=native,
        FP8=k_cache.dtype == torch.float8_e4m3fn,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4 if head_dim <= 64 else 8, num_stages=2)
