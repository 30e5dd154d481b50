"""GET /metrics: Prometheus text with vLLM's metric names, so vLLM's dashboards read nanoserve.

Names, help texts, label names (`model_name`, `engine`) and histogram buckets follow vLLM 0.32
(vllm/v1/metrics/loggers.py PrometheusStatLogger, vllm/v1/metrics/buckets.py). Each server has
its own CollectorRegistry, so several servers can live in one process (tests).

The engine thread calls `record_step` after every step and `record_finished` for each request that
ends; the latencies come from the request's own timestamps with measure.metrics' definitions
(TTFT, ITL, TPOT, E2E, queue, prefill), the same numbers `python -m nanoserve bench` reports.
With speculative decoding on, the engine's draft counters are exported as vLLM's
SpecDecodingProm does (vllm/v1/spec_decode/metrics.py): drafts, draft tokens, accepted tokens, and
accepted tokens per draft position (label `position`).
An instance of a disaggregated deployment also counts its KV transfers (saves on a prefill
instance, loads on a decode instance): nanoserve's own names, as vLLM's are per connector.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from nanoserve.measure import metrics as m

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason values


class ServerMetrics:
    """The server's Prometheus metrics for one served model."""

    def __init__(self, model_name: str, num_speculative_tokens: int = 0):
        disable_created_metrics()  # no *_created series, as vLLM (process-wide in prometheus_client)
        self.registry = r = CollectorRegistry()
        labels, values = ["model_name", "engine"], [model_name, "0"]

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name, doc):  # prometheus_client appends "_total" when it writes counters
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          labels + ["finished_reason"], registry=r)
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        rejections = Counter("vllm:admission_rejections",
                             "Number of admission attempts rejected by a queue limit, by reason.",
                             ["model_name", "reason"], registry=r)
        self.rejected = rejections.labels(model_name, "max_num_queued_reqs")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 REQUEST_LATENCY_BUCKETS)
        transfers = {name: Counter(f"nanoserve:kv_transfer_{name}", doc, labels + ["direction"],
                                   registry=r)
                     for name, doc in (("count", "KV transfers done (save: prefill side, load: decode)."),
                                       ("bytes", "KV bytes moved by transfers."),
                                       ("seconds", "Time spent in KV transfers (copy and checks)."),
                                       ("failures", "KV transfers that failed."))}
        self.transfers = {(name, d): c.labels(*values, d) for name, c in transfers.items()
                          for d in ("save", "load")}
        self.spec = {}  # EngineStats field -> counter, with speculative decoding only
        if num_speculative_tokens:
            for name, doc in (("num_drafts", "Number of spec decoding drafts."),
                              ("num_draft_tokens", "Number of draft tokens."),
                              ("num_accepted_tokens", "Number of accepted tokens.")):
                self.spec[f"spec_decode_{name}"] = counter(f"vllm:spec_decode_{name}", doc)
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", labels + ["position"], registry=r)
            self.spec_per_pos = [per_pos.labels(*values, str(i)) for i in range(num_speculative_tokens)]
        self._last = None  # the engine's counters at the previous step
        self._last_transfers: dict = {}

    def record_step(self, engine, outputs) -> None:
        """Scheduler state after a step (or an add/abort) and the tokens it produced."""
        self.running.set(len(engine.scheduler.running))
        self.waiting.set(len(engine.scheduler.waiting))
        self.kv_usage.set(engine.kv_manager.usage)
        stats = engine.stats
        if self._last is not None:
            self.prompt_tokens.inc(stats.prefill_tokens_computed - self._last.prefill_tokens_computed)
            self.preemptions.inc(stats.preemptions - self._last.preemptions)
            for name, c in self.spec.items():
                c.inc(getattr(stats, name) - getattr(self._last, name))
            if self.spec:
                for c, now, before in zip(self.spec_per_pos, stats.spec_decode_num_accepted_tokens_per_pos,
                                          self._last.spec_decode_num_accepted_tokens_per_pos):
                    c.inc(now - before)
        self._last = stats
        if engine.executor.kv_connector is not None:
            self._record_transfers(engine.executor.kv_connector.stats)
        for o in outputs:
            self.generation_tokens.inc(len(o.new_token_ids))
            if len(o.token_ids) == len(o.new_token_ids):  # the request's first token: it was admitted
                self.prefix_queries.inc(len(o.prompt_token_ids))
                self.prefix_hits.inc(o.num_cached_tokens)

    def _record_transfers(self, st) -> None:
        now = {("count", "save"): st.saves, ("count", "load"): st.loads,
               ("bytes", "save"): st.save_bytes, ("bytes", "load"): st.load_bytes,
               ("seconds", "save"): st.save_seconds, ("seconds", "load"): st.load_seconds,
               ("failures", "save"): st.failed_saves, ("failures", "load"): st.failed_loads}
        for key, value in now.items():
            if value > self._last_transfers.get(key, 0):
                self.transfers[key].inc(value - self._last_transfers.get(key, 0))
        self._last_transfers = now

    def record_finished(self, o) -> None:
        """A request that ended: its finish reason (vLLM's names) and, if it completed, its latencies."""
        reason = {"eos": "stop", "stop": "stop", "length": "length"}.get(o.finish_reason, o.finish_reason)
        if reason in self.success:
            self.success[reason].inc()
        if not m.completed(o):
            return
        for hist, fn in ((self.ttft, m.ttft), (self.e2e, m.e2e), (self.tpot, m.tpot),
                         (self.queue, m.queue_time), (self.prefill, m.prefill_time)):
            value = fn(o)
            if value is not None:
                hist.observe(value)
        for gap in m.itls(o):
            self.itl.observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)
