"""Plain PyTorch reference kernels: the specification, and the oracle every fast kernel is tested against.

Each function is the plainest correct torch for its kernel, written to be checked by hand; the
fast versions (C++ on a CPU: cpu_*.py, Triton on a GPU: triton_*.py) sit behind the dispatch in
kernels/__init__.py, which picks this module only where neither runs (or when asked to with
NANOSERVE_KERNELS=reference). Vectorised over tokens; `paged_attention` loops over sequences.

Cache layout (per layer): k_cache, v_cache of shape (num_blocks, block_size, num_kv_heads, head_dim).
A token's slot is block_id * block_size + offset; slot -1 marks padding (not written).
An fp8 cache (torch.float8_e4m3fn, EngineConfig.kv_cache_dtype="fp8") holds K / k_scale and
V / v_scale, saturated to e4m3's range, as vLLM's fp8 KV cache does; attention multiplies back
on read. Caches of a float dtype ignore the scales.
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


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy sampling: logits (N, vocab) -> (N,) int64, the first maximum of each row (a NaN wins)."""
    return logits.argmax(-1)


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


FP8_DTYPES = (torch.float8_e4m3fn,)


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x as the cache stores it: fp8 holds x / scale rounded to nearest, saturated at e4m3's
    largest value (448, as vLLM's write does; e4m3fn has no infinity, and whether torch's cast
    saturates or gives NaN has changed between versions, so the clamp is explicit); other dtypes
    a plain cast. NaN stays NaN."""
    if cache_dtype not in FP8_DTYPES:
        return x.to(cache_dtype)
    fp8_max = torch.finfo(cache_dtype).max
    return (x.float() / scale).clamp(-fp8_max, fp8_max).to(cache_dtype)


def from_cache(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """What `to_cache` stored, back in `dtype`: fp8 * scale, in fp32, rounded once to dtype."""
    if x.dtype not in FP8_DTYPES:
        return x.to(dtype)
    return (x.float() * scale).to(dtype)


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write this step's K/V into the paged cache (vLLM's name for this op).

    k, v: (T, num_kv_heads, head_dim); slot_mapping: (T,) int64, -1 = skip; k_scale, v_scale:
    an fp8 cache's scales (to_cache).
    """
    num_blocks, block_size = k_cache.shape[:2]
    flat_k = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    flat_v = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k, v = to_cache(k, flat_k.dtype, k_scale), to_cache(v, flat_v.dtype, v_scale)
    if flat_k.dtype in FP8_DTYPES:  # torch has no fp8 index_copy_ on a CPU: copy the bytes
        flat_k, flat_v, k, v = (t.view(torch.uint8) for t in (flat_k, flat_v, k, v))
    flat_k.index_copy_(0, slot_mapping, k)
    flat_v.index_copy_(0, slot_mapping, v)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """A sequence's first `length` cached tokens: (length, num_kv_heads, head_dim)."""
    block_size = cache.shape[1]
    nb = (length + block_size - 1) // block_size
    return cache[block_table[:nb].long()].flatten(0, 1)[:length]


def sequence_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_table: torch.Tensor, length: int, scale: float,
                       k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """One sequence's attention: q (n, num_heads, head_dim), its last n positions of `length`.

    Query j (position length-n+j) attends to cached positions 0..length-n+j: a causal mask
    offset by the cached prefix. GQA: head h reads kv head h // (num_heads / num_kv_heads).
    K/V are read back in q's dtype (from_cache). -> (n, num_heads, head_dim).
    """
    n = q.shape[0]
    k = gather_kv(k_cache, block_table, length).transpose(0, 1)[None]  # (1, kvh, L, hd)
    v = gather_kv(v_cache, block_table, length).transpose(0, 1)[None]
    qs = q.transpose(0, 1)[None]  # (1, num_heads, n, hd)
    # 4-D inputs reach SDPA's flash kernel (3-D ones its math path); is_causal when nothing is cached
    mask = None if n == length else torch.ones(n, length, dtype=torch.bool,
                                               device=q.device).tril(length - n)
    k, v = from_cache(k, q.dtype, k_scale), from_cache(v, q.dtype, v_scale)
    o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask,
                                       is_causal=mask is None, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float, k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    """Attention of a flattened mixed batch over the paged cache (this step's K/V already written).

    q: (T, num_heads, head_dim), the tokens of B sequences concatenated;
    attn.query_start_loc: (B+1,) offsets of each sequence's tokens in q;
    attn.seq_lens: (B,) context length of each sequence *including* this step's tokens;
    attn.block_tables: (B, max_blocks) int32, padded with any valid id; k_scale, v_scale: an
    fp8 cache's scales. A sequence at a time (a decode is one row): gather its K/V, attend
    (`sequence_attention`).
    Returns (T, num_heads, head_dim).
    """
    qsl, lens = attn.host_offsets()
    out = torch.empty_like(q)
    for i, length in enumerate(lens):
        s, e = qsl[i], qsl[i + 1]
        out[s:e] = sequence_attention(q[s:e], k_cache, v_cache, attn.block_tables[i], length, scale,
                                      k_scale, v_scale)
    return out
