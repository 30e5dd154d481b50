"""CPU linears over 8-bit weight codes: the GEMV for a few rows, a dequantized layer for more.

A quantized linear (model/quantization.py's QuantizedLinear: any module holding `qweight`, int8 or
float8_e4m3fn codes (out, in), and `weight_scale`, fp32 (out, groups)) computes, by the reference,
F.linear on its weight dequantized afresh each call. Where the C++ ops build, `pack_quantized`
swaps each for a QuantizedCpuLinear:

- up to GEMV_ROWS rows (decode at small batch, a speculative verify) run the GEMV of
  cpu_quant_gemv.cpp, which reads the codes and scales directly: a byte per weight, the point of
  quantizing (benchmarks/quantization.py measures its weight-read rate against a float GEMV's).
  Each row is summed as it would be alone, so a verify's rows get a decode's logits;
- from GEMV_ROWS + 1 to AMX_ROWS rows of bf16 activations, on a CPU with AMX tiles, run the
  matmul of cpu_quant_gemv.cpp that widens the codes a panel of 16 output rows at a time into a
  buffer that stays in cache and multiplies it on the tiles (both formats, any scale groups of a
  multiple of 16 values);
- elsewhere, from GEMV_ROWS + 1 to INT8PACK_ROWS rows of bf16 activations over int8 codes with one
  scale per channel run torch's weight-only int8 matmul (torch._weight_int8pack_mm, the scales in
  bf16);
- more rows, and (without AMX) fp8 or grouped codes, dequantize the layer into one buffer the model's layers
  share (the largest layer's size, allocated once), then run F.linear on it: a prefill chunk's
  matmul does enough arithmetic per weight that the extra pass over the weight costs little.

Its state_dict keeps `qweight`, `weight_scale` (and `bias`). Activations other than fp32 and bf16
(fp16) take the reference's path.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.kernels.cpu_gemm import GEMV_ROWS  # the float GEMV's bound: a verify row stays a GEMV row
from nanoserve.kernels.cpu_huge_pages import to_huge_pages
from nanoserve.kernels.quantization import is_quantized_linear, quantized_linear

# int8 codes with a scale per channel and bf16 activations: past the GEMV's rows, up to this many
# run torch's weight-only int8 matmul, which reads the codes as they are; fp32 activations never do
# (its fp32 kernel is many times slower than the GEMV or a dequantized matmul), nor do more rows
# (benchmarks/quantization.py, rows tables)
INT8PACK_ROWS = 64
AMX_ROWS = 64  # four of the tile unit's 16-row accumulators (cpu_quant_gemv.cpp's amx)
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)


def _takes(qweight: torch.Tensor, weight_scale: torch.Tensor) -> bool:
    """Can the C++ ops read these codes (groups of a multiple of 8 values, a vector's width)?"""
    return qweight.dim() == 2 and qweight.shape[1] % weight_scale.shape[1] == 0 and \
        (qweight.shape[1] // weight_scale.shape[1]) % 8 == 0


@functools.cache
def amx_available() -> bool:
    """Was cpu_quant_gemv.cpp built with AMX, and does the OS hand out the tiles?"""
    return bool(torch.ops.nanoserve_cpu.quant_amx_available())


class DequantBuffer:
    """One flat buffer per dtype, reused by every layer of a model for its dequantized weight
    (layers run one after another, so one weight is in flight at a time)."""

    def __init__(self, numel: int):
        self.numel, self.buffers = numel, {}

    def get(self, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
        buf = self.buffers.get(dtype)
        if buf is None:
            buf = self.buffers[dtype] = torch.empty(self.numel, dtype=dtype)
        return buf[:shape[0] * shape[1]].view(shape)


class QuantizedCpuLinear(nn.Module):
    """A quantized linear on the C++ ops: the GEMV up to GEMV_ROWS rows, a dequantized matmul above."""

    def __init__(self, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 buffer: DequantBuffer):
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("weight_scale", weight_scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.out_features, self.in_features = qweight.shape
        self.buffer = buffer
        # torch's kernel reads 32 input values at a time (other sizes crash it)
        self.int8pack = (qweight.dtype == torch.int8 and weight_scale.shape[1] == 1
                         and self.in_features % 32 == 0)
        self.int8pack_scale = None  # the per-channel scales in bf16, for _weight_int8pack_mm, made once
        # the tiles' lookup of int8 codes holds -127..127 (quantize_weight's range), not -128
        self.amx = (amx_available() and self.in_features % 32 == 0
                    and (self.in_features // weight_scale.shape[1]) % 16 == 0
                    and not (qweight.dtype == torch.int8 and bool((qweight == -128).any())))

    def _runs_on(self, x_dtype: torch.dtype) -> bool:
        """Do the C++ paths take these activations (else the reference)?"""
        return x_dtype in ACTIVATION_DTYPES and (self.bias is None or self.bias.dtype == x_dtype)

    def gemv_operands(self, x_dtype: torch.dtype, rows: int) -> tuple | None:
        """(codes, scales, bias) the GEMV over codes takes for `rows` rows of activations, or None
        where forward runs another path (cpu_decode_layer asks too)."""
        few = rows <= GEMV_ROWS
        return (self.qweight, self.weight_scale, self.bias) if few and self._runs_on(x_dtype) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._runs_on(x.dtype):
            return quantized_linear(x, self.qweight, self.weight_scale, self.bias)
        rows = x.numel() // x.shape[-1]
        operands = self.gemv_operands(x.dtype, rows)
        if operands is not None:
            y = x.new_empty(rows, self.out_features)
            torch.ops.nanoserve_cpu.quant_gemv(y, x.reshape(rows, -1).contiguous(), *operands)
            return y.view(*x.shape[:-1], self.out_features)
        if self.amx and x.dtype == torch.bfloat16 and rows <= AMX_ROWS:  # past the GEMV's rows
            y = x.new_empty(rows, self.out_features)
            torch.ops.nanoserve_cpu.quant_amx_linear(y, x.reshape(rows, -1).contiguous(), self.qweight,
                                                     self.weight_scale, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        if self.int8pack and x.dtype == torch.bfloat16 and rows <= INT8PACK_ROWS:
            if self.int8pack_scale is None:
                self.int8pack_scale = self.weight_scale[:, 0].to(torch.bfloat16)
            y = torch._weight_int8pack_mm(x.reshape(rows, -1).contiguous(), self.qweight, self.int8pack_scale)
            y = y if self.bias is None else y + self.bias
            return y.view(*x.shape[:-1], self.out_features)
        w = self.buffer.get((self.out_features, self.in_features), x.dtype)
        torch.ops.nanoserve_cpu.quant_dequantize(w, self.qweight, self.weight_scale)
        return F.linear(x, w, self.bias)


def pack_quantized(model: nn.Module) -> None:
    """Every quantized linear of `model` whose codes the C++ ops read becomes a QuantizedCpuLinear,
    all sharing one DequantBuffer, their codes on huge pages (cpu_huge_pages). Call only where the
    C++ ops are built and chosen."""
    layers = [(name, m) for name, m in model.named_modules()
              if is_quantized_linear(m) and not isinstance(m, QuantizedCpuLinear)
              and m.qweight.device.type == "cpu" and _takes(m.qweight, m.weight_scale)]
    if not layers:
        return
    buffer = DequantBuffer(max(m.qweight.numel() for _, m in layers))
    codes = to_huge_pages([m.qweight.contiguous() for _, m in layers])  # the GEMV's stream, in step order
    for (name, m), qweight in zip(layers, codes):
        parent, _, attr = name.rpartition(".")  # parent "" is the model itself
        setattr(model.get_submodule(parent), attr,
                QuantizedCpuLinear(qweight, m.weight_scale, getattr(m, "bias", None), buffer))
