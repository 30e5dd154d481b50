"""Paged decode attention in C++ for CPUs: read K/V where they sit in the paged cache.

The torch reference gathers each decode sequence's K/V blocks into a contiguous copy, then runs
SDPA on it: every K/V byte crosses memory three times (read, write, read again). The kernel in
cpu_attention.cpp reads each byte once. On a 2-core AMD EPYC (AVX2), llama-120m's attention of
64 sequences x 320 tokens took about half the reference's time per layer in fp32 and about 40%
in bf16; on one with AVX-512, where a bf16 cache goes to AVX512-BF16 dot products
(cpu_attention_bf16.cpp) and the prefetches are spread over the arithmetic, 27% in fp32 and 18% in
bf16, and at 16 x 2048, 30% and 22% (benchmarks/cpu_attention.py prints the side-by-side figures
for the machine it runs on).

`paged_attention` has the reference's contract; decode rows go to the C++ op, prefill rows
(SDPA's flash kernel reads them once already) to the reference. cpu_build.py builds the op
(`available()` and `unavailable_reason()` are its).
"""

from __future__ import annotations

import torch

from nanoserve.kernels import reference
from nanoserve.kernels.cpu_build import available, unavailable_reason  # noqa: F401  (this module's API)
from nanoserve.kernels.metadata import AttentionMetadata


def decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale) -> None:
    """reference._decode_attention's contract: qd (D, kvh, g, hd) -> od, in one C++ call."""
    D, kvh, g, hd = qd.shape
    if hd % 8 or k_cache.dtype != qd.dtype or not k_cache.is_contiguous():
        # the op's rows are whole 8-float vectors, in the model's dtype, in the default layout
        return reference._decode_attention(qd, od, k_cache, v_cache, tables, d_lens, d_lens_cpu, scale)
    q = qd.reshape(D, kvh * g, hd)  # a view for rows of the fused qkv output
    if q.stride(2) != 1 or q.stride(1) != hd:
        q = q.contiguous()
    out = od.view(D, kvh * g, hd) if od.is_contiguous() else torch.empty_like(q)
    torch.ops.nanoserve_cpu.decode_attention(q, out, k_cache, v_cache, tables.int().contiguous(),
                                             d_lens.int(), scale)
    if out.data_ptr() != od.data_ptr():
        od.copy_(out.view_as(od))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float) -> torch.Tensor:
    """reference.paged_attention with its decode rows computed by the C++ op."""
    return reference.paged_attention(q, k_cache, v_cache, attn, scale, decode_attention=decode_attention)
