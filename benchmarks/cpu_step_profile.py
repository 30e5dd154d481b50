"""Where a CPU step's time goes, for two checkouts side by side: before and after a change.

    python benchmarks/cpu_step_profile.py --old /tmp/old18 --rounds 3     # old vs this tree
    python benchmarks/cpu_step_profile.py --rounds 1                      # this tree only

Runs `nanoserve.measure.step_profile` on llama-120m (random weights) for three shapes, decode
64 x 320, decode 1 x 128 and prefill 8 x 256, in fp32 and bf16. Each (round, checkout, dtype)
is a fresh process with PYTHONPATH set to that checkout, so old and new code alternate on the
same machine minutes apart; each shape gets one warm-up call and one measured call. Writes the
medians over rounds, the load average beside every measurement and the machine
(CPU model, AVX-512/AMX flags, torch version) to benchmarks/results/cpu-step-profile-<date>.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

SHAPES = [("decode", 64, 320), ("decode", 1, 128), ("prefill", 8, 256)]
PARTS = ("linear", "attention", "norm", "rope", "cache write", "other", "host")
HERE = os.path.dirname(os.path.abspath(__file__))


def worker(dtype: str, model: str, threads: int | None, shapes: list) -> None:
    """Profile every shape in this process's checkout; print one JSON line per shape."""
    import torch

    from nanoserve import LLM, EngineConfig
    if threads:
        torch.set_num_threads(threads)
    from nanoserve.measure.step_profile import step_profile
    llm = LLM(model, device="cpu", dtype=dtype, config=EngineConfig(
        max_num_seqs=64, max_num_batched_tokens=2048, kv_cache_memory=2**30, record_trace=False))
    for kind, batch, ctx in shapes:
        # warm-up at a shorter context: a second full prefill of 64 x 320 would take a minute
        step_profile(llm, batch, ctx if kind == "prefill" else min(ctx, 64),
                     prefill=kind == "prefill", steps=2)
        load = os.getloadavg()[0]
        p = step_profile(llm, batch, ctx, prefill=kind == "prefill", steps=5)
        print(json.dumps(dict(shape=f"{kind} {batch} x {ctx}", dtype=dtype, step_ms=p.step_ms,
                              threads=torch.get_num_threads(),
                              parts_ms=p.parts_ms, load_before=load,
                              load_after=os.getloadavg()[0])), flush=True)


def machine() -> dict:
    import torch
    from peers import cpu_facts  # here, not at the top: workers run other checkouts' code
    return dict(cpu_facts(), torch=torch.__version__, threads=torch.get_num_threads(),
                cpu_capability=torch.backends.cpu.get_cpu_capability())


def run_checkout(path: str, dtype: str, args) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=path)
    threads = ["--threads", str(args.threads)] if args.threads else []
    out = subprocess.run([sys.executable, __file__, "--worker", dtype, "--model", args.model,
                          "--shapes", args.shapes, *threads],
                         env=env, capture_output=True, text=True, check=True, cwd=path)
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]


def summarise(rows: list[dict]) -> list[dict]:
    """Median over rounds of each (version, dtype, shape)."""
    keys = sorted({(r["version"], r["dtype"], r["shape"]) for r in rows})
    out = []
    for version, dtype, shape in keys:
        rs = [r for r in rows if (r["version"], r["dtype"], r["shape"]) == (version, dtype, shape)]
        out.append(dict(version=version, dtype=dtype, shape=shape, rounds=len(rs),
                        step_ms=statistics.median(r["step_ms"] for r in rs),
                        # an older checkout has no "host" (its "other" holds it): nan, shown as -
                        parts_ms={p: statistics.median(r["parts_ms"].get(p, math.nan) for r in rs)
                                  for p in PARTS},
                        load=[round(r["load_before"], 2) for r in rs]))
    return out


def markdown(summary: list[dict], info: dict, rounds: int) -> str:
    lines = [f"# CPU step profile, {info['date']}", "",
             f"Machine: {info['machine']['cpu']}, {info['machine']['cores']} vCPU, "
             f"AVX-512 {'yes' if info['machine']['avx512f'] else 'no'}, "
             f"AMX bf16 {'yes' if info['machine']['amx_bf16'] else 'no'}, "
             f"torch {info['machine']['torch']} ({info['machine']['cpu_capability']}), "
             f"{info['threads']} thread(s). {info['model']}, random weights, "
             f"`step_profile`, medians of {rounds} round(s); ms per step (share of the step). "
             "Load: 1-minute load average before each measured call, one per round.", "",
             "| dtype | shape | version | step | " + " | ".join(PARTS) + " | outside linear | load |",
             "|---|---|---|---:|" + "---:|" * len(PARTS) + "---:|---|"]
    for s in summary:
        cells = " | ".join("-" if math.isnan(s["parts_ms"][p]) else
                           f"{s['parts_ms'][p]:.1f} ({100 * s['parts_ms'][p] / s['step_ms']:.0f}%)"
                           for p in PARTS)
        outside = 1 - s["parts_ms"]["linear"] / s["step_ms"]
        lines.append(f"| {s['dtype']} | {s['shape']} | {s['version']} | {s['step_ms']:.1f} | {cells} "
                     f"| {100 * outside:.0f}% | {', '.join(map(str, s['load']))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", metavar="DTYPE", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="preset:llama-120m")
    ap.add_argument("--old", help="checkout of the old code (e.g. `git archive HEAD | tar -x -C DIR`)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", default="", help="suffix of the result file names")
    ap.add_argument("--shapes", default=",".join(f"{k}:{b}:{c}" for k, b, c in SHAPES),
                    help="kind:batch:context, comma-separated (default: the three above)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default torch's); 1 is steadier on a busy machine")
    args = ap.parse_args()
    shapes = [(k, int(b), int(c)) for k, b, c in (s.split(":") for s in args.shapes.split(","))]
    if args.worker:
        return worker(args.worker, args.model, args.threads, shapes)
    versions = ([("before", args.old)] if args.old else []) + [("after" if args.old else "this",
                                                               os.path.dirname(HERE))]
    rows = []
    for rnd in range(args.rounds):
        for dtype in args.dtypes.split(","):
            for version, path in versions:
                for r in run_checkout(path, dtype, args):
                    rows.append(dict(r, version=version, round=rnd))
                    print(f"round {rnd} {version:6s} {dtype} {r['shape']}: {r['step_ms']:.1f} ms "
                          f"(linear {r['parts_ms']['linear']:.1f}, attention "
                          f"{r['parts_ms']['attention']:.1f}) load {r['load_before']:.2f}", flush=True)
    date = datetime.datetime.now().strftime("%Y-%m-%dT%H%M")
    info = dict(date=date, machine=machine(), model=args.model, rounds=args.rounds,
                threads=args.threads or "torch default",
                versions={v: p for v, p in versions})
    summary = summarise(rows)
    base = os.path.join(args.out, f"cpu-step-profile-{date}{args.tag}")
    with open(base + ".json", "w") as f:
        json.dump(dict(info, summary=summary, raw=rows), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(summary, info, args.rounds))
    print(markdown(summary, info, args.rounds))
    print("wrote", base + ".md")


if __name__ == "__main__":
    main()
