"""What a client measured: per-request outputs shaped like the engine's, and the run's report.

`HTTPOutput` carries the same `RequestMetrics` as an engine `RequestOutput`, filled from what a
client sees: arrival_time = when the request was sent, one token time per streamed chunk that
carried a token (first_token_time = the first), finished_time = the last such chunk (vLLM's
`latency`). So metrics.py's TTFT, ITL, TPOT, E2E, goodput and stratify apply unchanged. What a
client cannot see stays None: first_scheduled_time (so queue and prefill are unknown).

`LoadResult.table()` prints `vllm bench serve`'s "Serving Benchmark Result" layout and
`to_json()` writes its JSON keys (vllm 0.32 benchmarks/serve.py: benchmark(), calculate_metrics),
plus nanoserve's ServingMetrics under "metrics" and the probe requests' figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.measure import metrics as m
from nanoserve.outputs import RequestMetrics


@dataclass
class HTTPOutput:
    """One request as a client saw it (the attributes metrics.py reads of a RequestOutput)."""

    request_id: str
    prompt_len: int
    metrics: RequestMetrics
    output_len: int = 0  # usage.completion_tokens, else the number of token chunks
    finished: bool = False
    finish_reason: str | None = None  # the server's ("stop" / "length"); None if it failed
    text: str = ""
    error: str = ""

    # the API sends text, not ids: metrics.py only needs how many there were
    @property
    def prompt_token_ids(self) -> range:
        return range(self.prompt_len)

    @property
    def token_ids(self) -> range:
        return range(self.output_len)

    @property
    def success(self) -> bool:
        return m.completed(self)


def _stats(values: Sequence[float], percentiles: Sequence[float]) -> dict:
    """vLLM's mean/median/std/percentiles in ms (0 when empty, as vLLM's `np.mean(x or 0)`)."""
    a = np.asarray(values if len(values) else [0.0], float) * 1e3
    out = {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std())}
    out.update({f"p{p:g}": float(np.percentile(a, p)) for p in percentiles})
    return out


def peaks(outputs: Sequence[HTTPOutput]) -> tuple[float, int]:
    """vLLM's peak output tokens/s and peak concurrent requests, over 1-second buckets."""
    done = [o for o in outputs if o.success]
    if not done:
        return 0.0, 0
    t0 = min(o.metrics.arrival_time for o in done)
    end = max(o.metrics.finished_time for o in done)
    n = int(math.ceil(end - t0)) + 1
    tokens, concurrent = np.zeros(n), np.zeros(n)
    for o in done:
        for t in o.metrics.token_times:
            tokens[int(t - t0)] += 1
        concurrent[int(o.metrics.arrival_time - t0):int(o.metrics.finished_time - t0) + 1] += 1
    return float(tokens.max()), int(concurrent.max())


@dataclass
class LoadResult:
    outputs: list[HTTPOutput]
    duration: float  # seconds from the first send until every request ended (vLLM's)
    config: dict = field(default_factory=dict)  # what was run: base_url, model, rates, ...
    probes: list[HTTPOutput] = field(default_factory=list)
    slo: dict | None = None  # parsed --goodput, seconds

    def metrics(self, slo=None) -> m.ServingMetrics:
        return m.compute_metrics(self.outputs, self.duration, slo if slo is not None else self.slo)

    def latencies(self) -> dict[str, list[float]]:
        """Seconds, over successful requests: ttft, tpot (n_out > 1), itl (pooled), e2el."""
        done = [o for o in self.outputs if o.success]
        return {"ttft": [m.ttft(o) for o in done],
                "tpot": [t for t in map(m.tpot, done) if t is not None],
                "itl": [g for o in done for g in m.itls(o)], "e2el": [m.e2e(o) for o in done]}

    def probe_stats(self) -> dict | None:
        lats = [m.e2e(o) for o in self.probes if o.success]
        if not lats:
            return None
        return {"probe_completed": len(lats), "probe_failed": len(self.probes) - len(lats),
                "probe_median_e2el_ms": float(np.median(lats)) * 1e3,
                "probe_p99_e2el_ms": float(np.percentile(lats, 99)) * 1e3,
                "probe_max_e2el_ms": float(max(lats)) * 1e3}

    def to_json(self, percentiles: Sequence[float] = (99,)) -> dict:
        sm, done = self.metrics(), [o for o in self.outputs if o.success]
        peak_tps, peak_conc = peaks(self.outputs)
        out = {**self.config, "duration": self.duration, "completed": sm.completed,
               "failed": len(self.outputs) - sm.completed,
               "total_input_tokens": sm.total_input_tokens, "total_output_tokens": sm.total_output_tokens,
               "request_throughput": sm.request_throughput,
               "request_goodput": sm.goodput if self.slo else None,
               "output_throughput": sm.output_throughput, "total_token_throughput": sm.total_token_throughput,
               "input_lens": [o.prompt_len for o in self.outputs],
               "output_lens": [o.output_len if o.success else 0 for o in self.outputs],
               "ttfts": [m.ttft(o) or 0.0 for o in self.outputs],
               "itls": [m.itls(o) for o in self.outputs],
               "latencies": [(m.e2e(o) or 0.0) if o.success else 0.0 for o in self.outputs],
               "generated_texts": [o.text for o in self.outputs],
               "errors": [o.error for o in self.outputs],
               "max_output_tokens_per_s": peak_tps, "max_concurrent_requests": peak_conc}
        for name, values in self.latencies().items():
            for stat, v in _stats(values, percentiles).items():
                out[f"{stat}_{name}_ms"] = v
        out.update(self.probe_stats() or {})
        out["metrics"] = sm.to_dict()
        out["completed_request_ids"] = [o.request_id for o in done]
        return out

    def table(self, selected: Sequence[str] = ("ttft", "tpot", "itl"),
              percentiles: Sequence[float] = (99,)) -> str:
        """`vllm bench serve`'s result layout."""
        j, c = self.to_json(percentiles), self.config
        row = "{:<40} {:<10}".format
        rowf = "{:<40} {:<10.2f}".format
        lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
                 row("Successful requests:", j["completed"]), row("Failed requests:", j["failed"])]
        if c.get("max_concurrency") is not None:
            lines.append(row("Maximum request concurrency:", c["max_concurrency"]))
        if c.get("request_rate", math.inf) != math.inf:
            lines.append(rowf("Request rate configured (RPS):", c["request_rate"]))
        lines += [rowf("Benchmark duration (s):", j["duration"]),
                  row("Total input tokens:", j["total_input_tokens"]),
                  row("Total generated tokens:", j["total_output_tokens"]),
                  rowf("Request throughput (req/s):", j["request_throughput"])]
        if self.slo:
            lines.append(rowf("Request goodput (req/s):", j["request_goodput"]))
        lines += [rowf("Output token throughput (tok/s):", j["output_throughput"]),
                  rowf("Peak output token throughput (tok/s):", j["max_output_tokens_per_s"]),
                  rowf("Peak concurrent requests:", j["max_concurrent_requests"]),
                  rowf("Total token throughput (tok/s):", j["total_token_throughput"])]
        if "probe_completed" in j:
            lines += ["{s:{c}^{n}}".format(s="Probe Requests", n=50, c="-"),
                      row("Probe requests completed:", j["probe_completed"]),
                      row("Probe requests failed:", j["probe_failed"]),
                      rowf("Median probe E2EL (ms):", j["probe_median_e2el_ms"]),
                      rowf("P99 probe E2EL (ms):", j["probe_p99_e2el_ms"]),
                      rowf("Max probe E2EL (ms):", j["probe_max_e2el_ms"])]
        heads = {"ttft": ("TTFT", "Time to First Token"),
                 "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                 "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}
        for key in ("ttft", "tpot", "itl", "e2el"):
            if key not in selected:
                continue
            short, head = heads[key]
            lines += ["{s:{c}^{n}}".format(s=head, n=50, c="-"),
                      rowf(f"Mean {short} (ms):", j[f"mean_{key}_ms"]),
                      rowf(f"Median {short} (ms):", j[f"median_{key}_ms"])]
            lines += [rowf(f"P{p:g} {short} (ms):", j[f"p{p:g}_{key}_ms"]) for p in percentiles]
        lines.append("=" * 50)
        return "\n".join(lines)
