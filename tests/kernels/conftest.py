"""Fixtures for the kernel tests: Triton runs natively on a GPU, under its interpreter elsewhere.

TRITON_INTERPRET is read when @triton.jit decorates a kernel, so it is set here at import time,
before any test of this directory imports the Triton modules. If another test in the same process
imported them first without it, the `triton_ops` fixture re-imports them.
"""

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="session")
def triton_ops(device):
    from triton.runtime.interpreter import InterpretedFunction

    from nanoserve.kernels import triton_attention, triton_ops
    kernels = (triton_ops._rms_norm_kernel, triton_attention._paged_attention_kernel)
    if device == "cpu" and not all(isinstance(k, InterpretedFunction) for k in kernels):
        importlib.reload(triton_attention)  # decorate the kernels again, now for the interpreter
        importlib.reload(triton_ops)
    return triton_ops


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty/empty_like return NaN-filled memory, so any output element a kernel forgets fails."""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: nan(empty_like(*a, **kw)))
