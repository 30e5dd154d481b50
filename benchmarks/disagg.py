"""Prefill/decode disaggregation for real on this machine: the KV transfer's cost, and colocated
against disaggregated serving of lesson 05's interference workload, with the simulator's prediction.

    python benchmarks/disagg.py [--quick] [--require-idle] [--note TEXT]

(a) KV transfer (measure/kv_transfer.py, through nanoserve/course/scenarios/disagg_real.py): the
    SharedMemoryConnector's save + load of a prompt's KV for prompt lengths from one block to the
    long prompt, median of --reps: bytes, ms, ms per block, GB/s; the fit latency + bytes /
    bandwidth and the simulator's link model (bytes / bandwidth) with its error.
(b) Colocated vs disaggregated: decoders streaming from t=0 and long prompts arriving among them
    (lesson 05's workload: course/scenarios/interference.py at setup.SIZES["05"]'s shapes), sent
    by nanoserve's loadgen over HTTP to one `nanoserve serve` on both CPUs, then to a Deployment
    (prefill instance, decode instance, one CPU each, router): decoders' ITL p50/p99/max, long
    prompts' TTFT median/p99, request goodput at an ITL p99 SLO (3 x the decoders' step measured
    in this process on an instance's thread count), and the KV transfers the deployment counted
    (its /metrics).
(c) The simulator's prediction of both runs: cost models calibrated here at 2 threads (colocated)
    and 1 thread (each instance) on prompts around half the long prompt, the measured transfer
    bandwidth as the link.
Full sizes: llama-120m fp32, SIZES["05"]["cpu"] with 4 long prompts (a few minutes on 2 cores);
--quick: the tiny preset at lesson 05's quick sizes (a smoke run, not a result). The machine's
other CPU load is recorded before each part; on a busy 2-vCPU VM the numbers are not results.
Writes benchmarks/results/disagg-<date>[-quick].{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_peers import machine  # noqa: E402
from peers import other_cpu_load, write_report  # noqa: E402

from nanoserve.course import setup  # noqa: E402
from nanoserve.course.scenarios import disagg_real as real  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SIZES = {  # lesson 05's interference shapes; calibration: lesson 09's run sizes
    "full": dict(model="preset:llama-120m", **{k: setup.SIZES["05"]["cpu"][k] for k in
                                               ("num_decoders", "long_prompt_len")}, num_long=4,
                 calibration_requests=24, calibration_output=32, reps=5),
    "quick": dict(model="preset:tiny", **{k: setup.SIZES["05"]["quick"][k] for k in
                                          ("num_decoders", "long_prompt_len", "num_long")},
                  calibration_requests=16, calibration_output=16, reps=3),
}


def rows(table) -> list[dict]:
    return [dict(r) for r in table.rows]


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# Disaggregation for real: KV transfer, colocated vs disaggregated ({report['date']})", "",
             f"{m['cpu']}, {m['cores']} vCPU, amx_bf16: {m['amx_bf16']}, avx512f: {m['avx512f']}; torch "
             f"{m['torch']}; model {report['model']} ({report['dtype']}), sizes {report['sizes_name']}; "
             f"load average before: {report['loadavg']}.", "",
             "Other processes' CPU use before each part (cores): "
             + ", ".join(f"{k} {v:.2f}" for k, v in report["load"].items()), "",
             f"Workload: {report['workload']}. Engines: {report['engine_flags']}.", ""]
    if report.get("note"):
        lines += [f"**{report['note']}**", ""]
    for key in ("transfer", "layouts", "prediction"):
        t = report[key]
        cols = list(dict.fromkeys(c for r in t["rows"] for c in r))
        lines += [f"**{t['title']}**", "", "| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
        lines += ["| " + " | ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, ""))
                                    for c in cols) + " |" for r in t["rows"]]
        lines.append("")
    lines.append(f"Failed requests: {report['failed']}; took {report['seconds']:.0f} s.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, not a result")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--require-idle", action="store_true", help="stop if other processes use > 0.1 core")
    ap.add_argument("--note", default="", help="a sentence for the report (e.g. the machine's load)")
    ap.add_argument("--out-dir", default=RESULTS_DIR)
    args = ap.parse_args(argv)
    name = "quick" if args.quick else "full"
    sz, t0 = SIZES[name], time.perf_counter()
    report = {"date": datetime.now().isoformat(timespec="seconds"), "model": sz["model"],
              "dtype": args.dtype, "sizes_name": name, "sizes": sz, "machine": machine(),
              "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()), "load": {}, "note": args.note}

    def check_load(part):
        report["load"][part] = load = other_cpu_load()
        if args.require_idle and load > 0.1:
            sys.exit(f"machine not idle before {part}: {load:.2f} cores in use by others")

    llm = setup.load_llm(sz["model"], device="cpu", dtype=args.dtype)
    check_load("probes")
    exp = real.real_setup(llm, sz["model"], sz["num_decoders"], sz["long_prompt_len"], sz["num_long"])
    report["workload"] = exp.interference.workload.description
    report["engine_flags"] = " ".join(exp.server_args()[1:])
    check_load("transfer")
    points, fit = real.measure_transfer(llm, exp, sz["reps"])
    check_load("layouts")
    runs = real.run_layouts(exp)
    check_load("prediction")
    predicted = real.predict_layouts(llm, exp, fit, sz["calibration_requests"], sz["long_prompt_len"] // 2,
                                     sz["calibration_output"])
    tables = {"transfer": real.transfer_table(points, fit, runs["disaggregated"]),
              "layouts": real.layout_table(runs, exp),
              "prediction": real.prediction_table(runs, predicted, exp)}
    report.update({k: {"title": t.title, "rows": rows(t)} for k, t in tables.items()})
    report["transfer_fit"] = {"latency_s": fit.latency, "bandwidth_Bps": fit.bandwidth}
    report["deployment_transfers"] = {f"{k[0]}_{k[1]}": v for k, v in
                                      (runs["disaggregated"].transfers or {}).items()}
    report["slo"], report["threads"] = exp.slo, exp.threads()
    report["failed"] = {r.layout: sum(not o.success for o in r.outputs) for r in runs.values()}
    report["raw"] = {n: r.result.to_json() for n, r in runs.items()}
    report["seconds"] = time.perf_counter() - t0
    write_report(report, markdown(report), args.out_dir, "disagg", args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
