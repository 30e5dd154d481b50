"""Measure the reference results of this machine: the key series of lessons 00, 01, 02, 03 and
05 at the sizes the lessons use (quick and full), into nanoserve/course/reference_data/NAME.json,
which course.reference overlays on the readers' own figures.

    python scripts/reference_results.py --name "2-core AMD EPYC, AVX2, no AVX-512/AMX"
    python scripts/reference_results.py --modes quick --lessons 03 05      # a part, merged in

Run it on an idle machine: the file records the load average before and after and the share of
CPU other processes took while it ran, so a reader can tell a quiet reference from a noisy one.
Rerunning overwrites the lessons and modes it measures and keeps the rest of the file (the load
figures are those of the latest run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_flags() -> str:
    """'AVX2, no AVX-512, no AMX' from /proc/cpuinfo (Linux); '' elsewhere."""
    try:
        flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    except (OSError, AttributeError):
        return ""
    have = {"AVX2": "avx2" in flags, "AVX-512": "avx512f" in flags, "AMX": "amx_bf16" in flags}
    return ", ".join(k if v else f"no {k}" for k, v in have.items())


def rounded(x, digits: int = 5):
    """Floats to `digits` significant digits, all the way down (timings are not more precise)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v, digits) for v in x]
    return x


def compact(text: str) -> str:
    """Innermost JSON lists on one line: a point per line, not a number per line."""
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)


def measure(lesson: str, quick: bool) -> dict:
    """{"sizes": ..., "series": {key: points}} of one lesson, measured as the lesson does."""
    import numpy as np

    from nanoserve.course import experiments as ex
    from nanoserve.course import scenarios, setup
    S = setup.sizes(lesson, quick=quick)
    series: dict = {}
    if lesson == "00":
        c = ex.device_ceilings(refresh=True)
        pts = ex.linear_sweep(c, S["linear_batches"], S["linear_k"])
        series["linear"] = [(f"b={p.batch}", p.intensity, p.achieved) for p in pts]
    elif lesson == "01":
        llm = setup.load_llm(S["model"])
        sweep = ex.prefill_sweep(llm, S["lengths"], reps=S["reps"], progress=False)
        series["prefill"] = [(p.length, p.seconds) for p in sweep]
        ctx = ex.decode_context_sweep(llm, S["contexts"], S["decode_steps"], S["reps"], progress=False)
        series["decode_context"] = [(p.context_len, p.step_seconds) for p in ctx]
    elif lesson == "02":
        llm = setup.load_llm(S["model"])
        prompt = np.random.default_rng(0).integers(10, 1000, S["prompt_len"]).tolist()
        with_cache = ex.generate_with_cache(llm, prompt, S["max_tokens"])
        without = ex.generate_without_cache(llm, prompt, S["max_tokens"], progress=False)
        series["cache"] = {"with": list(zip(with_cache.positions, with_cache.seconds)),
                           "without": list(zip(without.positions, without.seconds))}
    elif lesson == "03":
        llm = setup.load_llm(S["model"], max_num_seqs=max(S["batches"]))
        points = ex.decode_batch_sweep(llm, S["batches"], S["context_len"], S["steps"], progress=False)
        series["decode_batch"] = [(p.batch, p.itl_seconds) for p in points]
        series["decode_points"] = ex.decode_points(llm, points)
    elif lesson == "05":
        llm = setup.load_llm(S["model"])
        s = scenarios.interference_setup(llm, S["num_decoders"], S["long_prompt_len"], S["num_long"],
                                         min_budget=min(S["budgets"]))
        series["budget"] = budget_series(scenarios.interference_grid(llm, s, S["budgets"], progress=False))
    else:
        raise ValueError(f"no reference series for lesson {lesson!r}; choose from 00 01 02 03 05")
    return {"sizes": S, "series": series}


def budget_series(runs) -> list:
    """Lesson 05's series: (label, decoder ITL max, p99, long-prompt TTFT median), ms, per run."""
    import numpy as np
    return [(r.label, 1e3 * float(r.decoder_itls().max()), 1e3 * float(np.percentile(r.decoder_itls(), 99)),
             1e3 * float(np.median(r.long_ttfts()))) for r in runs]


def reference_file(machine: str, modes: dict, load: dict, cpu_flags_text: str = "") -> dict:
    """The reference file's contents (what course.reference reads) for measured `modes`."""
    import torch

    from nanoserve.config import default_device
    from nanoserve.course.setup import device_kind
    from nanoserve.measure.ceilings import device_name
    return {"machine": machine, "device_kind": device_kind(), "device_name": device_name(default_device()),
            "cpu_flags": cpu_flags_text, "cpus": os.cpu_count(), "date": datetime.date.today().isoformat(),
            "versions": {"python": platform.python_version(), "torch": torch.__version__},
            "load": load, "modes": modes}


def write_reference(path: Path, ref: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(compact(json.dumps(rounded(ref), indent=1)) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="the machine, as figures will label it")
    ap.add_argument("--modes", nargs="*", default=["quick", "full"], choices=["quick", "full"])
    ap.add_argument("--lessons", nargs="*", default=["00", "01", "02", "03", "05"])
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import psutil
    import torch

    from nanoserve.course import reference
    key = re.sub(r"[^a-z0-9]+", "-", args.name.lower()).strip("-")
    path = reference.DATA / f"{key}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    me = psutil.Process()
    others = [p for p in psutil.process_iter() if p.pid != me.pid]
    for p in others:
        try:
            p.cpu_percent(None)  # start each process's counter
        except psutil.Error:
            pass
    before, threads = os.getloadavg(), torch.get_num_threads()
    modes = old.get("modes", {})
    for mode in args.modes:
        os.environ["NANOSERVE_QUICK"] = "1" if mode == "quick" else "0"
        for lesson in args.lessons:
            print(f"{mode} {lesson} ...", flush=True)
            torch.set_num_threads(threads)  # quick mode's load_llm drops to 1, as in the lessons
            entry = measure(lesson, mode == "quick")
            modes.setdefault(mode, {})[lesson] = {**entry, "torch_threads": torch.get_num_threads()}
    busy = 0.0
    for p in others:
        try:
            busy += p.cpu_percent(None)
        except psutil.Error:
            pass
    ref = reference_file(args.name, modes, {
        "loadavg_before": [round(x, 2) for x in before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "other_processes_cpu_percent": round(busy, 1),
        "note": f"100 = one core busy with other work throughout; the machine has {os.cpu_count()} cores"},
        cpu_flags())
    write_reference(path, ref)
    print(f"wrote {path.relative_to(ROOT)}; load before {before}, after {os.getloadavg()}, "
          f"other processes {busy:.0f}% CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
