"""CPU matmuls: oneDNN-prepacked weights, and a GEMV for a few rows.

A batch-1 decode step is a chain of matrix-vector products, so its speed is the speed at
which the CPU streams weights, and that depends on the weight's layout in memory. oneDNN
(`torch.ops.mkldnn`) can reorder a weight once into the blocked layout its kernels stream
best; vLLM's CPU backend (`dispatch_cpu_unquantized_gemm`) and torch.compile's freezing pass
do the same (benchmarks/cpu_linear.py measures F.linear against it at batch 1 to 2048).

Up to GEMV_ROWS rows go to a GEMV of our own instead (cpu_gemv.cpp, where the C++ ops build): each
thread streams a contiguous range of the *dense* weight's rows in memory order, which reads the
weights faster than oneDNN does at one row (benchmarks/cpu_linear.py). It needs the dense weight,
so a layer then holds its weight twice, dense and packed: a model keeps the dense copies while its
weights take at most an eighth of the machine's memory (`room_for_dense`), and runs one row on
oneDNN above that.

A CPU without bf16 instructions (AVX2 only, no avx512_bf16/AMX) has no oneDNN bf16 kernel, and
torch's own bf16 gemm there is a slow generic loop, several times slower than fp32
(benchmarks/cpu_linear.py). There a bf16 (or fp16)
layer keeps its weight twice (`compute_dtype`): a packed fp32 copy for batches of more rows,
computed in fp32 and rounded to bf16 as a bf16 gemm with fp32 accumulation would be, and
the dense bf16 weight for the GEMV (or F.linear, without the C++ ops), which reads half the bytes
of the fp32 copy.

`PackedLinear.from_linear(m)` swaps an nn.Linear for one that holds the packed weight (and the
dense one, as above); its state_dict still has the plain `weight`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.kernels.cpu_huge_pages import to_huge_pages

# oneDNN keeps the primitive it built for each input shape in two LRU caches (ideep's and
# oneDNN's own, 1024 entries each by default), and a server's steps bring a new token count
# nearly every step: filled to 1024 shapes, the caches held a few hundred MB and the server's
# memory grew for thousands of requests (benchmarks/soak.py). Both read their capacity from the
# environment at their first use, which comes after this import; a user's own setting wins.
PRIMITIVE_CACHE_CAPACITY = 64
for _var in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
    os.environ.setdefault(_var, str(PRIMITIVE_CACHE_CAPACITY))

GEMV_ROWS = 8  # rows up to this go to the GEMV (a verify of up to 7 drafts), more to oneDNN
GEMV_DTYPES = (torch.float32, torch.bfloat16)


def supported(dtype: torch.dtype) -> bool:
    """Can oneDNN run a linear layer of this dtype on this CPU?"""
    if not torch.backends.mkldnn.is_available():
        return False
    return {torch.float32: True, torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
            torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported()}.get(dtype, False)


def compute_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The dtype a packed CPU linear of `dtype` weights computes in: `dtype` itself where oneDNN
    has a kernel for it, fp32 for a 16-bit float where it has none, None where oneDNN can't help."""
    if supported(dtype):
        return dtype
    if dtype in (torch.bfloat16, torch.float16) and supported(torch.float32):
        return torch.float32
    return None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) dense weight -> opaque oneDNN tensor of the same shape."""
    # no batch-size hint: one packing served batch 1 to 2048 within 8% of the best per-size one
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: (..., in) -> (..., out), as F.linear(x, weight, bias); x in the packed weight's dtype."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def room_for_dense(nbytes: int) -> bool:
    """May a model of `nbytes` of linear weights keep their dense copies beside the packed ones
    (for the GEMV)? While they take at most an eighth of this machine's memory."""
    import psutil
    return nbytes <= psutil.virtual_memory().total // 8


def _gemv_takes(weight: torch.Tensor) -> bool:
    """Is the GEMV of cpu_gemv.cpp built, chosen (NANOSERVE_KERNELS), and able to take this weight?"""
    from nanoserve.kernels import kernel_backend  # the package imports this module's neighbours
    return (weight.dtype in GEMV_DTYPES and weight.shape[1] % 32 == 0
            and kernel_backend(weight.device) == "cpu")


class PackedLinear(nn.Module):
    """An inference-only nn.Linear on a packed weight. `.to(dtype)` repacks; state_dict() gives
    the dense `weight`, but loading one back is not supported: pack after loading weights.

    Up to GEMV_ROWS rows run on the dense weight in the GEMV when `keep_dense` (and the C++ op
    takes the weight); more rows on the packed weight. Where the packed weight is fp32 but the layer
    bf16/fp16 (`compute_dtype`), those run in fp32 and the output is rounded back, and single rows
    use the dense weight (in the GEMV, else F.linear) whether or not `keep_dense`.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_dense: bool = True):
        super().__init__()
        self.keep_dense = keep_dense
        self._set_weight(weight)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.out_features, self.in_features = weight.shape
        self.register_state_dict_post_hook(_dense_weight)

    def _set_weight(self, weight: torch.Tensor) -> None:
        cdt = compute_dtype(weight.dtype) if weight.device.type == "cpu" else None
        if cdt is None:
            raise ValueError(f"PackedLinear cannot hold a {weight.dtype} weight on {weight.device}: "
                             "oneDNN has no kernel for it here; convert the model before packing it")
        self.dtype, self.compute = weight.dtype, cdt
        self.packed = pack(weight.to(cdt))  # plain attributes: opaque tensors cannot be parameters
        self.gemv = _gemv_takes(weight) and (self.keep_dense or cdt != weight.dtype)
        self.dense = weight.detach().contiguous() if self.gemv or cdt != weight.dtype else None

    @classmethod
    def from_linear(cls, m: nn.Linear, keep_dense: bool = True) -> PackedLinear:
        return cls(m.weight, m.bias, keep_dense)

    def gemv_operands(self, x_dtype: torch.dtype, rows: int) -> tuple | None:
        """(weight, bias) the GEMV takes for `rows` rows of activations, or None where forward
        runs another path (cpu_decode_layer asks too)."""
        return (self.dense, self.bias) if self.gemv and rows <= GEMV_ROWS else None

    def forward(self, x):
        rows = x.numel() // x.shape[-1]
        operands = self.gemv_operands(x.dtype, rows)
        if operands is not None:
            y = x.new_empty(rows, self.out_features)
            torch.ops.nanoserve_cpu.gemv(y, x.reshape(rows, -1).contiguous(), *operands)
            return y.view(*x.shape[:-1], self.out_features)
        if self.compute == self.dtype:
            return linear(x, self.packed, self.bias)
        if rows == 1:  # one row: a weight read, cheaper in the 16-bit copy
            return F.linear(x, self.dense, self.bias)
        bias = None if self.bias is None else self.bias.float()
        return linear(x.float(), self.packed, bias).to(self.dtype)

    def dense_weight(self) -> torch.Tensor:
        return self.packed.to_dense().to(self.dtype) if self.dense is None else self.dense

    def _apply(self, fn, recurse=True):  # .to(), .float(), ...: convert the dense weight, repack
        self._set_weight(fn(self.dense_weight()))
        return super()._apply(fn, recurse)


def linear_for(weight: torch.Tensor) -> tuple[str, Callable[[torch.Tensor], torch.Tensor]]:
    """(name, x -> x @ weight.T) as the engine computes it: packed where oneDNN can run the
    weight's dtype on a CPU (in fp32 for bf16 on a CPU without bf16 kernels) with the GEMV for
    up to GEMV_ROWS rows, F.linear elsewhere."""
    if weight.device.type == "cpu" and compute_dtype(weight.dtype) is not None:
        m = PackedLinear(weight, None)
        name = ("oneDNN linear" + ("" if m.compute == m.dtype else " in fp32")
                + (f", GEMV up to {GEMV_ROWS} rows" if m.gemv else
                   "" if m.compute == m.dtype else ", F.linear for one row"))
        return name, m
    return "F.linear", lambda x: F.linear(x, weight)


def pack_model(model) -> None:
    """Every nn.Linear of `model` becomes a PackedLinear, and `model.lm_head_linear` a packed
    lm_head beside the dense one (a tied model's embedding lookup needs the dense rows; an untied
    one keeps its `lm_head` parameter for state_dict). Dense copies are kept for the GEMV while the
    weights take at most an eighth of the machine's memory (room_for_dense), moved onto huge pages
    (cpu_huge_pages); a bf16 model on a CPU without bf16 kernels keeps its dense weights in any
    case (compute_dtype). Nothing where oneDNN cannot run the weights' dtype. A quantized lm_head
    (model.lm_head_quant) computes the logits instead: the dense one is left as it is."""
    weight = model.lm_head_weight()
    if weight.device.type != "cpu" or compute_dtype(weight.dtype) is None:
        return
    heads = [weight] if getattr(model, "lm_head_quant", None) is None else []
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    dense = room_for_dense(sum(m.weight.nbytes for _, m in linears) + sum(w.nbytes for w in heads))
    if dense:  # the dense weights the GEMV streams, in step order, on huge pages
        params = [m.weight for _, m in linears] + heads
        for p, copy in zip(params, to_huge_pages([p.detach().contiguous() for p in params])):
            p.data = copy
    for name, m in linears:
        parent, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), attr, PackedLinear.from_linear(m, dense))
    if heads:  # a bound method, not a submodule: no state_dict entry, no hook of step_profile's
        model.lm_head_linear = PackedLinear(weight, None, dense).forward


def _dense_weight(module: PackedLinear, state: dict, prefix: str, local_metadata) -> None:
    state[prefix + "weight"] = module.dense_weight()
