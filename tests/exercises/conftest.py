"""Graded tests: one test body checks either implementation of an exercise.

`python -m pytest tests/exercises --impl=exercises|solutions` (default solutions) picks the
package; NANOSERVE_IMPL does the same where the option isn't registered (`pytest tests`).
Test modules get the implementation through the `load` fixture, so a broken student module
fails its tests one by one instead of breaking collection.

An exercise module that imports the package's own implementation of what it grades, or calls its
parent class's version of a graded method (exercise_checks.ANSWER_KEY, PARENT_METHODS), fails
every test of its exercise with a message saying why: `load` refuses it.

More modes, driven by environment variables:
- NANOSERVE_SUBMISSION=DIR (`nanoserve grade --submission(s)`): grade a student's folder of
  exercise files, imported as the package `submission` (relative imports work); a missing file
  fails every test of its exercise.
- NANOSERVE_IMPL_OVERRIDES="ex02_paged_kv=/path/to/file.py;...": load single modules from files.
- NANOSERVE_MUTANTS="all" (or a comma list of names): run each mutant in tests/exercises/mutants/
  (a wrong-but-plausible exercise module, exNN_what_is_wrong.py) against the graded tests of its
  exercise: every test is parametrized by mutant, tagged with a `mutant` junit property, and once
  a mutant fails one test its remaining tests are skipped.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from exercise_checks import answer_key_hits

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `import exercises` / `import solutions` from the repo root
    sys.path.insert(0, str(ROOT))

if not torch.cuda.is_available():  # ex08's Triton kernels run under the interpreter on a CPU
    os.environ["TRITON_INTERPRET"] = "1"

IMPLS = ("solutions", "exercises")
MUTANTS_DIR = Path(__file__).parent / "mutants"


@pytest.fixture(scope="session")
def impl(request) -> str:
    choice = request.config.getoption("impl", default=None) or os.environ.get("NANOSERVE_IMPL") or "solutions"
    if choice not in IMPLS:
        raise pytest.UsageError(f"--impl / NANOSERVE_IMPL={choice!r}; allowed: {IMPLS}")
    return choice


def exercise_module(ex_id: str) -> str:
    """'ex02' -> 'ex02_paged_kv' (the module name shared by exercises/ and solutions/)."""
    return next((ROOT / "solutions").glob(f"{ex_id}_*.py")).stem


def selected_mutants() -> list[Path]:
    spec = os.environ.get("NANOSERVE_MUTANTS", "")
    if not spec:
        return []
    paths = sorted(MUTANTS_DIR.glob("ex[0-9][0-9]_*.py"))
    return paths if spec == "all" else [p for p in paths if p.stem in spec.split(",")]


def _load_file(name: str, path) -> object:
    spec = importlib.util.spec_from_file_location(f"_impl_{name}_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _submission_module(name: str):
    """exercise module `name` from the NANOSERVE_SUBMISSION folder, as submission.<name>."""
    folder = Path(os.environ["NANOSERVE_SUBMISSION"])
    if not (folder / f"{name}.py").is_file():
        pytest.fail(f"0 points: {name}.py is missing from the submission ({folder})", pytrace=False)
    if "submission" not in sys.modules:
        package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("submission", None,
                                                                                 is_package=True))
        package.__path__ = [str(folder)]
        sys.modules["submission"] = package
    return importlib.import_module(f"submission.{name}")


def _uses_interpreter(module) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    kernels = [v for v in vars(module).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    return all(isinstance(k, InterpretedFunction) for k in kernels)


def pytest_generate_tests(metafunc):
    mutants = selected_mutants()
    if mutants and "mutant" in metafunc.fixturenames:
        ex_id = metafunc.module.__name__.rsplit(".", 1)[-1][5:9]  # test_ex02_... -> ex02
        mine = [p for p in mutants if p.name.startswith(ex_id)]
        metafunc.parametrize("mutant", mine, ids=[p.stem for p in mine], scope="module")


@pytest.fixture(scope="module")
def mutant():
    """The mutant file under test (parametrized in mutant mode), else None."""
    return None


@pytest.fixture(scope="module")
def load(impl, mutant):
    """load("ex02_paged_kv") -> the module under test."""
    overrides = dict(item.split("=", 1) for item in os.environ.get("NANOSERVE_IMPL_OVERRIDES", "").split(";")
                     if item)
    if mutant is not None:
        overrides[exercise_module(mutant.name[:4])] = str(mutant)

    def get(name: str):
        if name == "ex08_triton" and importlib.util.find_spec("triton") is None:
            pytest.skip("ex08 writes Triton kernels: triton is not installed here (Linux only)")
        if name in overrides:
            module = _load_file(name, overrides[name])
        elif os.environ.get("NANOSERVE_SUBMISSION"):
            module = _submission_module(name)
        else:
            module = importlib.import_module(f"{impl}.{name}")
            stale = "triton" in vars(module) and not _uses_interpreter(module)
            if "TRITON_INTERPRET" in os.environ and stale:
                module = importlib.reload(module)  # imported earlier without the interpreter
        hits = answer_key_hits(name[:4], Path(module.__file__).read_text())
        if hits:  # every test of the exercise fails with this: it scores 0
            pytest.fail(f"0 points: {name} uses the answer key, the package's own implementation of "
                        f"what it grades ({hits[0]}): write it yourself", pytrace=False)
        return module
    return get


# -- mutant mode: tag each test with its mutant, stop testing a mutant once it is caught --------

_caught: set[str] = set()


def _mutant_name(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    m = callspec.params.get("mutant") if callspec is not None else None
    return m.stem if m is not None else None


def pytest_runtest_setup(item):
    name = _mutant_name(item)
    if name is not None:
        item.user_properties.append(("mutant", name))
        if name in _caught:
            pytest.skip(f"mutant {name} already failed a test")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    name = _mutant_name(item)
    if name is not None and outcome.get_result().failed:
        _caught.add(name)


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Seeded, and one torch thread: the tiny model's ops are far faster without OpenMP
    hand-offs, above all on a busy 2-core machine. Restored after the test."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
