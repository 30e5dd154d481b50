"""The one dispatch point between the torch reference kernels and the Triton kernels.

`get_ops(device)` returns a module exposing rms_norm, rotary_embedding,
reshape_and_cache and paged_attention with identical signatures. Triton on CUDA,
the reference elsewhere; `NANOSERVE_KERNELS=reference|triton` overrides (triton on a
CPU needs TRITON_INTERPRET=1 set before the first import, and is very slow).
"""

import os

from nanoserve.kernels import reference

BACKENDS = ("reference", "triton")


def kernel_backend(device) -> str:
    choice = os.environ.get("NANOSERVE_KERNELS")
    if choice:
        if choice not in BACKENDS:
            raise ValueError(f"NANOSERVE_KERNELS={choice!r}; allowed: {BACKENDS}")
        return choice
    return "triton" if str(device).startswith("cuda") else "reference"


def get_ops(device):
    if kernel_backend(device) == "triton":
        from nanoserve.kernels import triton_ops  # imported lazily: needs a GPU or the interpreter
        return triton_ops
    return reference
