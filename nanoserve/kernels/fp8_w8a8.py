"""The W8A8 fp8 linear: x quantized to e4m3 per token at run time, the product on fp8 tensor cores.

vLLM's fp8 linear with dynamic per-token activation scales and per-channel weight scales
(Fp8LinearMethod): each row of x gets the scale max|x_row| / 448, so its largest value lands on
e4m3's largest; torch._scaled_mm multiplies the two e4m3 matrices on the tensor cores and applies
the row's and the output channel's scales. It runs where NANOSERVE_FP8_W8A8=1 asks for it, on
CUDA cards with fp8 tensor cores (compute capability 8.9 and up: Ada, Hopper, Blackwell), for bf16
activations past a decode's few rows; otherwise fp8 weights are weight-only (W8A16), as the
documented `quantization="fp8"` says. Opt-in because here it bought no speed: the per-token
quantization is five plain torch ops over x, unfused, which cost what the fp8 tensor cores save
(benchmarks/gpu_check.py's 8B prefill and quant_linear sections).

Against the W8A16 reference (kernels/quantization.py) the one new error is x's rounding to e4m3:
at most 2^-4 of each |x_i| (3 mantissa bits), and below e4m3's smallest normal at most 2^-10 of
the row's scale, so |y - ref| <= sum_i |w_i| (2^-4 |x_i| + 2^-10 s) plus the accumulation's and
the output's rounding. Hopper's fp8 tensor cores accumulate in fewer bits than fp32 (DeepSeek-V3
technical report, arXiv 2412.19437, section 3.3.2, puts it at about 14); benchmarks/gpu_check.py
measures the card's sums against exact arithmetic, and tests/kernels allows for them.
"""

from __future__ import annotations

import torch

from nanoserve import env

FP8_MAX = 448.0  # e4m3's largest finite value


def has_fp8_tensor_cores(device: torch.device) -> bool:
    """Whether `device` is a CUDA card whose tensor cores multiply e4m3 (compute capability >= 8.9)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def runs_w8a8(qweight: torch.Tensor, weight_scale: torch.Tensor) -> bool:
    """Whether these codes take the W8A8 path: asked for (NANOSERVE_FP8_W8A8), fp8 codes with one
    scale per output channel, on a card with fp8 tensor cores, both dimensions multiples of 16
    (_scaled_mm's tile)."""
    out_features, in_features = qweight.shape
    return (env.flag("NANOSERVE_FP8_W8A8") and qweight.dtype == torch.float8_e4m3fn
            and weight_scale.shape[1] == 1 and out_features % 16 == 0 and in_features % 16 == 0
            and has_fp8_tensor_cores(qweight.device))


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (e4m3 codes (M, K), fp32 scales (M, 1)) with x ~= codes * scales. A row of zeros
    gets a tiny scale and zero codes; a row holding inf or NaN comes out NaN."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    # divided by a tensor on x's device: CUDA divides by a Python number as a product with its
    # reciprocal, an ulp off the CPU's quotient for most values, and so the codes too
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp(min=torch.finfo(torch.float32).tiny)
    codes = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def fp8_w8a8_linear(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) bf16 -> (..., out) bf16, from e4m3 codes (out, in) and fp32 scales (out, 1)."""
    out_features, k = qweight.shape
    codes, x_scale = quantize_per_token(x.reshape(-1, k))
    # qweight.t() is the column-major (in, out) operand _scaled_mm wants, without a copy
    y = torch._scaled_mm(codes, qweight.t(), scale_a=x_scale, scale_b=weight_scale.reshape(1, -1),
                         out_dtype=torch.bfloat16)
    if bias is not None:
        y.add_(bias)  # in place: the output stays bf16 whatever the bias's dtype
    return y.view(*x.shape[:-1], out_features)
