"""Decode attention that scores the unused slots of the last block (no position mask)."""
import torch
import triton
import triton.language as tl

from solutions.ex08_triton import rms_norm  # noqa: F401


@triton.jit
def _kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, scale, max_blocks,
            num_heads, head_dim, BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kv_head = head // GROUP
    num_kv_heads = num_heads // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    d = tl.arange(0, BLOCK_D)
    s = tl.arange(0, BLOCK_SIZE)
    d_ok = d < head_dim
    q = tl.load(q_ptr + (seq * num_heads + head) * head_dim + d, mask=d_ok, other=0.0).to(tl.float32)
    m_i = tl.max(tl.full([BLOCK_SIZE], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_SIZE], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for blk in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block_id = tl.load(block_tables_ptr + seq * max_blocks + blk).to(tl.int64)
        off = ((block_id * BLOCK_SIZE + s[:, None]) * num_kv_heads + kv_head) * head_dim + d[None, :]
        k = tl.load(k_cache_ptr + off, mask=d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + off, mask=d_ok[None, :], other=0.0).to(tl.float32)
        scores = tl.sum(q[None, :] * k, axis=1) * scale  # every slot of the block, used or not
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(out_ptr + (seq * num_heads + head) * head_dim + d, acc / l_i, mask=d_ok)


def decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale):
    B, num_heads, head_dim = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    tables = block_tables.to(torch.int32).contiguous()
    _kernel[(B, num_heads)](q, k_cache, v_cache, out, tables, seq_lens.to(torch.int32), scale,
                            tables.shape[1], num_heads, head_dim, BLOCK_SIZE=k_cache.shape[1],
                            BLOCK_D=triton.next_power_of_2(head_dim), GROUP=num_heads // k_cache.shape[2])
    return out
