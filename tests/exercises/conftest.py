"""Graded tests: one test body checks either implementation of an exercise.

`python -m pytest tests/exercises --impl=exercises|solutions` (default solutions) picks the
package; NANOSERVE_IMPL does the same where the option isn't registered (e.g. `pytest tests`).
NANOSERVE_IMPL_OVERRIDES="ex02_paged_kv=/path/to/file.py;..." loads single modules from files
instead (how the mutant tests run the graded checks against wrong implementations).
Test modules get the implementation from the `load` fixture, so a broken student module fails
its tests one by one instead of breaking collection.
"""

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `import exercises` / `import solutions` from the repo root
    sys.path.insert(0, str(ROOT))

if not torch.cuda.is_available():  # ex08's Triton kernels run under the interpreter on a CPU
    os.environ["TRITON_INTERPRET"] = "1"

IMPLS = ("solutions", "exercises")


def pytest_addoption(parser):
    parser.addoption("--impl", default=None, choices=IMPLS,
                     help="package the graded tests check: solutions (default) or exercises")


@pytest.fixture(scope="session")
def impl(request) -> str:
    choice = request.config.getoption("impl", default=None) or os.environ.get("NANOSERVE_IMPL") or "solutions"
    if choice not in IMPLS:
        raise pytest.UsageError(f"--impl / NANOSERVE_IMPL={choice!r}; allowed: {IMPLS}")
    return choice


def _overrides() -> dict[str, str]:
    spec = os.environ.get("NANOSERVE_IMPL_OVERRIDES", "")
    return dict(item.split("=", 1) for item in spec.split(";") if item)


def _uses_interpreter(module) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    kernels = [v for v in vars(module).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    return all(isinstance(k, InterpretedFunction) for k in kernels)


@pytest.fixture(scope="session")
def load(impl):
    """load("ex02_paged_kv") -> the module under test."""
    overrides = _overrides()

    def get(name: str):
        if name in overrides:
            path = overrides[name]
            spec = importlib.util.spec_from_file_location(f"_override_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(f"{impl}.{name}")
            if "TRITON_INTERPRET" in os.environ and "triton" in vars(module) and not _uses_interpreter(module):
                module = importlib.reload(module)  # imported earlier without the interpreter
        return module
    return get


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Seeded, and one torch thread: the tiny model's ops are far faster without OpenMP
    hand-offs, above all on a busy 2-core machine. Restored after the test."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
