"""nanoserve/env.py declares every environment variable nanoserve reads, and is the only reader."""

import re
from pathlib import Path

from nanoserve import env

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for p in (ROOT / "nanoserve").rglob("*.py") if p.name != "env.py"]


def test_every_nanoserve_variable_is_declared():
    named = {m for p in [*SOURCES, *(ROOT / "tests").rglob("*.py"), ROOT / "Makefile"]
             for m in re.findall(r"\bNANOSERVE_[A-Z_]*[A-Z]\b", p.read_text())}
    missing = sorted(named - set(env.VARIABLES))
    assert not missing, f"undeclared in nanoserve/env.py: {missing}"
    assert all(v.meaning for v in env.VARIABLES.values())


def test_no_module_reads_the_environment_itself():
    readers = [f"{p.relative_to(ROOT)}:{i}" for p in SOURCES
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"os\.environ\.get|os\.getenv|os\.environ\[", line)]
    assert not readers, f"read the variable through nanoserve.env instead: {readers}"


def test_one_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("NANOSERVE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_dir("kernels") == str(tmp_path / "xdg" / "nanoserve" / "kernels")
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path / "mine"))
    from nanoserve.kernels import cpu_build
    from nanoserve.measure.ceilings import ceilings_cache_path
    assert cpu_build.cache_dir() == str(tmp_path / "mine" / "kernels")
    assert Path(ceilings_cache_path("cpu")).parent == tmp_path / "mine"
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", "")  # empty counts as unset
    assert env.cache_dir() == str(tmp_path / "xdg" / "nanoserve")


def test_flags_and_defaults(monkeypatch):
    for value, want in [("1", True), ("yes", True), ("0", False), ("False", False), ("", False)]:
        monkeypatch.setenv("NANOSERVE_QUICK", value)
        assert env.flag("NANOSERVE_QUICK") is want
    monkeypatch.delenv("NANOSERVE_KERNELS", raising=False)
    assert env.get("NANOSERVE_KERNELS") is None
    assert "| `NANOSERVE_QUICK` |" in env.markdown()
