"""Every environment variable nanoserve reads, with its meaning and default, in one place.

Readers call `get(NAME)`, `flag(NAME)` or `cache_dir()` instead of os.environ, so this table is
the whole list (README's "Environment variables" shows it: `python -c "import nanoserve.env as e;
print(e.markdown())"`). An empty value counts as unset. Variables the tests and the grader set for
their own child processes are here too, marked so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None  # None: unset means "not given" (the meaning says what happens then)
    meaning: str


VARIABLES = {v.name: v for v in (
    EnvVar("NANOSERVE_DEVICE", None, "device of engines built without one ('cpu', 'cuda', 'cuda:1'); "
                                     "unset: 'cuda' when a GPU is visible, else 'cpu'"),
    EnvVar("NANOSERVE_KERNELS", None, "kernel backend: 'reference' (plain torch), 'cpu' (C++ ops) or "
                                      "'triton'; unset: triton on CUDA, the C++ ops on a CPU where they "
                                      "build, else the reference"),
    EnvVar("NANOSERVE_FP8_W8A8", "0", "1: fp8 weights on a CUDA card with fp8 tensor cores also quantize "
                                      "the activations per token past a decode's few rows (W8A8, "
                                      "kernels/fp8_w8a8.py); 0: weight-only (W8A16), as on every "
                                      "other device"),
    EnvVar("NANOSERVE_QUICK", "0", "1: the course's small models, sweeps and workloads (CI, tests)"),
    EnvVar("NANOSERVE_CACHE_DIR", None, "nanoserve's cache folder (built C++ ops, measured ceilings); "
                                        "unset: $XDG_CACHE_HOME/nanoserve"),
    EnvVar("XDG_CACHE_HOME", "~/.cache", "the user's cache folder (freedesktop.org), under which "
                                         "nanoserve/ is the cache when NANOSERVE_CACHE_DIR is unset"),
    EnvVar("TRITON_INTERPRET", None, "triton's own: 1 runs the Triton kernels on a CPU, interpreted "
                                     "(set before triton is imported; the kernel tests set it)"),
    EnvVar("CXX", None, "the C++ compiler for the CPU ops; unset: c++, else g++ on PATH"),
    EnvVar("NANOSERVE_CPU_MARCH", "native", "the -march the CPU ops are built for (the tests also "
                                            "build x86-64-v3, AVX2 only, and x86-64-v2, without AVX)"),
    EnvVar("OPENAI_API_KEY", None, "loadgen's bearer token when --api-key is not given (as vLLM's "
                                   "client reads it)"),
    EnvVar("NANOSERVE_IMPL", "solutions", "tests and grader: which exercise code tests/exercises grades, "
                                          "'solutions' or 'exercises'"),
    EnvVar("NANOSERVE_IMPL_OVERRIDES", None, "tests and grader: 'exNN_name=/path/file.py;...', single "
                                             "exercise modules loaded from files"),
    EnvVar("NANOSERVE_SUBMISSION", None, "tests and grader: a student's folder of exercise files to "
                                         "grade (`nanoserve grade --submission(s)`)"),
    EnvVar("NANOSERVE_MUTANTS", None, "tests: 'all' or a comma list: grade the known-wrong exercise "
                                      "answers of tests/exercises/mutants (each must fail)"),
    EnvVar("NANOSERVE_BROWSER_TESTS", None, "tests: 1 makes a missing browser a failure, not a skip "
                                            "(make test-browser)"),
    EnvVar("NANOSERVE_KERNEL_TESTS_CHILD", None, "tests: set in the child process that reruns the "
                                                 "kernel tests under the Triton interpreter"),
    EnvVar("NANOSERVE_LLAMACPP_PYTHON", None, "tests: the python of a venv with llama-cpp-python "
                                              "(benchmarks/README.md), to run the llama.cpp driver's test"),
)}


def get(name: str) -> str | None:
    """The variable's value, its default when unset or empty."""
    return os.environ.get(name) or VARIABLES[name].default


def flag(name: str) -> bool:
    """A yes/no variable: anything but '', '0', 'false', 'no' (any case) is yes."""
    return (get(name) or "").strip().lower() not in ("", "0", "false", "no")


def cache_dir(*parts: str) -> str:
    """nanoserve's one cache folder (NANOSERVE_CACHE_DIR, else $XDG_CACHE_HOME/nanoserve), or a
    path under it."""
    base = get("NANOSERVE_CACHE_DIR") or os.path.join(os.path.expanduser(get("XDG_CACHE_HOME")),
                                                      "nanoserve")
    return os.path.join(base, *parts)


def markdown() -> str:
    """The table for README: name, meaning, default."""
    rows = ["| variable | meaning | default |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.meaning} | {'(unset)' if v.default is None else f'`{v.default}`'} |"
             for v in VARIABLES.values()]
    return "\n".join(rows) + "\n"
