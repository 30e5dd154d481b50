"""What HTTP adds: the same work in-process (an LLM) and through a server (loadgen), side by side.

Lesson 10 and benchmarks/http_peers.py both ask three questions, answered here on the device at
hand (the server and the in-process LLM load the same model and never run at the same time):

    batch1_ttft          one request at a time: TTFT in-process vs over HTTP, and the difference
    throughput_vs_offline N streams at once over HTTP vs LLM.generate of the same prompts offline
    replay_vs_loadgen    one seeded workload replayed in-process (bench.replay) and sent by
                         loadgen: median TTFT and ITL as ratios (HTTP / in-process)
    rate_sweep           loadgen at several request rates: how TTFT and ITL grow with load

The server is any OpenAI-compatible base URL; this module never imports nanoserve.serve.
A server keeps its prefix cache between calls, so the prompts each function sends are drawn
from seeds of its own (FRESH): a prompt a server has already seen would skip its prefill.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from nanoserve.measure import datasets
from nanoserve.measure.bench import replay
from nanoserve.measure.http_result import LoadResult
from nanoserve.measure.loadgen import Target, run, run_sync
from nanoserve.measure.metrics import compute_metrics, ttft
from nanoserve.measure.workload import synthetic
from nanoserve.sampling_params import SamplingParams

# Seed offsets, one per use: no prompt sent here repeats another sent here or by a caller whose
# seeds stay below 10_000 (benchmarks/http_peers.py, lesson 10)
FRESH = {"batch1": 10_000, "throughput": 20_000, "replay": 30_000, "capacity": 40_000, "sweep": 50_000}


def _load(target: Target, reqs, max_concurrency=None, slo=None) -> LoadResult:
    return run_sync(run(target, reqs, max_concurrency, slo, progress=False))


def _warm_up(llm, reqs) -> None:
    """Run these shapes once in-process with other prompts, as the server warmed up at start:
    first-touch allocation of KV pages and lazy initialisation stay out of the timings."""
    vocab = llm.engine.model_config.vocab_size
    other = datasets.random_dataset(len(reqs), 1, 1, vocab, seed=2**31 - 1)
    prompts = [o.prompt * r.prompt_len for o, r in zip(other, reqs)]
    llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))


@dataclass
class Batch1:
    in_process_ttft: float  # s, median
    http_ttft: float  # s, median
    n: int

    @property
    def overhead(self) -> float:
        return self.http_ttft - self.in_process_ttft

    def row(self) -> dict:
        return {"requests": self.n, "in-process TTFT (ms)": round(1e3 * self.in_process_ttft, 2),
                "HTTP TTFT (ms)": round(1e3 * self.http_ttft, 2),
                "HTTP adds (ms)": round(1e3 * self.overhead, 2),
                "HTTP adds (%)": round(100 * self.overhead / self.in_process_ttft, 1)}


def batch1_ttft(llm, target: Target, n: int, input_len: int, output_len: int = 4,
                seed: int = 0) -> Batch1:
    """n requests one after another, never two at once, in-process (LLM.generate, TTFT on the
    engine clock from add_request) and over HTTP (loadgen, from the send) in turn: a machine whose
    speed drifts during the run moves both sides alike."""
    vocab, seed = llm.engine.model_config.vocab_size, seed + FRESH["batch1"]
    reqs = datasets.random_dataset(n, input_len, output_len, vocab, seed=seed)
    # the server's prefix cache would serve these very prompts: send fresh ones of the same shape
    fresh = datasets.random_dataset(n, input_len, output_len, vocab, seed=seed + 1)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    _warm_up(llm, reqs[:1])
    local, remote = [], []
    for r, f in zip(reqs, fresh):
        local.append(ttft(llm.generate([r.prompt], params)[0]))
        remote.append(_load(target, [f]).metrics().ttft.median)
    return Batch1(statistics.median(local), statistics.median(remote), n)


@dataclass
class Throughput:
    offline: float  # output tokens/s, LLM.generate of every prompt at once
    http: float  # output tokens/s, the same shapes as concurrent streams through the server
    streams: int

    def row(self) -> dict:
        return {"streams": self.streams, "offline LLM.generate (tok/s)": round(self.offline, 1),
                "over HTTP (tok/s)": round(self.http, 1),
                "HTTP / offline": round(self.http / self.offline, 3)}


def throughput_vs_offline(llm, target: Target, streams: int, input_len: int, output_len: int,
                          seed: int = 0) -> Throughput:
    vocab, seed = llm.engine.model_config.vocab_size, seed + FRESH["throughput"]
    reqs = datasets.random_dataset(streams, input_len, output_len, vocab, seed=seed)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    _warm_up(llm, reqs)
    t = time.perf_counter()
    outs = llm.generate([r.prompt for r in reqs], params)
    offline = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)
    fresh = datasets.random_dataset(streams, input_len, output_len, vocab, seed=seed + 1)
    return Throughput(offline, _load(target, fresh).metrics().output_throughput, streams)


@dataclass
class Agreement:
    in_process: object  # ServingMetrics
    http: object  # ServingMetrics

    def row(self) -> dict:
        a, b = self.in_process, self.http
        return {"median TTFT in-process (ms)": round(1e3 * a.ttft.median, 2),
                "median TTFT HTTP (ms)": round(1e3 * b.ttft.median, 2),
                "TTFT ratio": round(b.ttft.median / a.ttft.median, 3),
                "median ITL in-process (ms)": round(1e3 * a.itl.median, 2),
                "median ITL HTTP (ms)": round(1e3 * b.itl.median, 2),
                "ITL ratio": round(b.itl.median / a.itl.median, 3)}


def replay_vs_loadgen(llm, target: Target, n: int, input_len: int, output_len: int, rate: float,
                      seed: int = 0) -> Agreement:
    """One seeded workload (same prompts, lengths and arrivals), in-process then over HTTP."""
    vocab, seed = llm.engine.model_config.vocab_size, seed + FRESH["replay"]
    wl = synthetic(n, input_len, output_len, rate, 1.0, seed, vocab)
    local = replay(llm, wl, progress=False)
    # same shapes and arrivals, fresh token ids: neither run hits the other's prefix cache
    remote = [datasets.LoadRequest(p.prompt, p.prompt_len, r.max_tokens, r.arrival_time)
              for p, r in zip(datasets.random_dataset(n, input_len, output_len, vocab, seed=seed + 1),
                              datasets.from_workload(wl))]
    return Agreement(compute_metrics(local.outputs), _load(target, remote).metrics())


def capacity(target: Target, vocab: int, n: int, input_len: int, output_len: int, seed: int = 0) -> float:
    """Requests/s the server completes with everything sent at once (its offline rate)."""
    reqs = datasets.random_dataset(n, input_len, output_len, vocab, seed=seed + FRESH["capacity"])
    return _load(target, reqs).metrics().request_throughput


def rate_sweep(target: Target, vocab: int, n: int, input_len: int, output_len: int, fractions,
               seed: int = 0, min_requests: int = 8) -> list[tuple[float, LoadResult]]:
    """loadgen at fractions of the measured capacity (Poisson arrivals, one seed per rate).

    The capacity is measured with n requests sent at once; each rate then gets the same span of
    arrivals (the n / capacity seconds of that burst: round(n * fraction) requests, at least
    min_requests), so a load at a fifth of capacity takes about as long as one at capacity
    instead of five times longer."""
    cap = capacity(target, vocab, n, input_len, output_len, seed)
    out = []
    for i, f in enumerate(fractions):
        rate = f * cap
        reqs = datasets.random_dataset(max(min_requests, round(n * f)), input_len, output_len, vocab,
                                       rate=rate, seed=seed + FRESH["sweep"] + i)
        out.append((rate, _load(target, reqs)))
    return out


def sweep_table(sweep) -> list[dict]:
    rows = []
    for rate, res in sweep:
        m = res.metrics()
        rows.append({"requests": m.num_requests, "offered (req/s)": round(rate, 2),
                     "achieved (req/s)": round(m.request_throughput, 2),
                     "TTFT p50 (ms)": round(1e3 * m.ttft.median, 1),
                     "TTFT p99 (ms)": round(1e3 * m.ttft.p99, 1),
                     "ITL p50 (ms)": round(1e3 * m.itl.median, 1),
                     "ITL p99 (ms)": round(1e3 * m.itl.p99, 1), "failed": m.num_requests - m.completed})
    return rows


def loadgen_command(base_url: str, model: str, tokenizer: str, rate: float = math.inf, n: int = 200,
                    input_len: int = 512, output_len: int = 128, goodput: str = "ttft:500 tpot:50") -> str:
    """The command that measures another deployment (vLLM, SGLang, a cluster) the same way."""
    return (f"python -m nanoserve loadgen --base-url {base_url} --model {model} --tokenizer {tokenizer} "
            f"--num-prompts {n} --random-input-len {input_len} --random-output-len {output_len} "
            f"--ignore-eos --request-rate {rate:g} --goodput {goodput} --save-result")
