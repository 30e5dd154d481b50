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
    raise NotImplementedError("ex08: write rms_norm_kernel")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim, computed by rms_norm_kernel: out = h / sqrt(mean(h^2) + eps) *
    weight, in fp32, cast back to x's dtype, where h = x (+ residual when given).

    x: (..., hidden); weight: (hidden,); residual: like x or None. Returns out (x's shape and
    dtype), or (out, h) with h = x + residual when residual is given.
    Launch one program per row: grid (rows,), BLOCK = triton.next_power_of_2(hidden).
    Hint: make inputs contiguous (rows, hidden) with .reshape(-1, hidden).contiguous().
    """
    raise NotImplementedError("ex08: write rms_norm")


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
    raise NotImplementedError("ex08: write decode_attention_kernel")


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
    raise NotImplementedError("ex08: write decode_attention")
