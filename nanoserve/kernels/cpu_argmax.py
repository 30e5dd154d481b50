"""Greedy sampling's argmax in C++ for CPUs (cpu_argmax.cpp): torch.argmax(-1)'s result in one pass
of vector compares per row, where torch's reduction carries (value, index) pairs through a generic
loop (the step profile's "other" part: benchmarks/cpu_step_profile.py). cpu_build.py builds the op.
"""

from __future__ import annotations

import torch

from nanoserve.kernels import cpu_build, reference


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """reference.argmax: logits (N, vocab) -> (N,) int64; contiguous fp32 rows go to the C++ op."""
    if (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.shape[1] > 0 and logits.is_contiguous() and cpu_build.available()):
        return torch.ops.nanoserve_cpu.argmax(logits)
    return reference.argmax(logits)
