"""Triton kernels with the same signatures as `nanoserve.kernels.reference`.

Each public function is a thin launcher around one @triton.jit kernel; paged attention lives in
`triton_attention.py`. The kernels compute in fp32 and store in the output dtype, like the
reference. On CPU they run only under TRITON_INTERPRET=1, set before this module is imported.

Left out on purpose: fusing rotary into reshape_and_cache, interleaved (GPT-J) rotary,
partial rotary dims, autotuning.
"""

import torch
import triton
import triton.language as tl

from nanoserve.kernels.triton_attention import paged_attention

__all__ = ["rms_norm", "rotary_embedding", "reshape_and_cache", "paged_attention", "silu_and_mul"]
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # e4m3's largest value: where a write saturates


# One program instance = one row of `hidden` values; tile (BLOCK,), BLOCK = next pow2 >= hidden.
@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
                     stride_x, stride_r, hidden, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:  # h = x + residual, rounded to the input dtype as torch's add would be
        x += tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(residual_out_ptr + row * hidden + cols, x, mask=mask)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask).to(tl.float32)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w  # as the reference: cast, then scale
    tl.store(out_ptr + row * hidden + cols, y, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim; with `residual`, returns (rms_norm(x + residual), x + residual)."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)  # (rows, hidden); copies only if x can't be viewed that way
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is not None:
        assert residual.dtype == x.dtype and residual.shape == x.shape
        r2 = residual.reshape(-1, hidden)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        r2 = residual_out = x2  # unused
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, out, residual_out, x2.stride(0), r2.stride(0), hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden))
    return out if residual is None else (out, residual_out)


# One program instance = one token of one tensor (q or k), all its heads at once (neox layout:
# the first half of head_dim pairs with the second). Tile (BLOCK_H, BLOCK_HALF).
@triton.jit
def _rotary_kernel(x_ptr, out_ptr, positions_ptr, cos_sin_ptr,
                   stride_xt, stride_xh, stride_cs, num_heads,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (i < HALF)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + i, mask=i < HALF).to(tl.float32)  # (1, BLOCK_HALF)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + i, mask=i < HALF).to(tl.float32)
    x_off = t * stride_xt + h * stride_xh + i
    x1 = tl.load(x_ptr + x_off, mask=mask).to(tl.float32)  # (BLOCK_H, BLOCK_HALF)
    x2 = tl.load(x_ptr + x_off + HALF, mask=mask).to(tl.float32)
    o_off = t * num_heads * 2 * HALF + h * 2 * HALF + i  # out is contiguous
    tl.store(out_ptr + o_off, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + o_off + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


def _rotate(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    T, num_heads, head_dim = x.shape
    assert cos_sin_cache.shape[1] == head_dim and cos_sin_cache.stride(1) == 1
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((T, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if T > 0:
        _rotary_kernel[(T,)](
            x, out, positions, cos_sin_cache, x.stride(0), x.stride(1), cos_sin_cache.stride(0),
            num_heads, HALF=head_dim // 2, BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2))
    return out


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor):
    """Rotate q (T, num_heads, head_dim) and k (T, num_kv_heads, head_dim); returns new (q, k)."""
    return _rotate(positions, q, cos_sin_cache), _rotate(positions, k, cos_sin_cache)


# One program instance = one token: copies its k and v, tile (BLOCK_H, BLOCK_D) over
# (num_kv_heads, head_dim), to slot_mapping[token] in the paged cache; slot < 0 is padding.
# FP8: stores k / k_scale, v / v_scale saturated at FP8_MAX (reference.to_cache).
@triton.jit
def _reshape_and_cache_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                              stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_cb, stride_cs, stride_ch, block_size, num_kv_heads, head_dim,
                              k_scale, v_scale, FP8_MAX, BLOCK_H: tl.constexpr,
                              BLOCK_D: tl.constexpr, FP8: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)
    dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_cs + h * stride_ch + d
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    if FP8:
        # propagating NaN, as the reference's clamp does (a GPU's min/max would drop it)
        k = tl.minimum(tl.maximum(k.to(tl.float32) / k_scale, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL),
                       FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        v = tl.minimum(tl.maximum(v.to(tl.float32) / v_scale, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL),
                       FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write k, v (T, num_kv_heads, head_dim) to the cache slots in slot_mapping (T,), -1 = skip;
    an fp8 cache holds k / k_scale and v / v_scale."""
    T, num_kv_heads, head_dim = k.shape
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.stride(-1) == 1
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if T > 0:
        _reshape_and_cache_kernel[(T,)](
            k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.shape[1],
            num_kv_heads, head_dim, float(k_scale), float(v_scale), FP8_MAX,
            BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
            FP8=k_cache.dtype == torch.float8_e4m3fn)


# One program instance = BLOCK values of one row: gate and up are the row's two halves.
@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0).to(tl.float32)
    # rounded to the dtype before the product, as torch's silu rounds its result
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * d + cols, silu * up, mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x (..., 2 * d) = [gate | up] -> silu(gate) * up, (..., d) in x's dtype."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d).contiguous()  # (rows, 2d)
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    BLOCK = min(1024, triton.next_power_of_2(d))
    if x2.shape[0] > 0 and d > 0:
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, BLOCK))](x2, out, d, BLOCK=BLOCK)
    return out
