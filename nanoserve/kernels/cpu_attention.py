"""Paged decode attention in C++ for CPUs: read K/V where they sit in the paged cache.

The reference gathers each sequence's K/V blocks into a contiguous copy, then runs SDPA on it:
every K/V byte crosses memory three times (read, write, read again). The kernel in
cpu_attention.cpp reads each byte once (bf16 queries over a bf16 cache, or an fp8 one, on a CPU
with AVX512-BF16 go to cpu_attention_bf16.cpp); benchmarks/cpu_attention.py measures it against
the torch path below.

`paged_attention` has the reference's contract: the leading decode rows go to the C++ op in one
call, and so do the rows of sequences with a few query tokens (a speculative verify, a short
chunk), a row each with its own causal length; longer prefills (SDPA's flash kernel reads their
K/V once already) go to reference.sequence_attention.
Decodes the op cannot take go to `grouped_decode_attention`, torch in cache-sized groups. An fp8
(e4m3) cache goes to the op beside any model dtype: it reads one byte a value and folds the
scales into the query and the output.
cpu_build.py builds the op (`available()` and `unavailable_reason()` are its).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanoserve.kernels import reference
from nanoserve.kernels.cpu_build import available, unavailable_reason  # noqa: F401  (this module's API)
from nanoserve.kernels.metadata import AttentionMetadata

# K+V gathered per group of decodes: small enough to stay in a CPU's cache between the gather and
# SDPA's read (measured by benchmarks/cpu_attention.py; figures in benchmarks/results/NOTES.md)
DECODE_GATHER_BYTES = 4 * 2**20
# a sequence with at most this many query tokens is attended a row at a time by the decode op: each
# row rereads the K/V (cheap for a few rows), where a per-sequence SDPA call pays a gather and a
# mask per layer (benchmarks/spec_decode.py: the verify step of speculative decoding)
MULTI_QUERY_ROWS = 8


def fp8_cache_read() -> str:
    """How decode attention reads an fp8 cache beside bf16 queries on this machine: "bf16 lookup"
    (cpu_attention_bf16.cpp: each code looked up as its bf16 value in registers, then the bf16
    cache's dot products, for head_dim a multiple of 64), "fp32 widening" (cpu_attention.cpp: codes
    converted to fp32 before the arithmetic) or "torch" (no C++ ops: a dequantized copy, then SDPA)."""
    if not available():
        return "torch"
    return "bf16 lookup" if torch.ops.nanoserve_cpu.reads_fp8_as_bf16() else "fp32 widening"


def grouped_decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale,
                             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Single-token queries qd (D, kvh, g, hd) -> od (written in place), in groups of sequences.

    tables: (D, max_blocks) block tables; d_lens: (D,) context lengths (a tensor), d_lens_cpu the
    same as a list. Each group's blocks are gathered into one reused buffer of about
    DECODE_GATHER_BYTES, viewed as (n, kvh, L, hd) without a copy, and attended by one SDPA call
    with the padding past each context masked: the whole batch at once would write and reread
    every K/V byte through DRAM. An fp8 cache's group is dequantized (reference.from_cache).
    """
    D, block_size = len(d_lens_cpu), k_cache.shape[1]
    most_blocks = -(-max(d_lens_cpu) // block_size)
    block_bytes = k_cache.element_size() * k_cache.stride(0)  # one block of K
    per_group = max(1, DECODE_GATHER_BYTES // (2 * most_blocks * block_bytes))
    buf_k = k_cache.new_empty(min(D, per_group) * most_blocks, *k_cache.shape[1:])
    buf_v = torch.empty_like(buf_k)
    for s in range(0, D, per_group):
        e = min(D, s + per_group)
        nb = -(-max(d_lens_cpu[s:e]) // block_size)
        ids = tables[s:e, :nb].flatten()
        k = torch.index_select(k_cache, 0, ids, out=buf_k[:len(ids)])  # (n*nb, bs, kvh, hd)
        v = torch.index_select(v_cache, 0, ids, out=buf_v[:len(ids)])
        k = reference.from_cache(k.view(e - s, nb * block_size, *k.shape[2:]).transpose(1, 2),
                                 qd.dtype, k_scale)
        v = reference.from_cache(v.view(e - s, nb * block_size, *v.shape[2:]).transpose(1, 2),
                                 qd.dtype, v_scale)
        keep = torch.arange(nb * block_size, device=qd.device) < d_lens[s:e, None]  # (n, L)
        od[s:e] = F.scaled_dot_product_attention(qd[s:e], k, v, attn_mask=keep[:, None, None, :],
                                                 scale=scale)


def decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale,
                     k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """grouped_decode_attention's contract: qd (D, kvh, g, hd) -> od, in one C++ call."""
    D, kvh, g, hd = qd.shape
    if hd % 8 or k_cache.dtype not in (qd.dtype, torch.float8_e4m3fn) or not k_cache.is_contiguous():
        # the op's rows are whole 8-float vectors, in the model's dtype or e4m3, default layout
        return grouped_decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale,
                                        k_scale, v_scale)
    q = qd.reshape(D, kvh * g, hd)  # a view for rows of the fused qkv output
    if q.stride(2) != 1 or q.stride(1) != hd:
        q = q.contiguous()
    out = od.view(D, kvh * g, hd) if od.is_contiguous() else torch.empty_like(q)
    torch.ops.nanoserve_cpu.decode_attention(q, out, k_cache, v_cache, tables.int().contiguous(),
                                             d_lens.int(), scale, k_scale, v_scale)
    if out.data_ptr() != od.data_ptr():
        od.copy_(out.view_as(od))


def query_rows(qsl: list[int], lens: list[int], seqs) -> tuple[list[int], list[int]]:
    """Every query token of the sequences `seqs` as a decode row: (its sequence, its context
    length). Row j of n query tokens sees the first lens - n + 1 + j positions (causal attention)."""
    seq = [i for i in seqs for _ in range(qsl[i + 1] - qsl[i])]
    row_lens = [lens[i] - (qsl[i + 1] - qsl[i]) + 1 + j for i in seqs for j in range(qsl[i + 1] - qsl[i])]
    return seq, row_lens


def few_query_rows(attn: AttentionMetadata, qsl: list[int], lens: list[int], D: int):
    """The query rows of the sequences after the first D with 2..MULTI_QUERY_ROWS query tokens,
    each as a decode row (query_rows): (rows, their block tables, their context lengths as a tensor
    and as a list), or None. The same for every layer of a step: built once, kept in attn.derived."""
    if "few_query_rows" not in attn.derived:
        few = [i for i in range(D, len(lens)) if qsl[i + 1] - qsl[i] <= MULTI_QUERY_ROWS]
        seq, row_lens = query_rows(qsl, lens, few)
        device = attn.block_tables.device
        rows = torch.tensor([r for i in few for r in range(qsl[i], qsl[i + 1])], device=device)
        attn.derived["few_query_rows"] = (rows, attn.block_tables[torch.tensor(seq, device=device)],
                                          torch.tensor(row_lens, dtype=torch.int32, device=device),
                                          row_lens) if few else None
    return attn.derived["few_query_rows"]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float, k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    """reference.paged_attention, with the leading single-token rows (attn.decode_count) in one
    decode_attention call, the rows of sequences of up to MULTI_QUERY_ROWS query tokens in another,
    the longer ones one at a time, as the reference does them."""
    qsl, lens = attn.host_offsets()
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    D = attn.decode_count(qsl)  # rows 0..D-1 of q and out
    if D:
        # GQA without repeating K/V: the `group` query heads of a kv head are its `group` queries
        qd = q[:D].view(D, num_kv_heads, num_heads // num_kv_heads, head_dim)  # (D, kvh, g, hd)
        decode_attention(qd, out[:D].view_as(qd), k_cache, v_cache, attn.block_tables[:D],
                         attn.seq_lens[:D], lens[:D], scale, k_scale, v_scale)
    few = few_query_rows(attn, qsl, lens, D)
    if few is not None:
        rows, tables, row_lens, row_lens_cpu = few
        qr = q[rows].view(len(rows), num_kv_heads, num_heads // num_kv_heads, head_dim)
        orows = torch.empty_like(qr)
        decode_attention(qr, orows, k_cache, v_cache, tables, row_lens, row_lens_cpu, scale, k_scale, v_scale)
        out[rows] = orows.view(len(rows), num_heads, head_dim)
    for i in range(D, len(lens)):
        if qsl[i + 1] - qsl[i] > MULTI_QUERY_ROWS:
            s, e = qsl[i], qsl[i + 1]
            out[s:e] = reference.sequence_attention(q[s:e], k_cache, v_cache, attn.block_tables[i],
                                                    lens[i], scale, k_scale, v_scale)
    return out
