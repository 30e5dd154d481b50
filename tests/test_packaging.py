"""Set-up files agree and install everywhere: environment.yml's pip section mirrors pyproject.toml;
triton is a Linux-only dependency and everything but the Triton kernels works without it (CI also
runs the tests in an environment without triton: `make test-no-triton`); the Makefile takes torch's
CPU build from PyTorch's index on Linux without an NVIDIA GPU when that index answers, else pip's."""

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_environment_yml_mirrors_pyproject():
    p = project()
    wanted = set(p["dependencies"]) | set(p["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert set(pip) == wanted, (f"only in pyproject: {wanted - set(pip)}; "
                                f"only in environment.yml: {set(pip) - wanted}")
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python.split("=")[1] >= p["requires-python"].lstrip(">=")


def test_the_license_is_an_spdx_expression():
    """PEP 639: `license = "MIT"`; the older table form makes setuptools warn on every install."""
    assert project()["license"] == "MIT"
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert any(Requirement(r).name == "setuptools" and Requirement(r).specifier.contains("77") and
               not Requirement(r).specifier.contains("76") for r in build), build


def test_triton_is_required_on_linux_only():
    """triton has no macOS or Windows wheels: a hard dependency would make pip fail there."""
    reqs = {r.name: r for r in map(Requirement, project()["dependencies"])}
    marker = reqs["triton"].marker
    assert marker is not None, "triton needs an environment marker (sys_platform == 'linux')"
    platforms = {p: marker.evaluate({"sys_platform": p}) for p in ("linux", "darwin", "win32")}
    assert platforms == {"linux": True, "darwin": False, "win32": False}, platforms
    # uvloop has no Windows wheels either (uvicorn falls back to asyncio's loop there)
    uvloop = {p: reqs["uvloop"].marker.evaluate({"sys_platform": p}) for p in ("linux", "darwin", "win32")}
    assert uvloop == {"linux": True, "darwin": True, "win32": False}, uvloop
    assert all(r.marker is None for name, r in reqs.items() if name not in ("triton", "uvloop"))


# third-party modules that nanoserve imports only for tooling outside serving: the extra that has them
TOOLING = {"huggingface_hub": "hub", "nbformat": "dev", "nbclient": "dev", "jupyter_core": "dev"}


def imported_modules() -> dict[str, str]:
    """Every third-party top-level module that nanoserve/ imports -> one file that imports it."""
    import ast
    found = {}
    for path in sorted((ROOT / "nanoserve").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for top in {n.split(".")[0] for n in names}:
                if top not in sys.stdlib_module_names and top != "nanoserve":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_what_nanoserve_imports_it_declares():
    """An import on the serving path is a runtime dependency (not a [dev] one that `pip install
    nanoserve` would miss); the tooling's few are in the extra that needs them."""
    from importlib.metadata import packages_distributions

    def names(reqs):
        return {Requirement(r).name.lower().replace("_", "-") for r in reqs}
    p = project()
    runtime = names(p["dependencies"])
    extras = {k: names(v) for k, v in p["optional-dependencies"].items()}
    dists = packages_distributions()
    for module, where in imported_modules().items():
        dist = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if module in TOOLING:
            assert dist & extras[TOOLING[module]], f"{module} ({where}) is not in [{TOOLING[module]}]"
        else:
            assert dist & runtime, f"{where} imports {module}: not in pyproject's dependencies"


def test_ci_runs_the_readme_test_commands():
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
    assert "make lint" in ci
    assert "make test-no-triton" in ci and "test-no-triton" in readme
    assert "make demo" in readme and "venv" in readme and ".venv\\Scripts\\python" in readme, \
        "the README gives the install steps without make (Windows) too"


BLOCK_TRITON = textwrap.dedent('''
    # As if triton were not installed: the path finder no longer sees it.
    import importlib.machinery, sys

    class WithoutTriton(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                return None
            return super().find_spec(name, path, target)

    sys.meta_path[:] = [WithoutTriton if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
''')

WITHOUT_TRITON = textwrap.dedent('''
    import importlib, importlib.util, pkgutil
    import nanoserve
    assert importlib.util.find_spec("triton") is None
    names = [m.name for m in pkgutil.walk_packages(nanoserve.__path__, "nanoserve.")
             if not m.name.startswith("nanoserve.kernels.triton_")]
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:  # an optional extra's package may be missing; triton may not
            if e.name.split(".")[0] == "triton":
                raise
    from nanoserve import LLM, SamplingParams
    out = LLM("preset:tiny", device="cpu").generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].token_ids) == 4
    from nanoserve.course import grade
    assert grade.main(["ex08"]) == 2
    print(f"imported {len(names)} modules")
''')


def test_everything_but_the_triton_kernels_works_without_triton(tmp_path):
    """Every module but kernels/triton_* imports, the engine generates on CPU, the grader leaves
    ex08 out saying why, and the kernel tests skip saying why, with `import triton` failing."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TRITON)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), NANOSERVE_QUICK="1")
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "imported" in run.stdout and "triton is not installed" in run.stderr
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                            "tests/kernels/test_triton_kernels.py", "-k", "constant_vector or fresh_process"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert "2 skipped" in tests.stdout and "triton is not installed" in tests.stdout, tests.stdout[-3000:]


# --- the Makefile's choice of torch wheel -------------------------------------------------------

STUB = "#!/bin/sh\n{body}\n"


def make_install(tmp_path, reachable: str, gpu: bool, index_fails: bool = False) -> tuple[list, float]:
    """Run the Makefile's install recipe with stub python and pip; -> (pip calls, seconds).
    reachable: what the stub interpreter does when asked to reach the index: "yes", "no", "hang"."""
    bin_dir, stubs = tmp_path / "venv" / "bin", tmp_path / "stubs"
    bin_dir.mkdir(parents=True)
    stubs.mkdir()
    log = tmp_path / "pip.log"
    fail = 'case "$*" in *"--index-url"*) exit 1;; esac' if index_fails else ""
    (bin_dir / "pip").write_text(STUB.format(body=f'echo "$*" >> {log}\n{fail}'))
    (bin_dir / "python").write_text(STUB.format(body="exit 0"))
    answer = {"yes": "exit 0", "no": "exit 1", "hang": "exec sleep 30"}[reachable]
    (stubs / "py").write_text(STUB.format(body=answer))
    if gpu:
        (stubs / "nvidia-smi").write_text(STUB.format(body="exit 0"))
    for f in [*bin_dir.iterdir(), *stubs.iterdir()]:
        f.chmod(0o755)
    env = dict(os.environ, PATH=os.pathsep.join([str(stubs), "/usr/bin", "/bin"]))
    start = time.monotonic()
    run = subprocess.run([shutil.which("make"), "-B", f"{bin_dir}/.installed", f"VENV={bin_dir.parent}",
                          f"BIN={bin_dir}", f"PY={stubs / 'py'}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    return log.read_text().splitlines(), time.monotonic() - start


needs_linux_make = pytest.mark.skipif(sys.platform != "linux" or shutil.which("make") is None
                                      or not Path("/usr/bin/timeout").exists(),
                                      reason="the Makefile's torch choice is for Linux with make")


@needs_linux_make
@pytest.mark.parametrize("reachable, gpu, want", [
    ("yes", False, f"install -q --index-url {CPU_INDEX} torch==2.13.0"),
    ("no", False, "install -q torch==2.13.0"),
    ("yes", True, "install -q torch==2.13.0"),
])
def test_make_takes_the_cpu_build_on_linux_without_a_gpu(tmp_path, reachable, gpu, want):
    calls, _ = make_install(tmp_path, reachable, gpu)
    torch_calls = [c for c in calls if "torch" in c]
    assert torch_calls == [want], calls
    assert calls[-1] == "install -q -e .[dev]"


@needs_linux_make
def test_make_falls_back_when_the_cpu_index_fails_or_hangs(tmp_path):
    calls, _ = make_install(tmp_path / "a", "yes", False, index_fails=True)
    assert [c for c in calls if "torch" in c] == [f"install -q --index-url {CPU_INDEX} torch==2.13.0",
                                                   "install -q torch==2.13.0"]
    calls, seconds = make_install(tmp_path / "b", "hang", False)
    assert [c for c in calls if "torch" in c] == ["install -q torch==2.13.0"]
    assert seconds < 15, f"an index that never answers held the install for {seconds:.0f} s"
