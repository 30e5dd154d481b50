"""Causal mask counted from the chunk's start: ignores the tokens cached before the chunk."""
import torch
import torch.nn.functional as F

from solutions.ex02_paged_kv import gather_kv


def paged_attention(q, k_cache, v_cache, attn, scale):
    qsl, lens, block_tables = attn.query_start_loc.tolist(), attn.seq_lens.tolist(), attn.block_tables
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    for b, L in enumerate(lens):
        s, n = qsl[b], qsl[b + 1] - qsl[b]
        k = gather_kv(k_cache, block_tables[b], L).transpose(0, 1).repeat_interleave(group, 0)
        v = gather_kv(v_cache, block_tables[b], L).transpose(0, 1).repeat_interleave(group, 0)
        mask = torch.ones(n, L, dtype=torch.bool).tril()  # should be .tril(L - n)
        o = F.scaled_dot_product_attention(q[s:s + n].transpose(0, 1), k.to(q.dtype), v.to(q.dtype),
                                           attn_mask=mask, scale=scale)
        out[s:s + n] = o.transpose(0, 1)
    return out
