"""A decoder layer's small ops in C++ for CPUs: RMSNorm, RoPE, the K/V cache write, SiLU-and-mul.

At decode sizes a row is a few hundred values, and each of the reference's torch ops (RMSNorm
is six: add, square, mean, rsqrt, two multiplies) costs more in dispatch than in arithmetic.
cpu_layer_ops.cpp does each kernel's arithmetic, rounded the reference's way, in one call, its
rows sixteen values at a time (bf16 through AVX-512's widening and rounding instructions where the
CPU has them); the step profile's norm/rope/cache-write parts measure it
(benchmarks/cpu_step_profile.py). Same contracts as the reference's functions; inputs the ops do
not take (layouts other than the model's, mixed dtypes but an fp8 cache's) go to the reference.
cpu_build.py builds the ops.
"""

from __future__ import annotations

import torch

from nanoserve.kernels import reference

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _rows(x: torch.Tensor) -> bool:
    """(T, heads, head_dim) with contiguous heads, rows any stride apart (views into fused qkv)."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """reference.rms_norm: x (..., hidden) -> rms_norm(x), or with `residual` (rms_norm(h), h)."""
    if (x.dtype not in DTYPES or weight.dtype != x.dtype or not x.is_contiguous() or x.numel() == 0
            or (residual is not None and (residual.dtype != x.dtype or not residual.is_contiguous()))):
        return reference.rms_norm(x, weight, eps, residual)
    out = torch.empty_like(x)
    h = None if residual is None else torch.empty_like(x)
    torch.ops.nanoserve_cpu.rms_norm(out, x, weight.contiguous(), eps, residual, h)
    return out if residual is None else (out, h)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor):
    """reference.rotary_embedding: rotates q and k in place; returns (q, k)."""
    if (q.dtype not in DTYPES or k.dtype != q.dtype or not (_rows(q) and _rows(k))
            or cos_sin_cache.dtype != torch.float32 or q.shape[0] == 0):
        return reference.rotary_embedding(positions, q, k, cos_sin_cache)
    torch.ops.nanoserve_cpu.rotary_embedding(positions.long().contiguous(), q, k,
                                             cos_sin_cache.contiguous())
    return q, k


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """reference.reshape_and_cache: this step's K/V rows into their slots (-1: skip); into an fp8
    cache quantized as the reference quantizes them (to_cache), with the scales."""
    takes = k_cache.dtype == k.dtype or (k_cache.dtype == torch.float8_e4m3fn and k.dtype in DTYPES)
    if (not takes or v.dtype != k.dtype or v_cache.dtype != k_cache.dtype or not (_rows(k) and _rows(v))
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        return reference.reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    torch.ops.nanoserve_cpu.reshape_and_cache(k, v, k_cache, v_cache, slot_mapping.long().contiguous(),
                                              k_scale, v_scale)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """reference.silu_and_mul: x (..., 2 * d) = [gate | up] -> silu(gate) * up, (..., d)."""
    if x.dtype not in DTYPES or not x.is_contiguous() or x.dim() == 0 or x.shape[-1] % 2:
        return reference.silu_and_mul(x)
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype)
    torch.ops.nanoserve_cpu.silu_and_mul(out, x)
    return out
