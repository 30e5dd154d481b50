"""Reference results: key figures of the lessons measured on this repo's machines, so that a
student's figure can show "my machine against the reference" and a deck slide both at once.

One small JSON file per machine in reference_data/ (scripts/reference_results.py measures and
writes it, and says how to rerun it): when, on what (CPU model and flags, threads, versions),
how busy the machine was, and per mode ("quick" or "full") and lesson the sizes used and the
series measured. A lesson asks `series(lesson, key)` and gets (label, points) only when a
reference of its device kind was measured at exactly the sizes it is running now, on a machine
that was not busy: a reference at other sizes would compare different experiments. Otherwise
None, and the figure draws only the reader's own points.

Deliberately left out: measuring (the script does it with course.experiments and scenarios).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from nanoserve.course.setup import device_kind, quick_mode, sizes

DATA = Path(__file__).parent / "reference_data"


@lru_cache(maxsize=None)
def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# Other work on the machine while it was measured, in percent of one core, past which a reference
# is left out: on a busy 2-core machine two-thread kernels wait for a descheduled thread, and
# its times say more about that work than about the machine.
BUSY_PERCENT = 50


def references(folder: Path = DATA) -> list[dict]:
    """Every reference file's contents, by file name."""
    return [_load(str(p)) for p in sorted(Path(folder).glob("*.json"))]


def quiet_references(folder: Path = DATA) -> list[dict]:
    """The references measured while other work held under BUSY_PERCENT of a core: the ones a
    figure shows."""
    return [r for r in references(folder)
            if r.get("load", {}).get("other_processes_cpu_percent", 0) < BUSY_PERCENT]


def machine(ref: dict) -> str:
    """The reference's machine in one wording, whatever its file's free-text name says:
    '<CPU name> (<n> cores; <vector flags>)' for a CPU, the device's name for a GPU; the file's
    "machine" where it lacks those fields."""
    name = ref.get("device_name")
    if not name:
        return ref["machine"]
    if ref.get("device_kind") == "cpu" and ref.get("cpus"):
        flags = f"; {ref['cpu_flags']}" if ref.get("cpu_flags") else ""
        return f"{name} ({ref['cpus']} cores{flags})"
    return name


def label(ref: dict, mode: str) -> str:
    """'<device kind>: <machine>, <date>, <mode> sizes': every figure names a reference so."""
    return f"{ref.get('device_kind', '?')}: {machine(ref)}, {ref['date']}, {mode} sizes"


def _same(a, b) -> bool:
    return json.loads(json.dumps(a)) == json.loads(json.dumps(b))  # tuples and lists alike


def series(lesson: str, key: str, device: str | None = None, quick: bool | None = None,
           folder: Path = DATA):
    """(label, points) of the reference measured for `lesson`'s `key` on a machine of this
    device kind at the sizes the lesson uses here, or None when there is none."""
    quick = quick_mode() if quick is None else quick
    mode, kind = ("quick" if quick else "full"), device_kind(device)
    want = sizes(lesson, quick=quick, device=device)
    for ref in quiet_references(folder):
        entry = ref.get("modes", {}).get(mode, {}).get(lesson)
        if (ref.get("device_kind") == kind and entry and _same(entry["sizes"], want)
                and key in entry["series"]):
            return label(ref, mode), entry["series"][key]
    return None


def all_series(lesson: str, key: str, quick: bool | None = None, folder: Path = DATA) -> list:
    """(label, points) of `lesson`'s `key` from every device recorded in this mode (quick or
    full), its label saying so where its sizes differ from this device's (another device's sizes
    are chosen for it: a different experiment)."""
    quick = quick_mode() if quick is None else quick
    mode, want = ("quick" if quick else "full"), sizes(lesson, quick=quick)
    out = []
    for ref in quiet_references(folder):
        entry = ref.get("modes", {}).get(mode, {}).get(lesson)
        if entry and key in entry["series"]:
            other = "" if _same(entry["sizes"], want) else ", its own sizes"
            out.append((f"{label(ref, mode)}{other}", entry["series"][key]))
    return out
