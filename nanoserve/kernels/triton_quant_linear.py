"""The W8A16 linear in Triton: y = x @ dequantize(qweight, weight_scale).T + bias, the codes read as
they are (int8 or fp8 e4m3: a byte per weight) and widened in registers. kernels/quantization.py's
quantized_linear, which dequantizes the whole weight first, is the specification. Three paths, by
the number of rows of x, because decode and prefill are different workloads:

- A few rows (decode, up to GEMV_ROWS): `_w8a16_gemv_kernel`. A step reads every code once, so
  the kernel must stream them at the memory's rate: one program owns BLOCK_N outputs and reads
  their codes in long BLOCK_K runs, each code widened once and used for every row of x, summed in
  fp32 without tensor cores (a tensor-core tile would be 16 rows, mostly padding). A split of K
  over programs, when the outputs alone are too few to fill the card, has each write an fp32
  partial that torch sums in a fixed order, so a result does not depend on timing.
- A middling batch: `_w8a16_kernel`, one BLOCK_M x BLOCK_N tile of y per program: it walks K
  BLOCK_K values at a time, multiplies x's tile by the codes' tile (tl.dot, fp32 accumulation; the
  codes widened to x's dtype, exactly: an int8 or e4m3 value fits bf16's and fp16's 8 and 11
  significant bits) and adds the product times each output row's scale of that group. K is split
  over programs as the GEMV's is, which a narrow layer (few output tiles, long K) needs. Up to 16
  rows it computes y's transpose (swap_ab), so the codes, not x's few rows, fill the tensor
  cores' long side.
- Many rows (prefill, from DEQUANT_ROWS): the matmul is compute-bound and cuBLAS's bf16 tiles are
  the fast ones, so `_dequantize_kernel` writes the weight in x's dtype (one read of a byte, one
  write of two) and F.linear runs it.

BLOCK_K divides the group size, so a K-step lies in one group; per-channel scales are one group
of all K. `pack_quantized(model)` puts a CUDA model's quantized linears on it (kernels.process_
weights_after_loading on the Triton backend). Activations other than fp32, fp16 and bf16, and
groups not a multiple of 16 values, take the reference. Per-channel fp8 codes with bf16 activations on
a card with fp8 tensor cores take fp8_w8a8.py's W8A8 product past GEMV_ROWS rows, where
NANOSERVE_FP8_W8A8 asks for it. Left out: autotuning (benchmarks/gpu_check.py's quant_linear
section times the choices on a GPU).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from nanoserve import env
from nanoserve.kernels import fp8_w8a8
from nanoserve.kernels.quantization import is_quantized_linear
from nanoserve.kernels.quantization import quantized_linear as reference_linear

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INTERPRETED = env.get("TRITON_INTERPRET") == "1"  # read once: triton reads it at import
# where each path wins on Llama-3-8B's gate_up and down, by gpu_check's quant_linear section
# (benchmarks/results/gpu-*): the GEMV at 1-2 rows (its FMAs grow with the rows, so the tiles win
# from 4), cuBLAS on a dequantized copy from 256 (at 128 the tiles but on fp8's gate_up, 185 us
# against 172); 3 and 129-255 rows untimed
GEMV_ROWS = 2
DEQUANT_ROWS = 256


@triton.jit
def _w8a16_gemv_kernel(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, k_per_split, groups, group_size,
                       stride_xm, stride_qn, stride_yk, stride_ym,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       ONE_GROUP: tl.constexpr):
    # program (n, split): BLOCK_N outputs for every row, over K from split * k_per_split; writes
    # fp32 sums times the scales to y[split] (M, N)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + rk
        k_ok = k < k_hi
        q_ok = n_ok[:, None] & k_ok[None, :]
        # masked codes zeroed after the widening (an fp8 load has no zero `other`, and a stray
        # code could be NaN)
        q = tl.load(q_ptr + rn[:, None].to(tl.int64) * stride_qn + k[None, :], mask=q_ok)
        q = tl.where(q_ok, q.to(tl.float32), 0.0)  # (BLOCK_N, BLOCK_K)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for m in tl.static_range(BLOCK_M):  # each row reuses the widened codes
            # a padding row (m >= M) reads the last row again; its sums are never stored
            x = tl.load(x_ptr + tl.minimum(m, M - 1) * stride_xm + k, mask=k_ok, other=0.0).to(tl.float32)
            part += tl.where(rm[:, None] == m, tl.sum(q * x[None, :], axis=1)[None, :], 0.0)
        if ONE_GROUP:
            acc += part
        else:
            acc += part * tl.load(s_ptr + rn * groups + k0 // group_size, mask=n_ok, other=0.0)[None, :]
    if ONE_GROUP:
        acc *= tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
    tl.store(y_ptr + tl.program_id(1) * stride_yk + rm[:, None] * stride_ym + rn[None, :], acc,
             mask=(rm[:, None] < M) & n_ok[None, :])


@triton.jit
def _dequantize_kernel(q_ptr, s_ptr, w_ptr, N, K, groups, group_size,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rn[:, None] < N) & (rk[None, :] < K)
    offs = rn[:, None].to(tl.int64) * K + rk[None, :]
    q = tl.load(q_ptr + offs, mask=ok).to(tl.float32)
    s = tl.load(s_ptr + rn[:, None] * groups + rk[None, :] // group_size, mask=ok, other=0.0)
    tl.store(w_ptr + offs, (q * s).to(w_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _w8a16_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, M, N, K, k_per_split, groups, group_size,
                  stride_xm, stride_qn, stride_yk, stride_ym,
                  HAS_BIAS: tl.constexpr, NATIVE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  SWAP_AB: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # program (m, n, split): a BLOCK_M x BLOCK_N tile of y over K from split * k_per_split. SWAP_AB
    # computes its transpose, codes (BLOCK_N, BLOCK_K) times x's tile transposed: the codes, not
    # x's few rows, then fill the tensor cores' long side
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + rk
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=m_ok[:, None] & (k[None, :] < k_hi), other=0.0)
        s = tl.load(s_ptr + rn * groups + k0 // group_size, mask=n_ok, other=0.0)
        # masked codes zeroed after the widening (an fp8 load has no zero `other`, and a stray code
        # could be NaN)
        if SWAP_AB:
            q_ok = n_ok[:, None] & (k[None, :] < k_hi)
            q = tl.load(q_ptr + rn[:, None].to(tl.int64) * stride_qn + k[None, :], mask=q_ok)
        else:  # (BLOCK_K, BLOCK_N): the weight's transpose
            q_ok = n_ok[None, :] & (k[:, None] < k_hi)
            q = tl.load(q_ptr + rn[None, :].to(tl.int64) * stride_qn + k[:, None], mask=q_ok)
        if NATIVE:  # a 16-bit tile as it is, fp32 accumulation
            q = tl.where(q_ok, q.to(x.dtype), 0.0).to(x.dtype)
        else:
            x, q = x.to(tl.float32), tl.where(q_ok, q.to(tl.float32), 0.0)
        if SWAP_AB:
            acc += tl.dot(q, tl.trans(x), input_precision=DOT_PRECISION) * s[:, None]
        else:
            acc += tl.dot(x, q, input_precision=DOT_PRECISION) * s[None, :]
    if SWAP_AB:
        acc = tl.trans(acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + tl.program_id(2) * stride_yk + rm[:, None].to(tl.int64) * stride_ym + rn[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    """The card's streaming multiprocessors, asked once: gemv runs for every decode linear."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def _shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on the card (227 KiB on Hopper, 99 on Ada);
    Ada's where this torch does not say."""
    return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 99 << 10)


def _split_k(x2: torch.Tensor, k: int, tiles: int, block_k: int, split_k: int | None,
             per_sm: int) -> tuple[int, int]:
    """(splits, K per split, a multiple of block_k) for `tiles` programs along the outputs. None:
    enough splits that the card has about `per_sm` programs per streaming multiprocessor, each
    split at least 4 * block_k long."""
    if split_k is None:
        sms = _multiprocessors(x2.device) if x2.is_cuda else 1
        split_k = max(1, min(per_sm * sms // max(tiles, 1), k // (4 * block_k)))  # no rows: no tiles
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    return triton.cdiv(k, k_per_split), k_per_split


def _in_one_group(block_k: int, k: int, groups: int) -> int:
    """block_k, lowered where needed to the largest power of two dividing the group, so a K-step
    lies in one group and takes one scale."""
    group_size = k // groups
    return block_k if groups == 1 else min(block_k, group_size & -group_size)


def _sum_splits(partial: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The fp32 partial sums (splits, M, N) added in a fixed order, then the bias, in `dtype`."""
    y = partial[0] if partial.shape[0] == 1 else partial.sum(0)
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def gemv(x2: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
         block_n: int = 16, block_k: int = 512, split_k: int | None = None,
         num_warps: int = 4) -> torch.Tensor:
    """x2 (M <= 16, K) -> (M, N) in x2's dtype by _w8a16_gemv_kernel; the tile and the split are
    parameters so a benchmark can time the choices (split_k None: _split_k's default)."""
    m, k = x2.shape
    n, groups = qweight.shape[0], weight_scale.shape[1]
    block_k = _in_one_group(block_k, k, groups)
    split_k, k_per_split = _split_k(x2, k, triton.cdiv(n, block_n), block_k, split_k, per_sm=8)
    partial = torch.empty(split_k, m, n, dtype=torch.float32, device=x2.device)
    _w8a16_gemv_kernel[(triton.cdiv(n, block_n), split_k)](
        x2, qweight, weight_scale, partial, m, n, k, k_per_split, groups, k // groups,
        x2.stride(0), qweight.stride(0), partial.stride(0), partial.stride(1),
        BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=block_k, ONE_GROUP=groups == 1,
        num_warps=num_warps)
    return _sum_splits(partial, bias, x2.dtype)


def dequantize(qweight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (out, in) weight in `dtype`, each value code * scale in fp32 rounded once, as the
    reference's dequantize_weight computes it, in one pass."""
    n, k = qweight.shape
    groups = weight_scale.shape[1]
    w = torch.empty(n, k, dtype=dtype, device=qweight.device)
    _dequantize_kernel[(triton.cdiv(n, 16), triton.cdiv(k, 256))](
        qweight, weight_scale, w, n, k, groups, k // groups, BLOCK_N=16, BLOCK_K=256)
    return w


def quantized_linear(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """The reference's contract: x (..., in) -> (..., out) in x's dtype, from codes (out, in) and
    fp32 scales (out, groups)."""
    out_features, k = qweight.shape
    groups = weight_scale.shape[1]
    group_size = k // groups
    if x.dtype not in ACTIVATION_DTYPES or (groups > 1 and group_size % 16):  # tl.dot's least K: 16
        return reference_linear(x, qweight, weight_scale, bias)
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    if 0 < m <= GEMV_ROWS:
        y = gemv(x2, qweight, weight_scale, bias)
    elif m >= DEQUANT_ROWS:
        y = F.linear(x2, dequantize(qweight, weight_scale, x.dtype), bias)
    else:
        y = tiled(x2, qweight, weight_scale, bias)
    return y.view(*x.shape[:-1], out_features)


def tiled(x2: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
          block_k: int = 128, block_n: int | None = None, split_k: int | None = None, num_warps: int = 4,
          num_stages: int | None = None, swap_ab: bool | None = None) -> torch.Tensor:
    """x2 (M, K) -> (M, N) in x2's dtype by _w8a16_kernel's tl.dot tiles; block_k divides the group.
    The tile, the split of K (None: _split_k's default) and the launch are parameters so a
    benchmark can time the choices; a split writes fp32 partials that torch sums, as the GEMV's."""
    m, k = x2.shape
    out_features, groups = qweight.shape[0], weight_scale.shape[1]
    block_k = _in_one_group(block_k, k, groups)
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    if swap_ab is None:
        swap_ab = m <= 16
    if block_n is None:
        block_n = 64
    if num_stages is None:  # 4, as timed on an H200, where a card's shared memory holds them
        stage = block_m * block_k * x2.element_size() + block_n * block_k  # x's tile and the codes'
        num_stages = max(2, min(4, 3 * _shared_memory(x2.device) // (4 * stage))) if x2.is_cuda else 4
    tiles = triton.cdiv(m, block_m) * triton.cdiv(out_features, block_n)
    split_k, k_per_split = _split_k(x2, k, tiles, block_k, split_k, per_sm=4)
    if split_k == 1:
        y = torch.empty(1, m, out_features, dtype=x2.dtype, device=x2.device)
    else:
        y = torch.empty(split_k, m, out_features, dtype=torch.float32, device=x2.device)
    # fp32 activations get full fp32 products, as the reference's (not tf32); under the
    # interpreter bf16 is computed in fp32, as its bf16 arithmetic is wrong
    native = x2.dtype == torch.float16 or (x2.dtype == torch.bfloat16 and not INTERPRETED)
    in_kernel_bias = bias is not None and split_k == 1
    grid = (triton.cdiv(m, block_m), triton.cdiv(out_features, block_n), split_k)
    _w8a16_kernel[grid](x2, qweight, weight_scale, bias if in_kernel_bias else y, y,
                        m, out_features, k, k_per_split, groups, k // groups,
                        x2.stride(0), qweight.stride(0), y.stride(0), y.stride(1),
                        HAS_BIAS=in_kernel_bias, NATIVE=native,
                        DOT_PRECISION="ieee" if x2.dtype == torch.float32 else "tf32", SWAP_AB=swap_ab,
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                        num_warps=num_warps, num_stages=num_stages)
    return y[0] if split_k == 1 else _sum_splits(y, bias, x2.dtype)


class QuantizedTritonLinear(nn.Module):
    """A quantized linear computed by the Triton kernel; holds `qweight`, `weight_scale`, `bias`.
    `w8a8`: bf16 activations are quantized per token for fp8 tensor cores (fp8_w8a8.runs_w8a8)."""

    def __init__(self, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("weight_scale", weight_scale.contiguous())
        self.bias = bias
        self.out_features, self.in_features = qweight.shape
        self.w8a8 = fp8_w8a8.runs_w8a8(self.qweight, self.weight_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w8a8 and x.dtype == torch.bfloat16 and x.numel() > GEMV_ROWS * self.in_features:
            return fp8_w8a8.fp8_w8a8_linear(x, self.qweight, self.weight_scale, self.bias)
        return quantized_linear(x, self.qweight, self.weight_scale, self.bias)


def pack_quantized(model: nn.Module) -> None:
    """Every quantized linear of `model` becomes a QuantizedTritonLinear, its tensors kept."""
    layers = [(name, m) for name, m in model.named_modules()
              if is_quantized_linear(m) and not isinstance(m, QuantizedTritonLinear)]
    for name, m in layers:
        parent, _, attr = name.rpartition(".")  # parent "" is the model itself
        setattr(model.get_submodule(parent), attr,
                QuantizedTritonLinear(m.qweight, m.weight_scale, getattr(m, "bias", None)))
