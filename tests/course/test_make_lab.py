"""`make lab`, as README says it opens the course: JupyterLab on notebooks/ from .venv, answering
on the port it was given, and gone (port free) after the Ctrl-C that README says stops it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nanoserve.serve.launch import free_port, port_is_free

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None or not (ROOT / ".venv/bin/jupyter").exists()
                    or Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="needs make and this checkout's .venv (make demo creates it)")
def test_make_lab_serves_the_lessons_and_stops_on_ctrl_c(tmp_path):
    port, token = free_port(), "lab-test"
    root = " --allow-root" if os.geteuid() == 0 else ""
    args = f"--no-browser --ServerApp.ip=127.0.0.1 --port={port} --IdentityProvider.token={token}{root}"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    proc = subprocess.Popen(["make", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, listing = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/contents/?token={token}"
                listing = urllib.request.urlopen(url, timeout=5).read().decode()
                break
            except OSError:
                time.sleep(1)
        assert listing is not None, f"JupyterLab did not answer within 120 s: {proc.poll()}"
        assert "00_setup_and_your_device.ipynb" in listing  # the root is notebooks/
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: make and JupyterLab get it
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # JupyterLab asks to confirm with a second Ctrl-C
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not port_is_free(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert port_is_free(port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
