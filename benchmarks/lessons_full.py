"""Every lesson at full size on this machine: wall seconds per notebook and its slowest cells.

    python benchmarks/lessons_full.py                  # all lessons, one after another
    python benchmarks/lessons_full.py --lessons 07,10  # some

Each notebook runs headless in a fresh kernel with NANOSERVE_QUICK=0, as a presenter runs it
before a workshop (`nanoserve.course.lessons.execute`); the time includes the kernel's start. The
target (issue 18) is at most 3 minutes a lesson on 2 cores. Writes
benchmarks/results/lessons-full-<date>.{md,json}, naming the CPU and the load at each lesson's end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import RESULTS_DIR, cpu_facts, write_report  # noqa: E402

from nanoserve.course import lessons  # noqa: E402

TARGET_S = 180


def cell_seconds(nb) -> list[tuple[int, float, str]]:
    """(index, seconds, first line) of every code cell, from nbclient's timing metadata."""
    out = []
    for i, cell in enumerate(nb.cells):
        t = cell.metadata.get("execution", {})
        if cell.cell_type == "code" and "iopub.execute_input" in t and "shell.execute_reply" in t:
            start, end = (datetime.datetime.fromisoformat(t[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            out.append((i, (end - start).total_seconds(), cell.source.strip().splitlines()[0][:70]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lessons", default=None, help="comma-separated numbers (default: all)")
    ap.add_argument("--out-dir", default=RESULTS_DIR)
    args = ap.parse_args()
    import torch
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    rows = []
    for path in lessons.lesson_paths(args.lessons.split(",") if args.lessons else None):
        t = time.perf_counter()
        nb = lessons.execute(path, quick=False, cell_timeout=1800)
        seconds = time.perf_counter() - t
        slow = sorted(cell_seconds(nb), key=lambda c: -c[1])[:3]
        rows.append(dict(lesson=path.name, seconds=round(seconds, 1), errors=lessons.errors(nb),
                         slowest_cells=[dict(cell=i, seconds=round(s, 1), source=src) for i, s, src in slow],
                         load=os.getloadavg()[0]))
        print(f"{path.name}: {seconds:.0f} s", flush=True)
    machine = dict(cpu_facts(), torch=torch.__version__)
    flags = ", ".join(k for k in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if machine.get(k))
    lines = [f"# Every lesson at full size, {datetime.datetime.now():%Y-%m-%dT%H%M}", "",
             f"Machine: {machine['cpu']}, {machine['cores']} vCPU ({flags}), torch {machine['torch']}; "
             f"commit {commit}. Each notebook headless in a fresh kernel with `NANOSERVE_QUICK=0` "
             f"(`benchmarks/lessons_full.py`), one after another, once; wall seconds, kernel start-up "
             f"included. Target (issue 18): at most {TARGET_S} s each on 2 cores.", "",
             "| lesson | seconds | within 3 min | slowest cells (s) | load at end |",
             "|---|---:|---|---|---:|"]
    for r in rows:
        cells = "; ".join(f"{c['cell']}: {c['seconds']}" for c in r["slowest_cells"])
        lines.append(f"| {r['lesson']} | {r['seconds']:.0f} | {'yes' if r['seconds'] <= TARGET_S else 'no'} "
                     f"| {cells} | {r['load']:.2f} |")
    lines += ["", f"Total: {sum(r['seconds'] for r in rows) / 60:.1f} minutes."]
    if any(r["errors"] for r in rows):
        lines += ["", "Errors: " + "; ".join(f"{r['lesson']}: {e}" for r in rows for e in r["errors"])]
    write_report(dict(machine=machine, commit=commit, rows=rows), "\n".join(lines) + "\n",
                 args.out_dir, "lessons-full", quick=False)


if __name__ == "__main__":
    main()
