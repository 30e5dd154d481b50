"""Measure the reference results of this machine: the key series of lessons 00, 01, 02, 03 and
05 at the sizes the lessons use (quick and full), into nanoserve/course/reference_data/NAME.json,
which course.reference overlays on the readers' own figures.

    python scripts/reference_results.py          # named after the device: CPU model, flags, cores
    python scripts/reference_results.py --name "2-core AMD EPYC, AVX2, no AVX-512/AMX"
    python scripts/reference_results.py --modes quick --lessons 03 05      # a part, merged in

It records only on an idle machine: it first samples how much CPU other processes take (over
--sample seconds) and refuses to start above --max-other-cpu percent (100 = one core), and it
refuses to write a file when other processes took more than that while it measured. The file
records the load average before and after and that share, so a reader can tell a quiet reference
from a noisy one. Files are named after the device kind and the machine (cpu-..., cuda-...), one per
device; rerunning overwrites the lessons and modes it measures and keeps the rest of the file
(the load figures are those of the latest run). Both modes by default: quick and full sizes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
import time
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


def file_key(kind: str, name: str) -> str:
    """'cpu-2-core-amd-epyc-avx2' from the device kind and the machine's name."""
    return re.sub(r"[^a-z0-9]+", "-", f"{kind} {name}".lower()).strip("-")


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
    ap.add_argument("--name", help="the machine, as figures will label it (default: the device's "
                                   "name, CPU flags and cores)")
    ap.add_argument("--modes", nargs="*", default=["quick", "full"], choices=["quick", "full"])
    ap.add_argument("--lessons", nargs="*", default=["00", "01", "02", "03", "05"])
    ap.add_argument("--max-other-cpu", type=float, default=15.0,
                    help="refuse to record above this CPU percent taken by other processes (100 = a core)")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds to sample other processes first")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    from nanoserve.config import default_device
    from nanoserve.course import reference
    from nanoserve.course.setup import device_kind
    from nanoserve.measure import machine_load
    from nanoserve.measure.ceilings import device_name
    name = args.name or ", ".join(filter(None, [device_name(default_device()), cpu_flags(),
                                                 f"{os.cpu_count()} cores"]))
    path = reference.DATA / f"{file_key(device_kind(), name)}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    others = machine_load.OtherProcesses()
    time.sleep(args.sample)
    busy = 100 * others.cores()
    if busy > args.max_other_cpu:
        print(f"refusing to record: other processes took {busy:.0f}% CPU over {args.sample:g} s "
              f"(limit --max-other-cpu {args.max_other_cpu:g}; 100 = one core). Close them and rerun.",
              file=sys.stderr)
        return 3
    before, threads = os.getloadavg(), torch.get_num_threads()
    modes = old.get("modes", {})
    for mode in args.modes:
        os.environ["NANOSERVE_QUICK"] = "1" if mode == "quick" else "0"
        for lesson in args.lessons:
            print(f"{mode} {lesson} ...", flush=True)
            torch.set_num_threads(threads)  # quick mode's load_llm drops to 1, as in the lessons
            entry = measure(lesson, mode == "quick")
            modes.setdefault(mode, {})[lesson] = {**entry, "torch_threads": torch.get_num_threads()}
    busy = 100 * others.cores()  # their average over the whole measurement
    if busy > args.max_other_cpu:
        print(f"not recorded: other processes took {busy:.0f}% CPU while measuring (limit "
              f"{args.max_other_cpu:g}); {path.name} is unchanged. Rerun on an idle machine.",
              file=sys.stderr)
        return 3
    ref = reference_file(name, modes, {
        "loadavg_before": [round(x, 2) for x in before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "other_processes_cpu_percent": round(busy, 1),
        "note": f"100 = one core busy with other work throughout; the machine has {os.cpu_count()} cores"},
        cpu_flags())
    write_reference(path, ref)
    print(f"wrote {os.path.relpath(path, ROOT)}; load before {before}, after {os.getloadavg()}, "
          f"other processes {busy:.0f}% CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
