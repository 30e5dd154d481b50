"""Shared by the browser tests: Debian's Chromium driven by Playwright for Python (never
Playwright's own browser download), a JupyterLab server on loopback, and the screenshot folder.

They run with `make test-browser` (which sets NANOSERVE_BROWSER_TESTS=1: there a missing browser,
Playwright or deck fails the run); under a plain `pytest tests` without those pieces they skip and
say why. Every wait is bounded.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
# PEERS.md: headless, no sandbox (root in CI), and nothing fetched in the background
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-background-networking",
                 "--disable-component-update",
                 "--disable-default-apps", "--disable-sync", "--no-first-run", "--disable-gpu"]


def need(condition: bool, why: str):
    if not condition:
        if os.environ.get("NANOSERVE_BROWSER_TESTS") == "1":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="session")
def require():
    """need(condition, why): skip, or under `make test-browser` fail, when a piece is missing."""
    return need


@pytest.fixture(scope="session")
def artifacts():
    """test-artifacts/, emptied once per run (CI keeps it)."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir()
    return ARTIFACTS


@pytest.fixture(scope="session")
def browser():
    need(Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, 'playwright missing: pip install -e ".[dev]"')
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        yield b
        b.close()


# every cell rendered (JupyterLab 4 otherwise renders only those in view), the preferred kernel
# started without asking, no news pop-up over the notebook
LAB_SETTINGS = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none",
                                                           "autoStartDefaultKernel": True},
                "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
                "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                                 "checkForUpdates": False}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 at a free port with a random token, serving a copy of
    the lessons (whatever the browser does, the repo's notebooks stay as committed); kernels run
    in quick mode. -> (base URL, token, served folder)."""
    port, token = free_port(), secrets.token_hex(16)
    home = tmp_path_factory.mktemp("jupyter")
    served = home / "notebooks"
    shutil.copytree(ROOT / "notebooks", served, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    env = {**os.environ, "NANOSERVE_QUICK": "1", "OMP_NUM_THREADS": "1",
           "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    settings = home / "config" / "lab" / "user-settings"
    for name, value in LAB_SETTINGS.items():  # as a user would set them in Settings
        plugin, key = name.rsplit(":", 1)
        folder = settings / plugin.split("/")[0] / plugin.split("/")[1]
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{key}.jupyterlab-settings"
        target.write_text(json.dumps(value))
    log = open(home / "lab.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                             f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={served}",
                             "--allow-root", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
                             "jupyterlab.NeverCheckForUpdate"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                tail = (home / "lab.log").read_text()[-2000:]
                pytest.fail(f"JupyterLab did not start within 90 s:\n{tail}")
            time.sleep(0.5)
    yield base, token
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
