"""`python -m nanoserve loadgen`: measure any OpenAI-compatible server, as `vllm bench serve` does.

An asyncio + httpx client. Requests are sent at the arrival times of a measure/workload.py
process (`--request-rate`, inf = all at t=0; gamma gaps of shape `--burstiness`, 1 = Poisson;
one `--seed` gives the same prompts and arrivals as `python -m nanoserve bench` in-process),
at most `--max-concurrency` at a time, each streamed (`stream_options.include_usage`) and timed
chunk by chunk on arrival: TTFT, ITL, TPOT, E2E and goodput (`--goodput ttft:500 tpot:50`) are
computed by measure/metrics.py exactly as for the engine's own timestamps (http_result.py).
It never imports nanoserve.serve: it is a client of nanoserve, vLLM, SGLang or a cluster alike.

Flags, dataset names, the result table and the JSON keys are `vllm bench serve`'s (vllm 0.32:
benchmarks/serve.py, lib/endpoint_request_func.py, datasets/datasets.py). Differences, on
purpose: arrival gaps are not rescaled to sum to num_prompts / rate (vLLM rescales; here the
seeded process is kept, so in-process and HTTP runs see the same arrivals); greedy sampling
(`--temperature 0`) unless told otherwise; a chat response's first chunk, which only names the
role, is not counted as a token (vLLM counts it, adding a near-zero ITL).

Bounded: every request has a deadline (`--request-timeout`), the send loop runs once over the
dataset, and the probe loop (`--probe-request-rate`) stops when the main load ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime

from nanoserve import cli, env
from nanoserve.measure import datasets, spec_decode_metrics
from nanoserve.measure.http_result import HTTPOutput, LoadResult
from nanoserve.measure.slo import parse_slo
from nanoserve.outputs import RequestMetrics


@dataclass
class Target:
    """Where to send and how: the server's base URL, model name, endpoint and request extras."""

    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    api_key: str | None = None
    temperature: float | None = 0.0
    ignore_eos: bool = False
    extra_body: dict | None = None
    timeout: float = 600.0  # s: one request's deadline, first byte to last

    @property
    def chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("chat/completions")

    def payload(self, prompt, max_tokens: int) -> dict:
        body = {"model": self.model, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.ignore_eos:
            body["ignore_eos"] = True
        return {**body, **(self.extra_body or {})}

    def headers(self) -> dict:
        key = self.api_key or env.get("OPENAI_API_KEY")  # vLLM's client reads the same
        return {"Authorization": f"Bearer {key}"} if key else {}


async def send(client, target: Target, prompt, prompt_len: int, max_tokens: int,
               request_id: str) -> HTTPOutput:
    """One streamed request, timed on the client's clock (time.perf_counter). A failure (HTTP
    error, error chunk, timeout, no token) is recorded in `error`, never raised."""
    out = HTTPOutput(request_id, prompt_len, RequestMetrics(arrival_time=time.perf_counter()))
    try:
        await asyncio.wait_for(_stream(client, target, target.payload(prompt, max_tokens), out),
                               target.timeout)
    except Exception as e:  # vLLM's client too records the failure and goes on
        out.error = out.error or f"{type(e).__name__}: {e}"
    times = out.metrics.token_times
    if not out.error and not times:
        out.error = "no token chunk arrived"
    if out.error:
        return out
    out.metrics.first_token_time, out.metrics.finished_time = times[0], times[-1]
    out.output_len = out.output_len or len(times)
    out.finished = True
    return out


async def _stream(client, target: Target, payload: dict, out: HTTPOutput) -> None:
    text = []
    async with client.stream("POST", target.base_url + target.endpoint, headers=target.headers(),
                             json=payload) as resp:
        if resp.status_code != 200:
            out.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:500]}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators and SSE comments (pings)
            data = line[5:].strip()
            if data == "[DONE]":
                break
            now, chunk = time.perf_counter(), json.loads(data)
            if "error" in chunk:
                out.error = json.dumps(chunk["error"])[:500]
                return
            if chunk.get("choices"):
                choice = chunk["choices"][0]
                delta = choice.get("delta") or {}
                piece = delta.get("content") if target.chat else choice.get("text")
                if target.chat and "role" in delta and not piece and not choice.get("finish_reason"):
                    continue  # the role announcement carries no token
                out.metrics.token_times.append(now)
                text.append(piece or "")
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
            elif chunk.get("usage"):
                out.output_len = chunk["usage"].get("completion_tokens") or 0
                out.prompt_len = chunk["usage"].get("prompt_tokens") or out.prompt_len
    out.text = "".join(text)


async def run(target: Target, requests: list[datasets.LoadRequest], max_concurrency: int | None = None,
              slo=None, probe_rate: float = 0.0, probe_prompt=None, probe_max_tokens: int = 1,
              progress: bool = True, config: dict | None = None) -> LoadResult:
    """Send every request at its arrival time (at most max_concurrency in flight), and, if
    probe_rate > 0, one short probe request at a time every 1/probe_rate s beside them."""
    import httpx
    from tqdm.auto import tqdm

    limit = (max_concurrency or len(requests)) + (1 if probe_rate > 0 else 0)
    client = httpx.AsyncClient(timeout=httpx.Timeout(target.timeout, connect=30.0),
                               limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit))
    sem = asyncio.Semaphore(max_concurrency or len(requests) or 1)
    bar = tqdm(total=len(requests), desc="loadgen", unit="req", disable=not progress)
    done, probes = asyncio.Event(), []

    async def one(i: int, r: datasets.LoadRequest) -> HTTPOutput:
        async with sem:
            o = await send(client, target, r.prompt, r.prompt_len, r.max_tokens, f"loadgen-{i}")
        bar.update(1)
        return o

    async def probe_loop():
        while not done.is_set() and len(probes) < 100_000:
            probes.append(await send(client, target, probe_prompt, len(probe_prompt)
                                     if isinstance(probe_prompt, list) else 0, probe_max_tokens,
                                     f"probe-{len(probes)}"))
            try:
                await asyncio.wait_for(done.wait(), 1.0 / probe_rate)
            except asyncio.TimeoutError:
                pass

    try:
        prober = asyncio.create_task(probe_loop()) if probe_rate > 0 else None
        t0, tasks = time.perf_counter(), []
        for i, r in sorted(enumerate(requests), key=lambda ir: ir[1].arrival_time):
            await asyncio.sleep(max(0.0, t0 + r.arrival_time - time.perf_counter()))
            tasks.append((i, asyncio.create_task(one(i, r))))
        outputs = [None] * len(requests)
        for i, task in tasks:
            outputs[i] = await task
        duration = time.perf_counter() - t0
        done.set()
        if prober is not None:
            await prober
    finally:
        bar.close()
        await client.aclose()
    return LoadResult(outputs, duration, config or {}, probes, parse_slo(slo) if slo else None)


async def first_model(base_url: str, api_key: str | None = None) -> str:
    """vLLM's default --model: the first model the server lists."""
    import httpx
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=30.0) as client:
        r = await client.get(base_url + "/v1/models", headers=headers)
        r.raise_for_status()
        return r.json()["data"][0]["id"]


def run_sync(coro):
    """Run a coroutine to the end from sync code, also where an event loop already runs (a
    notebook): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


# ---- `python -m nanoserve loadgen` --------------------------------------------------------------

RESULT_DIR = "results"  # --save-result's folder by default: .gitignore has it, so a clone stays clean


def add_cli_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    a = ap.add_argument
    a("--base-url", default=None, help="server URL (default: http://HOST:PORT)")
    a("--host", default="127.0.0.1", help="the server's host, when there is no --base-url")
    a("--port", type=int, default=8000, help="the server's port, when there is no --base-url")
    a("--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions")
    a("--model", default=None, help="model name to send (default: the server's first model)")
    a("--tokenizer", default=None, help="checkpoint folder or preset:NAME: the vocabulary for "
      "random ids, the tokenizer for chat prompts")
    a("--vocab-size", type=int, default=None, help="vocabulary size when there is no --tokenizer")
    a("--dataset-name", default=None, choices=["random", "prefix_repetition", "custom"],
      help="random prompts, prompts sharing prefixes, or a JSONL trace (custom, with --dataset-path) "
      "(default: random, or custom when --dataset-path is given)")
    a("--dataset-path", default=None, help="the JSONL trace of --dataset-name custom: one request "
      "a line, with `prompt` and `output_tokens`")
    a("--dataset", default=None, metavar="random|prefix|FILE", help="an alias of --dataset-name "
      "random, --dataset-name prefix_repetition, or --dataset-path FILE")
    a("--num-prompts", type=int, default=1000, help="requests to send")
    a("--random-input-len", type=int, default=1024, help="random: prompt tokens per request")
    a("--random-output-len", type=int, default=128, help="random: output tokens per request")
    a("--random-range-ratio", type=float, default=0.0,
      help="random: lengths drawn uniformly within this ratio around the two above")
    a("--prefix-repetition-prefix-len", type=int, default=256, help="prefix_repetition: prefix tokens")
    a("--prefix-repetition-suffix-len", type=int, default=256, help="prefix_repetition: suffix tokens")
    a("--prefix-repetition-num-prefixes", type=int, default=10,
      help="prefix_repetition: distinct prefixes")
    a("--prefix-repetition-output-len", type=int, default=128,
      help="prefix_repetition: output tokens per request")
    a("--request-rate", type=float, default=math.inf, help="requests/s; inf: all at t=0")
    a("--burstiness", type=float, default=1.0, help="gamma shape of the gaps; 1 = Poisson")
    a("--max-concurrency", type=int, default=None, help="requests in flight at most (default: no limit)")
    a("--ignore-eos", action="store_true", help="ask the server to sample past end-of-sequence")
    a("--goodput", nargs="+", default=None, help='SLOs as "KEY:VALUE" in ms: ttft, tpot, e2el')
    a("--seed", type=int, default=0, help="the dataset's and the arrivals' seed")
    a("--temperature", type=float, default=0.0, help="sent with every request (0: greedy)")
    a("--probe-request-rate", type=float, default=0.0,
      help="also send short probe requests at this rate (req/s), one at a time, beside the load")
    a("--probe-input-len", type=int, default=8, help="a probe's prompt tokens")
    a("--percentile-metrics", default="ttft,tpot,itl", help="metrics whose percentiles are printed")
    a("--metric-percentiles", default="99", help="comma-separated percentiles to print")
    a("--disable-tqdm", action="store_true", help="no progress bar")
    a("--save-result", action="store_true", help="write the result as vLLM's JSON into --result-dir")
    a("--result-dir", default=RESULT_DIR, help="folder for --save-result (vLLM's default is the "
      "current folder: pass . for that)")
    a("--result-filename", default=None,
      help="file name in --result-dir (default: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json)")
    a("--label", default="loadgen", help="the result's label, the first part of its file name")
    a("--api-key", default=None, help="Bearer key (default: $OPENAI_API_KEY)")
    a("--request-timeout", type=float, default=600.0, help="seconds a request may take")
    a("--extra-body", type=json.loads, default=None, help="JSON merged into every request")
    return ap


def dataset_choice(args) -> tuple[str, str | None]:
    """(vLLM's dataset name, path) from --dataset-name/--dataset-path or the --dataset alias."""
    if args.dataset is not None:
        if args.dataset_name is not None or args.dataset_path is not None:
            raise SystemExit("--dataset is an alias of --dataset-name/--dataset-path: give one or the other")
        return {"random": ("random", None), "prefix": ("prefix_repetition", None)}.get(
            args.dataset, ("custom", args.dataset))
    name = args.dataset_name or ("custom" if args.dataset_path else "random")
    if name == "custom" and not args.dataset_path:
        raise SystemExit("--dataset-name custom needs --dataset-path FILE")
    return name, args.dataset_path


def build_requests(args, vocab_size: int | None, tokenizer, chat: bool) -> list[datasets.LoadRequest]:
    name, path = dataset_choice(args)
    if name == "custom":
        reqs = datasets.load_trace(path, args.num_prompts, args.request_rate, args.burstiness,
                                   args.seed, tokenizer)
    elif name == "prefix_repetition":
        reqs = datasets.prefix_dataset(args.num_prompts, args.prefix_repetition_prefix_len,
                                       args.prefix_repetition_suffix_len,
                                       args.prefix_repetition_num_prefixes,
                                       args.prefix_repetition_output_len, vocab_size,
                                       args.request_rate, args.burstiness, args.seed)
    else:
        reqs = datasets.random_dataset(args.num_prompts, args.random_input_len, args.random_output_len,
                                       vocab_size, args.random_range_ratio, args.request_rate,
                                       args.burstiness, args.seed)
    if chat:  # chat takes text: decode the ids (vLLM's random dataset does the same)
        if tokenizer is None and any(isinstance(r.prompt, list) for r in reqs):
            raise SystemExit("--endpoint /v1/chat/completions needs text prompts: pass --tokenizer "
                             "with the model's checkpoint folder")
        for r in reqs:
            r.prompt = tokenizer.decode(r.prompt) if isinstance(r.prompt, list) else r.prompt
    return reqs


def main(argv: list[str] | None = None) -> int:
    """`python -m nanoserve loadgen ...`: run, print vLLM's result table, optionally save JSON."""
    ap = add_cli_args(cli.parser("nanoserve loadgen", __doc__))
    args = ap.parse_args(argv)
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    model = args.model or run_sync(first_model(base_url, args.api_key or env.get("OPENAI_API_KEY")))
    tokenizer = datasets.load_text_tokenizer(args.tokenizer)
    target = Target(base_url, model, args.endpoint, args.api_key, args.temperature, args.ignore_eos,
                    args.extra_body, args.request_timeout)
    uses_ids = dataset_choice(args)[0] in ("random", "prefix_repetition")
    vocab = datasets.resolve_vocab_size(args.tokenizer, args.vocab_size) if uses_ids or \
        args.probe_request_rate > 0 else None
    reqs = build_requests(args, vocab, tokenizer, target.chat)
    probe = None
    if args.probe_request_rate > 0:
        probe = datasets.random_dataset(1, args.probe_input_len, 1, vocab, seed=args.seed + 1)[0].prompt
        probe = tokenizer.decode(probe) if target.chat and tokenizer is not None else probe
    config = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai-chat" if target.chat
              else "openai", "label": args.label, "base_url": base_url, "endpoint": args.endpoint,
              "model_id": model, "tokenizer_id": args.tokenizer, "num_prompts": len(reqs),
              "request_rate": args.request_rate, "burstiness": args.burstiness,
              "max_concurrency": args.max_concurrency, "seed": args.seed}
    print(f"Traffic request rate: {args.request_rate}\nBurstiness factor: {args.burstiness} "
          f"({'Poisson process' if args.burstiness == 1 else 'Gamma distribution'})\n"
          f"Maximum request concurrency: {args.max_concurrency}")
    spec_before = spec_decode_metrics.fetch(base_url, args.api_key)
    result = run_sync(run(target, reqs, args.max_concurrency, args.goodput, args.probe_request_rate,
                          probe, 1, not args.disable_tqdm, config))
    spec = spec_decode_metrics.summary(spec_before, spec_decode_metrics.fetch(base_url, args.api_key))
    failed = [o for o in result.outputs if not o.success]
    for i, o in enumerate(failed[:10]):
        print(f"Error {i}: {o.error}")
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    report = result.table(args.percentile_metrics.split(","), percentiles)
    if spec is not None:  # the server speculates: this run's acceptance, before the closing rule
        head, _, last = report.rpartition("\n")
        report = f"{head}\n{spec_decode_metrics.table(spec)}\n{last}"
    print(report)
    if args.save_result:
        rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}"
        conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = f"{args.label}-{rate}qps{conc}-{model.split('/')[-1]}-{config['date']}.json"
        path = os.path.join(args.result_dir, args.result_filename or name)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(result.to_json(percentiles) | (spec or {}), f, indent=1)
        print(f"result written to {path}")
    return 0 if len(failed) < len(result.outputs) else 1
