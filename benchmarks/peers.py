"""nanoserve against HF transformers and vLLM's CPU build: side by side, one run, same weights.

    python benchmarks/peers.py [--quick] [--only nanoserve,hf,vllm] [--dtypes float32,bfloat16]
                               [--vllm-python /path/to/vllm-venv/bin/python] [--require-idle]
                               [--scenarios b1,offline,profile]

The llama-120m preset's random weights are saved as an HF checkpoint and every system loads
that folder (`--model smollm2-135m`: the real model's converted folder, as it is). Each figure
is computed the same way for every system from the same jobs
(peer_systems.py runs them); all outputs have fixed lengths (greedy, EOS ignored):
- batch-1 decode: one prompt run for N tokens and for 1; ITL = (t_N - t_1) / (N - 1), so
  prefill and fixed per-call costs cancel. Beside it the roofline floor of that step (weight
  and KV bytes over the measured weight-read bandwidth, roofline.decode_step_floor).
- prefill P tokens: P / time to the first token of one P-token prompt.
- offline throughput: (input + output tokens) / time for a batch submitted at once.
- shared prefix: seconds for requests sharing one long prefix, prefix caching on and off.
- interference: decoders plus one long prompt arriving later; the decoders' worst ITL (the
  stall the prefill causes) and the long prompt's TTFT, in 512-token chunks vs in one step.
- scheduler + batch preparation share of a batch-32 decode step (nanoserve only).
Each repetition gets fresh random prompts, so no prefix cache helps across repetitions; medians.
The 2-vCPU VMs this runs on are noisy: the machine is checked for other load before each
system and the result records it. Writes benchmarks/results/peers-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # peer_systems beside this file
from peer_systems import VLLM, HFContinuous, HFGenerate, NanoServe, vllm_available  # noqa: E402

from nanoserve.config import ModelConfig  # noqa: E402
from nanoserve.measure import roofline  # noqa: E402
from nanoserve.measure.ceilings import device_name  # noqa: E402
from nanoserve.measure.machine_load import other_cpu_load  # noqa: E402
from nanoserve.measure.workload import interference, shared_prefix, synthetic  # noqa: E402
from nanoserve.model import load_model  # noqa: E402
from nanoserve.model.loader import resolve_model_path, save_hf_checkpoint  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SIZES = {
    "full": dict(b1=(32, 128), prefill=(128, 512, 2048), offline=(64, 256, 128),
                 shared=(32, 768, 64, 16), interference=(8, 16, 256, 2048, 1.0, 8),
                 overhead_batch=32, reps=3),
    "quick": dict(b1=(8, 8), prefill=(32, 128), offline=(8, 32, 8), shared=(4, 64, 8, 4),
                  interference=(2, 8, 24, 128, 0.05, 2), overhead_batch=4, reps=1),
}
SYSTEMS = {"nanoserve": NanoServe, "hf-generate": HFGenerate, "hf-cb": HFContinuous,
           "vllm-cpu": VLLM}
# Scenarios each system runs: generate cannot add a request mid-batch (no interference), and
# generate_batch's per-call setup makes it a throughput tool only.
RUNS = {"nanoserve": {"b1", "prefill", "offline", "shared", "interference", "overhead", "profile"},
        "hf-generate": {"b1", "prefill", "offline", "shared"}, "hf-cb": {"offline", "shared"},
        "vllm-cpu": {"b1", "prefill", "offline", "shared", "interference"}}
SCENARIOS = ("b1", "prefill", "offline", "shared", "interference", "overhead", "profile")
IDLE_LIMIT = 0.10  # cores of other processes' CPU use above which timings are not trusted


def write_report(report: dict, text: str, out_dir: str, name: str, quick: bool,
                 stamp: str | None = None) -> str:
    """Write a benchmark's report as out_dir/<name>-<stamp>[-quick].json and its markdown `text`
    beside it, print the text, -> the path stem (every benchmark here writes results this way)."""
    os.makedirs(out_dir, exist_ok=True)
    stamp = stamp or datetime.now().strftime("%Y-%m-%dT%H%M")
    stem = os.path.join(out_dir, f"{name}-{stamp}{'-quick' if quick else ''}")
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text + f"\nwritten: {stem}.json, {stem}.md")
    return stem


def cpu_facts() -> dict:
    """The CPU a result was measured on: lscpu's model name, cores, and the flags that decide
    which matmul kernels exist (AVX2, AVX-512, AVX-512 bf16, AMX bf16)."""
    flags = open("/proc/cpuinfo").read().split()
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                  if line.startswith("Model name")), platform.processor() or "unknown")
    return {"cpu": model, "cores": os.cpu_count(), "avx2": "avx2" in flags,
            "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": "amx_bf16" in flags}


def check_idle(where: str, require: bool, log: list) -> None:
    load = other_cpu_load()
    log.append({"before": where, "other_cores": round(load, 3), "idle": load <= IDLE_LIMIT})
    if load > IDLE_LIMIT:
        msg = (f"!!! machine NOT idle before {where}: other processes use {load:.2f} cores; "
               "timings are unreliable")
        if require:
            sys.exit(msg + " (--require-idle: aborting)")
        print(msg, file=sys.stderr, flush=True)


# --- Jobs ---

def plan(sz: dict, vocab: int, seed: int = 0) -> list[dict]:
    """Every job of every scenario: fresh prompts for each repetition, the same prompts for the
    two settings a scenario compares (cache on/off, chunked or not)."""
    jobs, seeds = [], itertools.count(seed)

    def add(scenario, tag, variant, workload, max_tokens=None):
        jobs.append(dict(scenario=scenario, tag=tag, variant=variant, kind="offline",
                         prompts=[r.prompt_token_ids for r in workload],
                         max_tokens=max_tokens or workload.requests[0].params.max_tokens))

    b1_prompt, n = sz["b1"]
    for _ in range(sz["reps"]):
        # t_N - t_1 over two prompts of one length: the same prompt twice would be a prefix-cache
        # hit the second time, a shorter t_1 and so a longer ITL for a system that caches
        add("b1", "b1_n", "main", synthetic(1, b1_prompt, n, seed=next(seeds), vocab_size=vocab))
        add("b1", "b1_1", "main", synthetic(1, b1_prompt, 1, seed=next(seeds), vocab_size=vocab))
        for p in sz["prefill"]:
            add("prefill", f"prefill_{p}", "main", synthetic(1, p, 1, seed=next(seeds), vocab_size=vocab))
    num, ins, outs = sz["offline"]
    add("offline", "offline", "main", synthetic(num, ins, outs, seed=next(seeds), vocab_size=vocab))
    num, prefix, suffix, outs = sz["shared"]
    wl = shared_prefix(1, num, prefix, suffix, outs, seed=next(seeds), vocab_size=vocab)
    for tag, variant in (("shared", "main"), ("shared_nocache", "no_prefix_cache")):
        add("shared", tag, variant, wl)
    decoders, d_in, d_out, long_len, at, long_out = sz["interference"]
    wl = interference(decoders, d_in, d_out, long_len, at, long_out, seed=next(seeds),
                      vocab_size=vocab)
    for tag, variant in (("interf_chunk512", "chunk512"), ("interf_whole", "whole_prompt")):
        jobs.append(dict(scenario="interference", tag=tag, variant=variant, kind="online",
                         prompts=[r.prompt_token_ids for r in wl], arrivals=wl.arrival_times,
                         max_tokens=wl.output_lens))
    jobs.append(dict(scenario="overhead", tag="overhead", variant="main", kind="overhead",
                     batch=sz["overhead_batch"]))
    # where nanoserve's time goes in the steps the targets are about (step_profile.py)
    (num, ins, outs), longest = sz["offline"], max(sz["prefill"])
    jobs.append(dict(scenario="profile", tag="profile", variant="main", kind="profile", shapes=[
        (1, b1_prompt + n // 2, False), (num, ins + outs // 2, False),
        (min(num, longest // ins), ins, True), (1, longest, True)]))
    return jobs


def run_system(name: str, folder: str, dtype: str, jobs: list[dict], args,
               idle: list) -> tuple[dict, str | None]:
    """({tag: [result per job]}, version) of one system, one engine instance per configuration."""
    cls, out, version = SYSTEMS[name], {}, None
    mine = [j for j in jobs if j["scenario"] in RUNS[name] and j["variant"] in cls.variants]
    for config in dict.fromkeys(cls.variants[j["variant"]] for j in mine):
        batch = [j for j in mine if cls.variants[j["variant"]] == config]
        check_idle(f"{name} {config} {dtype}", args.require_idle, idle)
        t = time.perf_counter()
        extra = {"python": args.vllm_python} if cls is VLLM else {}
        system = cls(folder, dtype, config, args.kv_gib, **extra)
        for job, result in zip(batch, system.run(batch)):
            out.setdefault(job["tag"], []).append(result)
        version = getattr(system, "version", None)
        del system
        gc.collect()
        print(f"[{dtype}] {name} {config}: {len(batch)} jobs in {time.perf_counter() - t:.1f} s",
              flush=True)
    return out, version


# --- Figures, ratios, targets ---

def figure_specs(sz: dict) -> list[tuple[str, str, str, bool]]:
    """(key, label, unit, higher is better) in report order."""
    num, ins, outs = sz["offline"]
    s_num, prefix, suffix, s_out = sz["shared"]
    dec, _, _, long_len, _, _ = sz["interference"]
    specs = [("b1_decode", f"batch-1 decode ({sz['b1'][1]} tokens)", "tok/s", True),
             ("b1_floor_pct", "batch-1 decode / roofline floor", "%", True)]
    specs += [(f"prefill_{p}", f"prefill {p} tokens", "tok/s", True) for p in sz["prefill"]]
    specs += [("offline", f"offline {num} x ({ins} in, {outs} out)", "tok/s", True),
              ("shared", f"shared prefix {s_num} x ({prefix}+{suffix}) -> {s_out}, cache on",
               "s", False),
              ("shared_nocache", "shared prefix, prefix caching off", "s", False)]
    for key, how in (("chunk512", "512-token chunks"), ("whole", "prompt in one step")):
        specs += [(f"stall_{key}", f"{dec} decoders + {long_len}-token prompt, {how}: worst ITL",
                   "ms", False),
                  (f"ttft_{key}", f"... the long prompt's TTFT, {how}", "ms", False)]
    specs.append(("overhead", f"scheduler + batch prep, decode batch {sz['overhead_batch']}",
                  "% of step", False))
    return specs


def compute_figures(raw: dict, sz: dict, floor_s: float) -> dict[str, float]:
    """One system's figures from its raw job results."""
    med = statistics.median
    fig = {}
    n = sz["b1"][1]
    if "b1_n" in raw:
        itl = med((a - b) / (n - 1) for a, b in zip(raw["b1_n"], raw["b1_1"]))
        if itl > 0:  # noise can make t_N < t_1 on a busy machine with few tokens (--quick)
            fig["b1_decode"], fig["b1_floor_pct"] = 1 / itl, 100 * floor_s / itl
    for p in sz["prefill"]:
        if f"prefill_{p}" in raw:
            fig[f"prefill_{p}"] = p / med(raw[f"prefill_{p}"])
    num, ins, outs = sz["offline"]
    if "offline" in raw:
        fig["offline"] = num * (ins + outs) / med(raw["offline"])
    for tag in ("shared", "shared_nocache"):
        if tag in raw:
            fig[tag] = med(raw[tag])
    for key in ("chunk512", "whole"):
        for run in raw.get(f"interf_{key}", [])[:1]:
            *decoders, long = run  # the long prompt is the workload's last request
            gaps = [b - a for d in decoders for a, b in zip(d["token_times"], d["token_times"][1:])]
            fig[f"stall_{key}"] = 1e3 * max(gaps)
            fig[f"ttft_{key}"] = 1e3 * (long["token_times"][0] - long["arrival"])
    if "overhead" in raw:
        fig["overhead"] = 100 * med(raw["overhead"])
    return fig


def ratios(figs: dict[str, dict]) -> dict[str, dict]:
    """nanoserve / peer for every figure both have."""
    ours = figs.get("nanoserve", {})
    return {peer: {k: ours[k] / v for k, v in f.items() if k in ours and v}
            for peer, f in figs.items() if peer != "nanoserve"}


def _target(text: str, value: float | None, need: float, unit: str, below: bool = False) -> dict:
    """PASS when value >= need (below: value < need), with the margin."""
    if value is None or math.isnan(value):
        return {"target": text, "status": "n/a", "detail": "not measured"}
    ok = value < need if below else value >= need
    return {"target": text, "status": "PASS" if ok else "MISS",
            "detail": f"{value:.2f}{unit} vs {need:g}{unit} ({value - need:+.2f}{unit})"}


def profile_shares(runs: list | None) -> dict[str, float]:
    """From nanoserve's "profile" job: the batch-64 decode step's share outside the weight
    matmuls and the 8 x 256 prefill step's share in them (issue 18's targets), in %."""
    out = {}
    for p in (runs or [[]])[0]:
        linear = 100 * p["parts_ms"]["linear"] / p["step_ms"]
        if p["label"].startswith("decode batch 64 "):
            out["decode64_outside_linear"] = 100 - linear
        elif p["label"].startswith("prefill batch 8 x 256 "):
            out["prefill8x256_linear"] = linear
    return out


def targets(figs: dict, rats: dict, batch: int, raw: dict) -> list[dict]:
    """Issue 18's targets (the ones the README reports), then the earlier ones still held."""
    def get(d, *keys):
        for k in keys:
            d = d.get(k, {}) if isinstance(d, dict) else {}
        return d if isinstance(d, float) else None

    out = []
    for dtype in figs:
        shares = profile_shares(raw.get(dtype, {}).get("nanoserve", {}).get("profile"))
        out += [_target(f"offline throughput {dtype} >= 1.2x vLLM-cpu",
                        get(rats, dtype, "vllm-cpu", "offline"), 1.2, "x"),
                _target(f"batch-1 {dtype} decode >= 70% of the roofline floor",
                        get(figs, dtype, "nanoserve", "b1_floor_pct"), 70, "%"),
                _target(f"batch-64 decode step ({dtype}) <= 35% outside the weight matmuls",
                        shares.get("decode64_outside_linear"), 35, "%", below=True)]
        if dtype == "bfloat16":
            out.append(_target("bf16 prefill step of 8 x 256 >= 60% in the weight matmuls",
                               shares.get("prefill8x256_linear"), 60, "%"))
        out += [_target(f"offline throughput {dtype} >= 1.5x HF generate",
                        get(rats, dtype, "hf-generate", "offline"), 1.5, "x"),
                _target(f"scheduler + batch prep < 10% of a batch-{batch} decode step ({dtype})",
                        get(figs, dtype, "nanoserve", "overhead"), 10, "%", below=True)]
    return out


# --- Report ---

def profile_table(runs: list | None) -> list[str]:
    """Markdown lines: nanoserve's step time split by part, from its "profile" job."""
    if not runs:
        return []
    parts = list(runs[0][0]["parts_ms"])
    lines = ["Where nanoserve's time goes (nanoserve/step_profile.py: wall time of each part, "
             "mean ms per step, share of the step):", "",
             "| step | ms/step | " + " | ".join(parts) + " |", "|---|---:|" + "---:|" * len(parts)]
    for p in runs[0]:
        lines.append(f"| {p['label']} | {p['step_ms']:.1f} | " + " | ".join(
            f"{p['parts_ms'][k]:.1f} ({100 * p['parts_ms'][k] / p['step_ms']:.0f}%)" for k in parts) + " |")
    return lines + [""]


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# nanoserve vs peers, {report['date']}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['threads']} threads), "
             f"transformers {m['transformers']}, vLLM {m['vllm'] or 'not run'}. "
             f"Model: {report['model']}{' (quick sizes: a smoke run)' if report['quick'] else ''}.",
             ""]
    if not all(c["idle"] for c in report["idle"]):
        worst = max(c["other_cores"] for c in report["idle"])
        lines += [f"**WARNING: the machine was not idle (other processes used up to {worst:.2f} "
                  "cores); these timings are unreliable.**", ""]
    for dtype, figs in report["figures"].items():
        systems, peers = list(figs), list(report["ratios"][dtype])
        fl = report["floor"][dtype]
        lines += [f"## {dtype}", "", f"Roofline floor of a batch-1 decode step: {fl['ms']:.2f} ms "
                  f"({fl['tok_s']:.1f} tok/s at {fl['GB_s']:.1f} GB/s weight-read bandwidth).", "",
                  "| figure | unit | " + " | ".join(systems) + " | "
                  + " | ".join(f"nanoserve/{p}" for p in peers) + " |",
                  "|---|---|" + "---:|" * (len(systems) + len(peers))]
        for key, label, unit, higher in report["figure_specs"]:
            vals = [figs[s].get(key) for s in systems] + [report["ratios"][dtype][p].get(key)
                                                          for p in peers]
            if any(v is not None for v in vals):
                cells = ["-" if v is None else f"{v:.3g}" for v in vals]
                better = "higher" if higher else "lower"
                lines.append(f"| {label} | {unit} ({better} is better) | " + " | ".join(cells) + " |")
        lines.append("")
        lines += profile_table(report["raw"][dtype].get("nanoserve", {}).get("profile"))
    lines += ["## Targets", ""] + [f"- **{t['status']}** {t['target']}: {t['detail']}"
                                   for t in report["targets"]]
    if report["skipped"]:
        lines += ["", "Not run: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items())]
    return "\n".join(lines) + "\n"


def measure(names: list[str], model: str, sz: dict, args) -> dict:
    """Run every system on every dtype; -> the report (figures, ratios, targets, raw results)."""
    import transformers
    idle: list = []
    check_idle("start", args.require_idle, idle)
    # measured now, not read from the cache: these VMs' bandwidth moves by 30% between hours
    ceilings = roofline.load_or_measure_ceilings("cpu", refresh=True, quick=args.quick)
    raw, figs, floors, errors, versions = {}, {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        if model.startswith("preset:"):
            folder = tmp
            net, cfg, _ = load_model(model, "cpu", "float32", seed=0)
            save_hf_checkpoint(net, folder)  # every system loads these very weights
            del net
        else:  # a checkpoint (smollm2-135m: its converted folder), loaded by every system as it is
            folder = resolve_model_path(model)
            cfg = ModelConfig.from_json(os.path.join(folder, "config.json"))
        jobs = [j for j in plan(sz, cfg.vocab_size, args.seed)
                if args.scenarios is None or j["scenario"] in args.scenarios]
        for dtype in args.dtypes.split(","):
            # one bandwidth for both dtypes: the fp32 weight-read ceiling (the best of F.linear and
            # oneDNN); bf16 weights stream a little slower here (cpu_linear.py: 19 vs 25 GB/s)
            ctx = sz["b1"][0] + sz["b1"][1] // 2  # mean context of the timed decode steps
            floor = roofline.decode_step_floor(cfg, 1, ctx, ceilings, dtype)
            floors[dtype] = {"ms": 1e3 * floor, "tok_s": 1 / floor, "GB_s": ceilings.bandwidth / 1e9}
            for name in names:
                try:
                    out, version = run_system(name, folder, dtype, jobs, args, idle)
                except Exception as e:  # one failing peer must not lose the others' numbers
                    errors[f"{name} {dtype}"] = f"{type(e).__name__}: {e}"
                    print(f"!!! {name} {dtype} failed: {e}", file=sys.stderr)
                    continue
                raw.setdefault(dtype, {})[name] = out
                figs.setdefault(dtype, {})[name] = compute_figures(out, sz, floor)
                if version:
                    versions[name] = version
    rats = {d: ratios(f) for d, f in figs.items()}
    return {
        "date": datetime.now().isoformat(timespec="seconds"), "model": model,
        "params": cfg.num_params(), "quick": args.quick, "sizes": sz,
        "machine": {"cpu": device_name("cpu"), "cores": os.cpu_count(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "vllm": versions.get("vllm-cpu"),
                    "python": platform.python_version(), "loadavg": os.getloadavg()},
        "idle": idle, "ceilings": asdict(ceilings), "floor": floors, "figures": figs,
        "ratios": rats, "figure_specs": figure_specs(sz),
        "targets": targets(figs, rats, sz["overhead_batch"], raw), "errors": errors, "raw": raw}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default preset:llama-120m (--quick: preset:tiny); "
                    "or a checkpoint, e.g. smollm2-135m (the course's real model)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--only", default="nanoserve,hf,vllm",
                    help="systems: nanoserve, hf (= hf-generate,hf-cb), hf-generate, hf-cb, vllm")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu")
    ap.add_argument("--require-idle", action="store_true", help="abort if the machine is busy")
    ap.add_argument("--kv-gib", type=float, default=None,
                    help="KV cache GiB per engine (default 4; --quick 0.25)")
    ap.add_argument("--scenarios", default=None,
                    help=f"run only these, comma-separated: {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=RESULTS_DIR)
    args = ap.parse_args(argv)
    if args.scenarios is not None:
        args.scenarios = set(args.scenarios.split(","))
        if unknown := args.scenarios - set(SCENARIOS):
            ap.error(f"--scenarios: unknown {sorted(unknown)}; choose from {list(SCENARIOS)}")
    sz = SIZES["quick" if args.quick else "full"]
    model = args.model or ("preset:tiny" if args.quick else "preset:llama-120m")
    args.kv_gib = args.kv_gib or (0.25 if args.quick else 4.0)
    aliases = {"hf": ["hf-generate", "hf-cb"], "vllm": ["vllm-cpu"]}
    names = [n for o in args.only.split(",") for n in aliases.get(o.strip(), [o.strip()])]
    if unknown := set(names) - set(SYSTEMS):
        ap.error(f"--only: unknown system(s) {sorted(unknown)}; choose from {sorted(SYSTEMS)}")
    skipped = {}
    if "vllm-cpu" in names and (why := vllm_available(args.vllm_python)):
        names.remove("vllm-cpu")
        skipped["vllm-cpu"] = why
        print(f"vllm-cpu skipped: {why}", file=sys.stderr)
    report = dict(measure(names, model, sz, args), skipped=skipped)
    write_report(report, markdown(report), args.out_dir, "peers", args.quick,
                 report["date"].replace(":", "")[:15])  # 2026-11-29T1005
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
