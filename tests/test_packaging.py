"""Set-up files agree: environment.yml's pip section mirrors pyproject.toml."""

from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert set(pip) == wanted, (f"only in pyproject: {wanted - set(pip)}; "
                                f"only in environment.yml: {set(pip) - wanted}")
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python.split("=")[1] >= project["requires-python"].lstrip(">=")


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
