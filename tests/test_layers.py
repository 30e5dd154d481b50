"""The layering of docs/ARCHITECTURE.md holds: import-linter's contracts in pyproject.toml (layers, and no
import cycle between the siblings of any folder), checked with `lint-imports` as a user runs it.

The contracts have teeth: on a copy of the package, an engine module importing course material
and a cycle between two measure modules each break them.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_package_keeps_every_contract():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 kept, 0 broken" in run.stdout


@pytest.fixture
def copy(tmp_path):
    """The package and its pyproject.toml in a folder that lint-imports reads instead."""
    shutil.copytree(ROOT / "nanoserve", tmp_path / "nanoserve",
                    ignore=shutil.ignore_patterns("assets", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize("module, line, broken", [
    ("engine/kv_cache.py", "from nanoserve.course import setup", "nanoserve.engine is not allowed to "
                                                                  "import nanoserve.course"),
    ("measure/metrics.py", "from nanoserve.measure import figures", "No cycles are allowed"),
])
def test_a_wrong_import_breaks_a_contract(copy, module, line, broken):
    with open(copy / "nanoserve" / module, "a") as f:
        f.write(f"\n{line}  # noqa\n")
    run = lint(copy)
    assert run.returncode != 0 and broken in run.stdout, run.stdout + run.stderr
