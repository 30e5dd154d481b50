"""A server that runs for long: rounds of load against `serve` and `serve --disaggregated`, and
what each server process holds after every round.

    python benchmarks/soak.py [--rounds 8] [--num-prompts 150] [--warmup-rounds 2] [--only serve]

Each round: nanoserve's loadgen (measure/loadgen.py, the same client as `python -m nanoserve
loadgen`) sends --num-prompts random prompts (--input-len / --output-len tokens, Poisson arrivals
at --request-rate, at most --max-concurrency in flight), and beside them --cut streams that the
client closes after its first chunk and --bad requests that must get a 4xx with OpenAI's error
body. After the round, once the server is idle: the RSS, open file descriptors and threads of
every server process (the server; for --disaggregated the router and both instances), the
/dev/shm segments they created, and each engine's /metrics (running, waiting, KV usage). The growth per 1,000
requests after --warmup-rounds is the least-squares slope of RSS over requests served.

Bounded: every round has a deadline, the servers are stopped (SIGTERM, then SIGKILL) on exit,
on an exception and on Ctrl-C; loopback only. Writes benchmarks/results/soak-<date>.{json,md}
with the machine (lscpu model name, avx512/amx flags) and the other processes' CPU load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from datetime import datetime

import httpx
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_peers import machine  # noqa: E402
from peers import other_cpu_load, write_report  # noqa: E402

from nanoserve.engine.kv_transport import NAME as SHM_NAME  # noqa: E402
from nanoserve.measure import datasets, loadgen  # noqa: E402
from nanoserve.serve.launch import ServerProcess  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ROUND_TIMEOUT = 900.0  # s: a round that takes longer ends the run
BAD_BODIES = ({"prompt": [1, 2, 3], "max_tokens": -1}, {"prompt": [1, 2, 3], "temperature": "hot"},
              {"prompt": [10**9], "max_tokens": 4}, {"max_tokens": 4})


def processes(server: ServerProcess) -> dict[str, psutil.Process]:
    """The server's processes by role: the server itself; for --disaggregated its children too."""
    root = psutil.Process(server.proc.pid)
    procs = {"server": root}
    for child in root.children():  # the instances; not a helper such as a resource tracker
        cmd = " ".join(child.cmdline())
        for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            if kv_role in cmd:
                procs[role] = child
    return procs


def shm_segments(pids) -> int:
    hexes = {f"{p:x}" for p in pids}
    return sum(1 for n in os.listdir("/dev/shm") if (m := SHM_NAME.match(n)) and m.group(1) in hexes)


def read_metrics(base_url: str) -> dict:
    try:
        text = httpx.get(base_url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out = {}
    for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        m = re.search(rf"^vllm:{key}{{[^}}]*}} (\S+)$", text, re.M)
        if m:
            out[key] = float(m.group(1))
    return out


async def cut_stream(base_url: str, model: str, prompt: list[int]) -> str:
    """A stream the client closes after its first chunk: 'cut', or what went wrong."""
    body = {"model": model, "prompt": prompt, "max_tokens": 64, "stream": True, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", base_url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    return "cut"  # leaving the block closes the connection mid-stream
    return "ended before a chunk"


async def bad_request(base_url: str, body: dict) -> str:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(base_url + "/v1/completions", json=body)
    ok = 400 <= r.status_code < 500 and "message" in r.json().get("error", {})
    return "4xx" if ok else f"HTTP {r.status_code}: {r.text[:200]}"


async def one_round(base_url: str, model: str, args, seed: int) -> dict:
    reqs = datasets.random_dataset(args.num_prompts, args.input_len, args.output_len, 4096,
                                   rate=args.request_rate, seed=seed)
    target = loadgen.Target(base_url, model, timeout=600.0)
    side = [cut_stream(base_url, model, reqs[i % len(reqs)].prompt) for i in range(args.cut)]
    side += [bad_request(base_url, BAD_BODIES[i % len(BAD_BODIES)]) for i in range(args.bad)]
    result, *answers = await asyncio.gather(
        loadgen.run(target, reqs, args.max_concurrency, progress=False), *side)
    failed = [o.error for o in result.outputs if o.error]
    return {"ok": len(reqs) - len(failed), "failed": len(failed), "errors": failed[:3],
            "cut": answers[:args.cut].count("cut"), "bad_4xx": answers[args.cut:].count("4xx"),
            "side_errors": [a for a in answers if a not in ("cut", "4xx")][:3]}


def metrics_urls(server: ServerProcess) -> dict[str, str]:
    """Where /metrics is, by role: the server; for --disaggregated each instance (the router has none)."""
    urls = {}
    for role, p in processes(server).items():
        cmd = p.cmdline()
        if role == "server" and "--disaggregated" not in cmd:
            urls[role] = server.base_url
        elif role != "server" and "--port" in cmd:
            urls[role] = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    return urls


def sample(server: ServerProcess) -> dict:
    procs = processes(server)
    row = {}
    for role, p in procs.items():
        row[f"{role}_rss_mb"] = round(p.memory_info().rss / 1e6, 1)
        row[f"{role}_fds"], row[f"{role}_threads"] = p.num_fds(), p.num_threads()
    row["shm_segments"] = shm_segments(p.pid for p in procs.values())
    for role, url in metrics_urls(server).items():
        row.update({f"{role}_{k}": v for k, v in read_metrics(url).items()})
    return row


def wait_idle(urls, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for url in urls:
        while time.monotonic() < deadline:
            m = read_metrics(url)
            if m.get("num_requests_running", 1) == 0 and m.get("num_requests_waiting", 1) == 0:
                break
            time.sleep(0.5)
    time.sleep(1.0)


def slope_per_1000(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else None


def soak(name: str, server_args: list[str], args) -> dict:
    server = ServerProcess(None, *server_args, "--max-num-seqs", str(args.max_num_seqs),
                           "--uvicorn-log-level", "warning", startup_timeout=600)
    rows, served = [], 0
    try:
        server.start()
        model = loadgen.run_sync(loadgen.first_model(server.base_url))
        rows.append({"round": 0, "requests": 0, **sample(server)})
        print(rows[-1], flush=True)
        for r in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            got = loadgen.run_sync(asyncio.wait_for(one_round(server.base_url, model, args, r),
                                                    ROUND_TIMEOUT))
            served += got["ok"] + got["failed"] + args.cut + args.bad
            wait_idle(metrics_urls(server).values())
            rows.append({"round": r, "requests": served, "seconds": round(time.perf_counter() - t0, 1),
                         **got, **sample(server)})
            print(rows[-1], flush=True)
    finally:
        code = server.stop()
    after = [row for row in rows if row["round"] >= args.warmup_rounds]
    rss_keys = [k for k in rows[0] if k.endswith("_rss_mb")]
    growth = {k: slope_per_1000([row["requests"] for row in after], [row[k] for row in after])
              for k in rss_keys}
    leftover = [n for n in os.listdir("/dev/shm") if (m := SHM_NAME.match(n)) and
                int(m.group(1), 16) in {server.proc.pid}]
    return {"name": name, "args": server_args, "rows": rows, "growth_mb_per_1000": growth,
            "exit_code": code, "shm_left": leftover}


def markdown(report: dict) -> str:
    m = report["machine"]
    a = report["args"]
    lines = [f"# Soak: server memory and resources over rounds of load ({report['date']})", "",
             f"{m['cpu']}, {m['cores']} vCPU, avx512f: {m['avx512f']}, amx_bf16: {m['amx_bf16']}; "
             f"torch {m['torch']}, python {m['python']}; code {report['commit']}. Other processes' "
             f"CPU load before the run: {report['load']:.2f} cores (the machine is shared).", "",
             f"Per round: {a['num_prompts']} loadgen requests ({a['input_len']} in / {a['output_len']} "
             f"out tokens, {a['request_rate']} req/s Poisson, concurrency {a['max_concurrency']}), "
             f"{a['cut']} streams cut by the client after the first chunk, {a['bad']} bad requests; "
             f"demo model, --max-num-seqs {a['max_num_seqs']}. Growth: least-squares slope of RSS "
             f"from round {a['warmup_rounds']} on.", ""]
    if report.get("note"):
        lines += [f"**{report['note']}**", ""]
    for run in report["runs"]:
        keys = [k for k in run["rows"][-1] if k not in ("errors", "side_errors")]
        lines += [f"## {run['name']}", "", "| " + " | ".join(keys) + " |", "|---" * len(keys) + "|"]
        lines += ["| " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for row in run["rows"]]
        lines += ["", "RSS growth per 1,000 requests after warm-up (MB): " + ", ".join(
            f"{k[:-7]} {v:.2f}" if v is not None else f"{k[:-7]} -" for k, v in
            run["growth_mb_per_1000"].items()) + f"; exit code {run['exit_code']}, /dev/shm "
            f"segments left {len(run['shm_left'])}.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup-rounds", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=150)
    ap.add_argument("--input-len", type=int, default=200)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--request-rate", type=float, default=20.0)
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--cut", type=int, default=5, help="streams cut by the client per round")
    ap.add_argument("--bad", type=int, default=4, help="bad requests (4xx) per round")
    ap.add_argument("--only", choices=["serve", "disaggregated"], default=None)
    ap.add_argument("--note", default="")
    ap.add_argument("--tag", default="", help="appended to the results file name")
    args = ap.parse_args()
    load = other_cpu_load()
    runs = []
    for name, extra in (("serve", []), ("serve --disaggregated", ["--disaggregated"])):
        if args.only is None or name.endswith(args.only):
            runs.append(soak(name, extra, args))
    import nanoserve  # the code the servers run: the one on PYTHONPATH
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(nanoserve.__file__)).stdout.strip()
    report = {"date": datetime.now().isoformat(timespec="seconds"), "machine": machine(),
              "load": load, "commit": commit, "args": vars(args), "note": args.note, "runs": runs}
    stamp = datetime.now().strftime("%Y-%m-%dT%H%M") + (f"-{args.tag}" if args.tag else "")
    write_report(report, markdown(report), RESULTS_DIR, "soak", False, stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
