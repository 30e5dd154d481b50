"""Exercise 8: Triton kernels. Fused RMSNorm (+ residual add), then decode attention (stretch).

A Triton kernel is a function run by many *program instances* at once; each finds its share
of the work from `tl.program_id(axis)` and moves data in tiles: `tl.arange(0, N)` makes a
vector of offsets (N a power of 2), `tl.load(ptr + offsets, mask=...)` reads a tile,
`tl.store` writes one. The launcher (plain Python) allocates outputs and launches a grid:
`kernel[(num_programs,)](args..., BLOCK=...)`, where constexpr arguments fix tile sizes.

RMSNorm with the residual add fused: the decoder layer computes h = x + residual and
rms_norm(h) * weight. Unfused that reads x, residual, writes h, reads h again, writes out;
fused, one kernel reads each row once and writes both h and out: memory-bound work, done with
fewer bytes. Decode attention reads a request's K/V through its block table, one tile of a
block at a time, with an online softmax (running max, running sum) so the context never has
to fit at once.

The tests call the launchers `rms_norm` and `decode_attention` (their signatures are fixed);
the kernels' signatures below are a suggestion: change them as your launchers need.
On a CPU, run with TRITON_INTERPRET=1 (set before importing this module; the tests do it).
The interpreter is slow per program instance and computes bf16 wrongly: load, then convert
to fp32 (`.to(tl.float32)`) before arithmetic. No autotuning: pick the tile sizes yourself.
The grader compares your outputs with plain-torch RMSNorm and paged attention computed from these
definitions; a module that imports nanoserve's own kernels scores 0. Lesson 03 runs a model with
your rms_norm once it passes.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, hidden, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """One program instance per row of `hidden` values (all tensors contiguous (rows, hidden)).

    Load the row as fp32 (masked: BLOCK >= hidden is a power of 2); with HAS_RESIDUAL add the
    residual row and store that sum to residual_out; then out = h / sqrt(mean(h^2) + eps) * weight.
    Careful: the mean is over `hidden` values, not over BLOCK.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(residual_out_ptr + row * hidden + cols, x.to(residual_out_ptr.dtype.element_ty),
                 mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim, computed by rms_norm_kernel: out = h / sqrt(mean(h^2) + eps) *
    weight, in fp32, cast back to x's dtype, where h = x (+ residual when given).

    x: (..., hidden); weight: (hidden,); residual: like x or None. Returns out (x's shape and
    dtype), or (out, h) with h = x + residual when residual is given.
    Launch one program per row: grid (rows,), BLOCK = triton.next_power_of_2(hidden).
    Hint: make inputs contiguous (rows, hidden) with .reshape(-1, hidden).contiguous().
    """
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()  # (rows, hidden)
    out = torch.empty_like(x2)
    if residual is not None:
        r2 = residual.reshape(-1, hidden).contiguous()
        residual_out = torch.empty_like(x2)
    else:
        r2 = residual_out = x2  # not read or written
    if x2.shape[0] > 0:
        rms_norm_kernel[(x2.shape[0],)](x2, r2, weight.contiguous(), out, residual_out, hidden, eps,
                                        HAS_RESIDUAL=residual is not None,
                                        BLOCK=triton.next_power_of_2(hidden))
    out = out.view(x.shape)
    return out if residual is None else (out, residual_out.view(x.shape))


@triton.jit
def decode_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr,
                            scale, max_blocks, num_heads, head_dim,
                            GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                            BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program instance per (sequence, kv head): the GROUP query heads sharing that kv head.

    q, out: (B, num_heads, head_dim) contiguous; caches (num_blocks, BLOCK_SIZE, num_kv_heads,
    head_dim) contiguous; block_tables (B, max_blocks) int32; seq_lens (B,) int32.
    Loop over the sequence's blocks: load a (BLOCK_SIZE, BLOCK_D) K tile and V tile, scores
    (GROUP_PAD, BLOCK_SIZE) = q . k * scale masked to positions < seq_len, then the online
    softmax update: m_new = max(m, rowmax(s)); acc = acc * exp(m - m_new) + exp(s - m_new) @ v;
    l likewise; at the end out = acc / l.
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    num_kv_heads = num_heads // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, GROUP_PAD)  # query heads of this kv head
    d = tl.arange(0, BLOCK_D)
    s = tl.arange(0, BLOCK_SIZE)  # slots in a block
    g_ok = g < GROUP
    d_ok = d < head_dim
    head = kv_head * GROUP + g
    q_off = seq * num_heads * head_dim + head[:, None] * head_dim + d[None, :]
    q = tl.load(q_ptr + q_off, mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # (G, D)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for blk in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block_id = tl.load(block_tables_ptr + seq * max_blocks + blk).to(tl.int64)
        pos = blk * BLOCK_SIZE + s
        pos_ok = pos < seq_len
        kv_off = ((block_id * BLOCK_SIZE + s[:, None]) * num_kv_heads + kv_head) * head_dim + d[None, :]
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)  # (S, D)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # (G, S)
        scores = tl.where(pos_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_off, out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Stretch: attention of one new token per sequence over its paged context.

    q: (B, num_heads, head_dim), token b's query; seq_lens (B,) int32 context lengths including
    that token (its K/V already in the cache); block_tables (B, max_blocks) int32; caches as in
    exercise 2 with a power-of-2 block_size. Returns (B, num_heads, head_dim) in q's dtype:
    softmax(q . K^T * scale) . V over the sequence's seq_lens[b] cached tokens, query head h
    reading kv head h // GROUP (what exercise 3's paged_attention gives a batch of decodes).
    Grid: (B, num_kv_heads); GROUP = num_heads // num_kv_heads, GROUP_PAD and BLOCK_D the next
    powers of 2 of GROUP and head_dim.
    """
    B, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    q = q.contiguous()
    out = torch.empty_like(q)
    tables = block_tables.to(torch.int32).contiguous()
    if B > 0:
        decode_attention_kernel[(B, num_kv_heads)](
            q, k_cache.contiguous(), v_cache.contiguous(), out, tables,
            seq_lens.to(torch.int32).contiguous(), scale, tables.shape[1], num_heads, head_dim,
            GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=block_size,
            BLOCK_D=triton.next_power_of_2(head_dim))
    return out
