"""Weight quantization's reference, plain torch: the code formats, quantize, dequantize, and the
linear layer over codes (W8A16: 8-bit weights, activations in the model's dtype).

A quantized (out, in) weight is `qweight`, its codes (out, in), and `weight_scale`, fp32
(out, groups): weight[r, i] = qweight[r, i] * weight_scale[r, i // group_size], with
group_size = in // groups. One group per row is per-output-channel scaling (what computing the
codes at load gives); 32-value groups are GGUF's Q8_0 blocks, loaded as they are. Codes are
symmetric (no zero point):

    int8  torch.int8           -127..127, round to nearest     scale = max|w| / 127
    fp8   torch.float8_e4m3fn  |x| <= 448 (OCP e4m3: 4 exponent bits, 3 mantissa)
                                                               scale = max|w| / 448

`quantized_linear` dequantizes, then runs the plain F.linear: the specification every fast path
(the CPU GEMV of cpu_quant_gemm.py) is tested against. Activation quantization (W8A8, for fp8
tensor cores) is fp8_w8a8.py's, tested against this within its stated error. Left out: zero
points (asymmetric codes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CODE_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
CODE_MAX = {"int8": 127.0, "fp8": 448.0}  # the largest code magnitude each format holds


def quantize_weight(weight: torch.Tensor, method: str, group_size: int | None = None):
    """(out, in) float weight -> (qweight (out, in) codes, weight_scale (out, groups) fp32).

    group_size None: one scale per output row. Each group's largest |w| maps to the largest code,
    so nothing clips; an all-zero group gets scale 1 (its codes are 0 either way)."""
    if method not in CODE_DTYPES:
        raise ValueError(f"quantization method {method!r} is not supported; supported: {list(CODE_DTYPES)}")
    out, n = weight.shape
    g = n if group_size is None else group_size
    if g < 1 or n % g:
        raise ValueError(f"group_size={group_size} must divide the weight's {n} input features")
    w = weight.float().view(out, n // g, g)  # (out, groups, group_size)
    amax = w.abs().amax(-1)  # (out, groups)
    scale = torch.where(amax > 0, amax / CODE_MAX[method], torch.ones_like(amax))
    q = w / scale[..., None]
    if method == "int8":
        q = q.round().clamp(-127, 127)
    else:  # the cast rounds to nearest even; clamped first, as an fp32 ulp past 448 would be NaN
        q = q.clamp(-448.0, 448.0)
    return q.to(CODE_DTYPES[method]).view(out, n), scale


def dequantize_weight(qweight: torch.Tensor, weight_scale: torch.Tensor,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Codes (out, in) and scales (out, groups) -> the (out, in) weight in `dtype`, computed in fp32."""
    out, n = qweight.shape
    groups = weight_scale.shape[1]
    w = qweight.float().view(out, groups, n // groups) * weight_scale.float()[..., None]
    return w.view(out, n).to(dtype)


def quantized_linear(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) -> (..., out): F.linear with the weight dequantized to x's dtype."""
    return F.linear(x, dequantize_weight(qweight, weight_scale, x.dtype), bias)


def is_quantized_linear(module) -> bool:
    """Does `module` hold a quantized linear's tensors (`qweight` and `weight_scale`)?"""
    return isinstance(getattr(module, "qweight", None), torch.Tensor) and \
        isinstance(getattr(module, "weight_scale", None), torch.Tensor)
