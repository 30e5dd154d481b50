"""Paged-attention test cases shared by the kernel tests: random mixed batches over a shuffled
paged cache, and a token-by-token attention loop to check kernels against."""

import itertools

import torch

from nanoserve.kernels import AttentionMetadata, reference

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def paged_batch(seqs, num_heads, num_kv_heads, head_dim, block_size, dtype, device):
    """Random q and a paged K/V cache for `seqs` = [(context_len, q_len), ...].

    Blocks are handed out in shuffled order; the tables are padded with a spare (junk) block.
    Returns q, k_cache, v_cache and the AttentionMetadata (no host lists).
    """
    blocks = [-(-(c + n) // block_size) for c, n in seqs]
    num_blocks = sum(blocks) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    ids = torch.randperm(num_blocks)
    block_tables = torch.full((len(seqs), max(blocks)), int(ids[-1]), dtype=torch.int32)
    for b, start in enumerate(itertools.accumulate([0] + blocks[:-1])):
        block_tables[b, :blocks[b]] = ids[start:start + blocks[b]]
    query_start_loc = torch.tensor([0, *itertools.accumulate(n for _, n in seqs)], dtype=torch.int32)
    seq_lens = torch.tensor([c + n for c, n in seqs], dtype=torch.int32)
    q = torch.randn(int(query_start_loc[-1]), num_heads, head_dim).to(dtype)
    attn = AttentionMetadata(query_start_loc.to(device), seq_lens.to(device), block_tables.to(device))
    return q.to(device), k_cache.to(device), v_cache.to(device), attn


CASES = {  # (cached context, tokens this step) per sequence
    "decode": [(0, 1), (36, 1), (7, 1), (62, 1)],
    "prefill": [(0, 20), (0, 7), (0, 1)],
    "chunks_mid_block": [(13, 9), (5, 30)],
    "mixed": [(0, 1), (36, 1), (0, 20), (13, 9), (61, 5)],
    "long_chunk": [(3, 70)],  # several query tiles and key tiles
}


def loop_attention(q, k_cache, v_cache, block_tables, seqs, scale, see_ahead=0,
                   skip_context=False, kv_head_of=lambda h, group, num_kv_heads: h // group):
    """Token-by-token attention in plain torch, with knobs that inject plausible bugs."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    out, t = torch.empty_like(q), 0
    for b, (context, n) in enumerate(seqs):
        k = reference.gather_kv(k_cache, block_tables[b], context + n).float()  # (L, kvh, hd)
        v = reference.gather_kv(v_cache, block_tables[b], context + n).float()
        for j in range(n):
            first = context if skip_context else 0
            last = min(context + j + see_ahead, context + n - 1)  # last visible position
            for h in range(num_heads):
                kvh = kv_head_of(h, num_heads // num_kv_heads, num_kv_heads)
                p = (k[first:last + 1, kvh] @ q[t, h].float() * scale).softmax(0)
                out[t, h] = p @ v[first:last + 1, kvh]
            t += 1
    return out
