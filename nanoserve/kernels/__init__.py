"""The kernels: the one interface between the model and engine and every fast path.

`get_ops(device)` returns a namespace of the five kernels a decoder layer calls, rms_norm,
rotary_embedding, reshape_and_cache, paged_attention and silu_and_mul (the MLP's activation),
with identical signatures: Triton on CUDA when triton is installed (it is Linux-only); on a CPU
the five in C++ (cpu_attention.py, cpu_layer_ops.py: each the reference's arithmetic in one
call) where those ops build (cpu_build.py); the torch reference (reference.py, the
specification) elsewhere. The CPU namespace also has `decode_layers`: at a step of a few
tokens, every layer's kernels called from C++ in one call (cpu_decode_layer.py; off with
`EngineConfig(enforce_eager=True)`). `NANOSERVE_KERNELS=reference|cpu|triton` overrides
(triton on a CPU needs TRITON_INTERPRET=1 set before the first import, and is very slow).

Beside the layer's kernels, the same dispatch serves the engine: `argmax` (greedy sampling; C++
on the CPU backend, cpu_argmax.py; `argmax_for(device)` picks it once) and
`process_weights_after_loading(model)` (a CPU repacks the linear weights for oneDNN, cpu_gemm.py,
and on the CPU backend puts quantized linears on the C++ GEMV over their codes, cpu_quant_gemm.py,
on the Triton backend on triton_quant_linear.py's W8A16 kernel; the reference, quantization.py,
dequantizes per call).
A CPU backend's process-wide setup, the allocator thresholds of cpu_malloc.py, is applied when
get_ops first serves a CPU.

Plug points (the engine never imports course material; a student's kernel is passed in):
`kernel_ops(base, paged_attention=mine)` builds a namespace with some kernels replaced, and
`use_kernels(llm, paged_attention=mine)` installs one in a loaded model (before its first step:
CUDA graphs captured earlier keep the old kernels).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import torch

from nanoserve import env
from nanoserve.kernels import (
    cpu_argmax,
    cpu_attention,
    cpu_build,
    cpu_decode_layer,
    cpu_gemm,
    cpu_layer_ops,
    cpu_malloc,
    cpu_quant_gemm,
    reference,
)
from nanoserve.kernels.metadata import AttentionMetadata

BACKENDS = ("reference", "cpu", "triton")
KERNEL_NAMES = ("rms_norm", "rotary_embedding", "reshape_and_cache", "paged_attention", "silu_and_mul")

__all__ = ["AttentionMetadata", "BACKENDS", "KERNEL_NAMES", "argmax", "argmax_for", "get_ops",
           "kernel_backend", "kernel_ops", "process_weights_after_loading", "use_kernels"]


def kernel_backend(device) -> str:
    choice = env.get("NANOSERVE_KERNELS")
    if choice:
        if choice not in BACKENDS:
            raise ValueError(f"NANOSERVE_KERNELS={choice!r}; allowed: {BACKENDS}")
        return choice
    kind = torch.device(device).type
    if kind == "cuda" and importlib.util.find_spec("triton") is not None:
        return "triton"
    return "cpu" if kind == "cpu" and cpu_build.available() else "reference"


def get_ops(device):
    backend = kernel_backend(device)
    if torch.device(device).type == "cpu":
        cpu_malloc.keep_freed_memory()  # once per process: each step reuses the last one's pages
    if backend == "triton":
        from nanoserve.kernels import triton_ops  # imported lazily: needs a GPU or the interpreter
        return triton_ops
    if backend == "cpu":
        if not cpu_build.available():
            raise RuntimeError(f"NANOSERVE_KERNELS=cpu: {cpu_build.unavailable_reason()}")
        ops = kernel_ops(reference, paged_attention=cpu_attention.paged_attention,
                         rms_norm=cpu_layer_ops.rms_norm, rotary_embedding=cpu_layer_ops.rotary_embedding,
                         reshape_and_cache=cpu_layer_ops.reshape_and_cache,
                         silu_and_mul=cpu_layer_ops.silu_and_mul)
        ops.decode_layers = cpu_decode_layer.decode_layers  # the layers in one call, where a step allows
        return ops
    return reference


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy sampling's argmax, reference.argmax's contract: (N, vocab) -> (N,) int64."""
    return argmax_for(logits.device)(logits)


def argmax_for(device):
    """The argmax for logits on `device`, chosen once, as a sampler holds it: the dispatch itself
    costs, cold, as much as the op on a row of logits."""
    if torch.device(device).type == "cpu" and kernel_backend(device) == "cpu":
        return cpu_argmax.argmax
    return reference.argmax


def process_weights_after_loading(model) -> None:
    """Prepare a loaded model's weights for this device's fast paths, once (vLLM's hook name):
    on a CPU that oneDNN supports, prepacked linears (cpu_gemm.pack_model); on the CPU backend,
    quantized linears on the C++ ops (cpu_quant_gemm.pack_quantized); on the Triton backend, on
    the W8A16 kernel (triton_quant_linear.pack_quantized); elsewhere nothing."""
    device = next(model.parameters()).device
    if device.type == "cpu":
        cpu_gemm.pack_model(model)
        if kernel_backend("cpu") == "cpu":
            cpu_quant_gemm.pack_quantized(model)
    elif kernel_backend(device) == "triton":
        from nanoserve.kernels import triton_quant_linear  # lazily, as triton_ops
        triton_quant_linear.pack_quantized(model)


def kernel_ops(base=None, **overrides) -> SimpleNamespace:
    """A kernel namespace: `base`'s kernels (default: the torch reference), some replaced.

    kernel_ops(paged_attention=f).paged_attention is f; the others are the reference's. A base
    without one of KERNEL_NAMES (a namespace from before silu_and_mul) gets the reference's. The
    result has no `decode_layers` (get_ops's CPU namespace has), so every kernel in it runs.
    """
    bad = sorted(set(overrides) - set(KERNEL_NAMES))
    if bad:
        raise ValueError(f"unknown kernel name(s) {bad}; a kernel namespace has {list(KERNEL_NAMES)}")
    ops = {name: getattr(base or reference, name, getattr(reference, name)) for name in KERNEL_NAMES}
    ops.update(overrides)
    return SimpleNamespace(**ops)


def use_kernels(target, **overrides) -> SimpleNamespace:
    """Run `target` (an LLM, an LLMEngine or the model itself) with some kernels replaced.

    Every module of the model that holds the kernel namespace (attribute `ops`) gets the new
    one, built from the model's current kernels. Returns the namespace now in use.
    """
    model = getattr(getattr(target, "engine", target), "model", target)
    holders = [m for m in model.modules() if "ops" in vars(m)]
    if not holders:
        raise ValueError(f"{type(model).__name__} has no kernel namespace (`ops`) to replace")
    ops = kernel_ops(holders[0].ops, **overrides)
    model.set_ops(ops)
    return ops
