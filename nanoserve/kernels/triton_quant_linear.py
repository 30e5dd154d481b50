"""The W8A16 linear in Triton: y = x @ dequantize(qweight, weight_scale).T + bias, the codes read as
they are (int8 or fp8 e4m3: a byte per weight) and widened in registers. kernels/quantization.py's
quantized_linear, which dequantizes the whole weight first, is the specification.

One program computes a BLOCK_M x BLOCK_N tile of y: it walks the input dimension BLOCK_K values at
a time, multiplies x's tile by the codes' tile (tl.dot, fp32 accumulation; the codes widened to
x's dtype, exactly: an int8 or e4m3 value fits bf16's and fp16's 8 and 11 significant bits) and
adds the product times each output row's scale of that group. BLOCK_K divides the group size, so
a K-step lies in one group; per-channel scales are one group of all K.

`pack_quantized(model)` puts a CUDA model's quantized linears on it (kernels.process_weights_
after_loading on the Triton backend). Activations other than fp32, fp16 and bf16, and groups of
fewer than 16 values, take the reference. Per-channel fp8 codes with bf16 activations on a card
with fp8 tensor cores take fp8_w8a8.py's W8A8 product instead. Left out: split-K for batch-1
decode, autotuning.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from nanoserve import env
from nanoserve.kernels import fp8_w8a8
from nanoserve.kernels.quantization import is_quantized_linear
from nanoserve.kernels.quantization import quantized_linear as reference_linear

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INTERPRETED = env.get("TRITON_INTERPRET") == "1"  # read once: triton reads it at import


@triton.jit
def _w8a16_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, M, N, K, groups, group_size,
                  stride_xm, stride_qn, stride_ym,
                  HAS_BIAS: tl.constexpr, NATIVE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        q_ok = n_ok[None, :] & (k[:, None] < K)
        # (BLOCK_K, BLOCK_N): the weight's transpose; masked codes zeroed after the widening (an
        # fp8 load has no zero `other`, and a stray code could be NaN)
        q = tl.load(q_ptr + rn[None, :].to(tl.int64) * stride_qn + k[:, None], mask=q_ok)
        s = tl.load(s_ptr + rn * groups + k0 // group_size, mask=n_ok, other=0.0)
        if NATIVE:  # a 16-bit tile as it is, fp32 accumulation
            part = tl.dot(x, tl.where(q_ok, q.to(x.dtype), 0.0).to(x.dtype))
        else:
            part = tl.dot(x.to(tl.float32), tl.where(q_ok, q.to(tl.float32), 0.0),
                          input_precision=DOT_PRECISION)
        acc += part * s[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _block_k(group_size: int) -> int | None:
    """The largest of 64, 32, 16 (tl.dot's smallest K) dividing a group; None if none does."""
    return next((b for b in (64, 32, 16) if group_size % b == 0), None)


def quantized_linear(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """The reference's contract: x (..., in) -> (..., out) in x's dtype, from codes (out, in) and
    fp32 scales (out, groups)."""
    out_features, k = qweight.shape
    groups = weight_scale.shape[1]
    group_size = k // groups
    block_k = _block_k(group_size) if groups > 1 else 64
    if x.dtype not in ACTIVATION_DTYPES or block_k is None:
        return reference_linear(x, qweight, weight_scale, bias)
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = torch.empty(m, out_features, dtype=x.dtype, device=x.device)
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_n = 32 if m <= 16 else 64  # small batches: more, narrower tiles to fill the device
    # fp32 activations get full fp32 products, as the reference's (not tf32); under the
    # interpreter bf16 is computed in fp32, as its bf16 arithmetic is wrong
    native = x.dtype == torch.float16 or (x.dtype == torch.bfloat16 and not INTERPRETED)
    grid = (triton.cdiv(m, block_m), triton.cdiv(out_features, block_n))
    _w8a16_kernel[grid](x2, qweight, weight_scale, bias if bias is not None else y, y,
                        m, out_features, k, groups, group_size,
                        x2.stride(0), qweight.stride(0), y.stride(0),
                        HAS_BIAS=bias is not None, NATIVE=native,
                        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return y.view(*x.shape[:-1], out_features)


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
        if self.w8a8 and x.dtype == torch.bfloat16:
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
