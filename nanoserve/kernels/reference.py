"""Plain PyTorch reference kernels: the specification the Triton kernels must match.

They run on any device and are the default on CPU. Vectorised over tokens: the Python
loops in `paged_attention` are over prefill sequences (one SDPA call each) and over groups
of decode sequences sized to stay in a CPU's cache (one gather and one SDPA call each).

Cache layout (per layer): k_cache, v_cache of shape (num_blocks, block_size, num_kv_heads, head_dim).
A token's slot is block_id * block_size + offset; slot -1 marks padding (not written).
"""

import torch
import torch.nn.functional as F

from nanoserve.kernels.metadata import AttentionMetadata


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim, optionally fused with the residual add.

    x: (..., hidden); weight: (hidden,). With `residual`, computes h = x + residual and
    returns (rms_norm(h), h), as the decoder layer needs both. HF's order of rounding: the mean
    of squares and the scaling in fp32, then a cast to x's dtype, then the weight.
    """
    if residual is not None:
        x = x + residual
        residual = x
    var = x.float().square().mean(-1, keepdim=True)  # (..., 1) fp32
    out = (x * torch.rsqrt(var + eps)).to(x.dtype) * weight  # x * fp32 (..., 1) is fp32
    return out if residual is None else (out, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The MLP's activation (vLLM's SiluAndMul): x (..., 2 * d) = [gate | up] -> (..., d).

    silu(gate) * up as HF's Llama MLP computes it: two torch ops, each rounded to x's dtype.
    """
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor):
    """Rotate q and k by their positions (neox/Llama layout: halves, not interleaved), in place.

    positions: (T,) int; q: (T, num_heads, head_dim); k: (T, num_kv_heads, head_dim), views
    into the fused qkv projection; cos_sin_cache: (max_pos, head_dim) fp32, [cos | sin] of the
    rotary frequencies. Computes in fp32, rounds once to the input dtype; returns (q, k).
    In place, so no new q/k (and no concatenation) per layer; the Triton kernel returns new
    tensors instead, and callers use the returned pair either way.
    """
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # (T, 1, head_dim/2)
    for x in (q, k):
        h = x.float()  # fp32: x itself, rotated in place; else an fp32 copy, written back once
        x1, x2 = h.chunk(2, dim=-1)
        x1_sin = x1 * sin
        x1.mul_(cos).sub_(x2 * sin)  # x1 cos - x2 sin
        x2.mul_(cos).add_(x1_sin)  # x2 cos + x1 sin
        if h is not x:
            x.copy_(h)
    return q, k


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write this step's K/V into the paged cache (vLLM's name for this op).

    k, v: (T, num_kv_heads, head_dim); slot_mapping: (T,) int64, -1 = skip.
    """
    num_blocks, block_size = k_cache.shape[:2]
    flat_k = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    flat_v = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    flat_k.index_copy_(0, slot_mapping, k.to(flat_k.dtype))
    flat_v.index_copy_(0, slot_mapping, v.to(flat_v.dtype))


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """A sequence's first `length` cached tokens: (length, num_kv_heads, head_dim)."""
    block_size = cache.shape[1]
    nb = (length + block_size - 1) // block_size
    return cache[block_table[:nb].long()].flatten(0, 1)[:length]


DECODE_GATHER_BYTES = 4 * 2**20  # K+V gathered per group of decodes: stays in a CPU's cache


def _decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale) -> None:
    """Single-token queries qd (D, kvh, g, hd) -> od, in groups of sequences.

    Each group's blocks are gathered into one reused buffer of about DECODE_GATHER_BYTES,
    viewed as (n, kvh, L, hd) without a copy, and attended by one SDPA call with the padding
    past each context masked. Gathering a whole batch at once writes and rereads every K/V
    byte through DRAM; in cache-sized groups it ran 2x faster (64 x 272 and 32 x 848 tokens
    of llama-120m on a 2-core EPYC, 32 MiB L3; 4 MiB beat 1, 8 and 16).
    """
    D, block_size = len(d_lens_cpu), k_cache.shape[1]
    most_blocks = -(-max(d_lens_cpu) // block_size)
    block_bytes = k_cache.element_size() * k_cache.stride(0)  # one block of K
    per_group = max(1, DECODE_GATHER_BYTES // (2 * most_blocks * block_bytes))
    if qd.device.type != "cpu":  # the cache-sized groups are a CPU matter: one group elsewhere
        per_group = D
    buf_k = k_cache.new_empty(min(D, per_group) * most_blocks, *k_cache.shape[1:])
    buf_v = torch.empty_like(buf_k)
    for s in range(0, D, per_group):
        e = min(D, s + per_group)
        nb = -(-max(d_lens_cpu[s:e]) // block_size)
        ids = tables[s:e, :nb].flatten()
        k = torch.index_select(k_cache, 0, ids, out=buf_k[:len(ids)])  # (n*nb, bs, kvh, hd)
        v = torch.index_select(v_cache, 0, ids, out=buf_v[:len(ids)])
        k = k.view(e - s, nb * block_size, *k.shape[2:]).transpose(1, 2).to(qd.dtype)
        v = v.view(e - s, nb * block_size, *v.shape[2:]).transpose(1, 2).to(qd.dtype)
        keep = torch.arange(nb * block_size, device=qd.device) < d_lens[s:e, None]  # (n, L)
        od[s:e] = F.scaled_dot_product_attention(qd[s:e], k, v, attn_mask=keep[:, None, None, :],
                                                 scale=scale)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float,
                    decode_attention=_decode_attention) -> torch.Tensor:
    """Attention of a flattened mixed batch over the paged cache (this step's K/V already written).

    q: (T, num_heads, head_dim), the tokens of B sequences concatenated;
    attn.query_start_loc: (B+1,) offsets of each sequence's tokens in q;
    attn.seq_lens: (B,) context length of each sequence *including* this step's tokens;
    attn.block_tables: (B, max_blocks) int32, padded with any valid id.
    Query token j of sequence b sits at position seq_lens[b] - q_len[b] + j and attends
    causally to cached positions <= its own. GQA: head h reads kv head h // (num_heads/num_kv_heads).
    Returns (T, num_heads, head_dim). `decode_attention` computes the leading single-token rows
    (attn.decode_count; `_decode_attention`'s contract: it writes them in place into `out`), the
    CPU backend passing its C++ op (cpu_attention.py); the other sequences go one at a time.
    """
    qsl, lens = attn.host_offsets()
    block_tables, seq_lens = attn.block_tables, attn.seq_lens
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    D = attn.decode_count(qsl)  # the leading single-token queries: rows 0..D-1 of q and out
    if D:
        # GQA without repeating K/V: the `group` query heads of a kv head are its `group` queries
        qd = q[:D].view(D, num_kv_heads, group, head_dim)  # (D, kvh, g, hd)
        decode_attention(qd, out[:D].view_as(qd), k_cache, v_cache, block_tables[:D], seq_lens[:D],
                         lens[:D], scale)
    for i in range(D, len(lens)):  # a sequence at a time (a decode among them is one row)
        s, n, L = qsl[i], qsl[i + 1] - qsl[i], lens[i]
        k = gather_kv(k_cache, block_tables[i], L).transpose(0, 1)[None]
        v = gather_kv(v_cache, block_tables[i], L).transpose(0, 1)[None]
        qs = q[s:s + n].transpose(0, 1)[None]  # (1, num_heads, n, hd); K/V: (1, kvh, L, hd)
        # query j (position L-n+j) sees keys 0..L-n+j: a causal mask offset by the cached prefix.
        # 4-D inputs reach SDPA's CPU flash kernel (3-D ones take the math path: 5x slower at
        # 2048 tokens), and is_causal, when nothing is cached, skips the masked tiles
        mask = None if n == L else torch.ones(n, L, dtype=torch.bool, device=q.device).tril(L - n)
        o = F.scaled_dot_product_attention(qs, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                                           is_causal=mask is None, scale=scale, enable_gqa=True)
        out[s:s + n] = o[0].transpose(0, 1)
    return out
