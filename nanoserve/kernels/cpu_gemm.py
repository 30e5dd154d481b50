"""CPU matmuls on oneDNN-prepacked weights: what a CPU decode step spends its time in.

A batch-1 decode step is a chain of matrix-vector products, so its speed is the speed at
which the CPU streams weights, and that depends on the weight's layout in memory. oneDNN
(`torch.ops.mkldnn`) can reorder a weight once into the blocked layout its kernels stream
best; vLLM's CPU backend (`dispatch_cpu_unquantized_gemm`) and torch.compile's freezing pass
do the same. Measured with benchmarks/cpu_linear.py on a 2-core AMD EPYC (torch 2.13,
llama-120m's 48 layer matrices, far bigger than the 32 MiB L3), ms per pass, F.linear vs packed:
fp32 batch 1 22.2 vs 12.3 (25 GB/s), batch 64 97.7 vs 49.5, batch 2048 1635 vs 1555;
bf16 batch 1 11.8 vs 7.8, batch 64 34.1 vs 27.0, batch 2048 795 vs 726.

`PackedLinear.from_linear(m)` swaps an nn.Linear for one that holds only the packed weight
(no second copy in memory); its state_dict still has the plain `weight`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def supported(dtype: torch.dtype) -> bool:
    """Can oneDNN run a linear layer of this dtype on this CPU?"""
    if not torch.backends.mkldnn.is_available():
        return False
    return {torch.float32: True, torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
            torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported()}.get(dtype, False)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) dense weight -> opaque oneDNN tensor of the same shape."""
    # no batch-size hint: one packing served batch 1 to 2048 within 8% of the best per-size one
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: (..., in) -> (..., out), as F.linear(x, weight, bias)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def linear_for(weight: torch.Tensor) -> tuple[str, Callable[[torch.Tensor], torch.Tensor]]:
    """(name, x -> x @ weight.T) as the engine computes it: packed where oneDNN supports the
    weight's dtype on a CPU, F.linear elsewhere."""
    if weight.device.type == "cpu" and supported(weight.dtype):
        packed = pack(weight)
        return "oneDNN linear", lambda x: linear(x, packed)
    return "F.linear", lambda x: F.linear(x, weight)


class PackedLinear(nn.Module):
    """An inference-only nn.Linear on a packed weight. `.to(dtype)` repacks; state_dict() gives
    the dense `weight`, but loading one back is not supported: pack after loading weights."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.packed = packed  # a plain attribute: opaque tensors cannot be parameters
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.out_features, self.in_features = packed.shape
        self.register_state_dict_post_hook(_dense_weight)

    @classmethod
    def from_linear(cls, m: nn.Linear) -> PackedLinear:
        return cls(pack(m.weight), m.bias)

    def forward(self, x):
        return linear(x, self.packed, self.bias)

    def _apply(self, fn, recurse=True):  # .to(), .float(), ...: convert the dense weight, repack
        dense = fn(self.packed.to_dense())
        if dense.device.type != "cpu" or not supported(dense.dtype):
            raise ValueError(f"PackedLinear cannot move to {dense.dtype} on {dense.device}: oneDNN "
                             "has no such kernel here; convert the model before packing it")
        self.packed = pack(dense)
        return super()._apply(fn, recurse)


def _dense_weight(module: PackedLinear, state: dict, prefix: str, local_metadata) -> None:
    state[prefix + "weight"] = module.packed.to_dense()
