"""Fixtures for the kernel tests: Triton runs natively on a GPU, under its interpreter elsewhere.

The interpreter must be chosen before `import triton` (triton.language's own helpers are decorated
then), so TRITON_INTERPRET is set here at import time, which in a normal pytest run comes before
anything imports triton. If something imported triton earlier in this process, the in-process
tests skip and `test_kernels_in_a_fresh_process` reruns this directory in a subprocess.
Without triton (it has wheels for Linux only) every Triton test skips, saying so; the torch
reference kernels are tested all the same.
"""

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def interpreter_ready() -> bool:
    """Whether this process's triton runs kernels on CPU, i.e. was imported with TRITON_INTERPRET=1."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(tl.sum, InterpretedFunction)


NO_TRITON = ("triton is not installed (pip has it for Linux only): the Triton kernels can't run "
             "here; the torch reference kernels, which the engine uses without it, are tested")


@pytest.fixture(scope="session")
def in_process(device) -> bool:
    if importlib.util.find_spec("triton") is None:
        pytest.skip(NO_TRITON)
    return device == "cuda" or interpreter_ready()


@pytest.fixture(scope="session")
def triton_ops(in_process):
    if not in_process:
        pytest.skip("triton was imported before TRITON_INTERPRET was set; see the fresh-process test")
    from nanoserve.kernels import triton_ops
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
