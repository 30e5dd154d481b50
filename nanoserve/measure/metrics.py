"""Serving metrics from per-request timestamps, defined as vLLM's serving benchmark defines them.

Per request (seconds, from `RequestOutput.metrics`):
  TTFT  = first_token_time - arrival_time, split into queue (first_scheduled_time - arrival_time)
          and prefill (first_token_time - first_scheduled_time)
  ITL   = each gap between consecutive token_times; pooled over requests when summarised
  TPOT  = (E2E - TTFT) / (n_out - 1), defined only for n_out > 1
  E2E   = finished_time - arrival_time
Throughput divides completed requests (and their input/output tokens) by the run's duration:
first arrival to last finish unless a duration is passed in. Goodput counts only completed
requests that meet every SLO. Aborted, failed (finish_reason "error") and unfinished requests
are counted but excluded from latencies and throughput, as vLLM excludes failed requests.
SLOs are read by slo.parse_slo (our 'ttft<=500ms' syntax or vLLM's '--goodput ttft:500').

Works on `RequestOutput` or any object with the same attributes (the simulator's outputs).
Deliberately left out: cost (see cost.py) and plotting (see figures.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from nanoserve.measure.slo import parse_slo


def completed(o) -> bool:
    """Finished normally (not aborted, not failed) with the timestamps every latency metric needs."""
    m = o.metrics
    return bool(o.finished and o.finish_reason not in ("abort", "error") and len(o.token_ids) > 0
                and m.first_token_time is not None and m.finished_time is not None)


def _diff(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def ttft(o) -> float | None:
    return _diff(o.metrics.first_token_time, o.metrics.arrival_time)


def queue_time(o) -> float | None:
    return _diff(o.metrics.first_scheduled_time, o.metrics.arrival_time)


def prefill_time(o) -> float | None:
    return _diff(o.metrics.first_token_time, o.metrics.first_scheduled_time)


def e2e(o) -> float | None:
    return _diff(o.metrics.finished_time, o.metrics.arrival_time)


def itls(o) -> list[float]:
    return np.diff(np.asarray(o.metrics.token_times, dtype=float)).tolist()


def tpot(o) -> float | None:
    """Mean time per output token after the first; None for 1-token outputs (as vLLM)."""
    n, total, first = len(o.token_ids), e2e(o), ttft(o)
    if n <= 1 or total is None or first is None:
        return None
    return (total - first) / (n - 1)


def itl_max(o) -> float | None:
    gaps = itls(o)
    return max(gaps) if gaps else None


def itl_p99(o) -> float | None:
    gaps = itls(o)
    return float(np.percentile(gaps, 99)) if gaps else None


# Per-request metrics by name: SLO keys and stratify() metrics. "itl" (stratify only) pools gaps.
REQUEST_METRICS: dict[str, Callable] = {
    "ttft": ttft, "queue": queue_time, "prefill": prefill_time, "tpot": tpot, "e2e": e2e,
    "itl_max": itl_max, "itl_p99": itl_p99,
}


def percentiles(values: Sequence[float], ps: Sequence[float] = (50, 90, 99)) -> dict:
    """{p: value} with numpy's default (linear) interpolation, as vLLM; NaN when empty."""
    if len(values) == 0:
        return {p: math.nan for p in ps}
    return {p: float(v) for p, v in zip(ps, np.percentile(np.asarray(values, float), ps))}


@dataclass
class Summary:
    """Distribution of one metric, in seconds (NaN where there are no samples)."""

    count: int
    mean: float
    std: float
    min: float
    median: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if len(values) == 0:
            return cls(0, *[math.nan] * 7)
        a = np.asarray(values, dtype=float)
        p = percentiles(a, (50, 90, 99))
        return cls(len(a), float(a.mean()), float(a.std()), float(a.min()), p[50], p[90],
                   p[99], float(a.max()))


def meets_slo(o, slo: str | dict) -> bool:
    """Completed and within every limit. A metric a request doesn't have (TPOT or ITL of a
    1-token output) counts as met, as vLLM's goodput counts it as 0."""
    if not completed(o):
        return False
    for name, limit in parse_slo(slo).items():
        value = REQUEST_METRICS[name](o)
        if value is not None and value > limit:
            return False
    return True


def run_duration(outputs: Sequence) -> float:
    """First arrival to the last finish (or last token, for requests that never finished)."""
    ends = [o.metrics.finished_time if o.metrics.finished_time is not None
            else (o.metrics.token_times[-1] if o.metrics.token_times else None) for o in outputs]
    ends = [t for t in ends if t is not None]
    if not ends:
        return math.nan
    return max(ends) - min(o.metrics.arrival_time for o in outputs)


def _rate(count: float, duration: float) -> float:
    return count / duration if duration > 0 else math.nan


def goodput(outputs: Sequence, slo: str | dict, duration: float | None = None) -> float:
    """Requests per second that completed within every SLO."""
    duration = run_duration(outputs) if duration is None else duration
    return _rate(sum(meets_slo(o, slo) for o in outputs), duration)


@dataclass
class ServingMetrics:
    """One run's metrics; latencies in seconds (`table()` prints milliseconds)."""

    num_requests: int
    completed: int
    aborted: int
    unfinished: int
    duration: float
    total_input_tokens: int  # of completed requests, as vLLM counts
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (input + output) tokens / s
    ttft: Summary
    queue: Summary
    prefill: Summary
    tpot: Summary
    itl: Summary
    e2e: Summary
    slo: dict | None = None
    good_requests: int | None = None
    goodput: float | None = None  # requests / s meeting every SLO
    slo_attainment: float | None = None  # good_requests / num_requests
    failed: int = 0  # finished with an error (finish_reason "error")

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        rows = [("Requests (completed/aborted/failed/unfinished)",
                 f"{self.completed}/{self.aborted}/{self.failed}/{self.unfinished}"),
                ("Duration (s)", f"{self.duration:.2f}"),
                ("Total input tokens", f"{self.total_input_tokens}"),
                ("Total output tokens", f"{self.total_output_tokens}"),
                ("Request throughput (req/s)", f"{self.request_throughput:.2f}"),
                ("Output token throughput (tok/s)", f"{self.output_throughput:.2f}"),
                ("Total token throughput (tok/s)", f"{self.total_token_throughput:.2f}")]
        if self.slo is not None:
            rows += [("SLO", ", ".join(f"{k}<={v * 1e3:g}ms" for k, v in self.slo.items())),
                     ("Goodput (req/s)", f"{self.goodput:.2f}"),
                     ("SLO attainment (%)", f"{100 * self.slo_attainment:.1f}")]
        lines = [f"{k:<42}{v:>12}" for k, v in rows]
        lines.append(f"{'(ms)':<10}" + "".join(f"{c:>9}" for c in
                                              ("mean", "median", "p90", "p99", "max")))
        for name in ("ttft", "queue", "prefill", "tpot", "itl", "e2e"):
            s = getattr(self, name)
            lines.append(f"{name.upper():<10}" + "".join(
                f"{1e3 * v:>9.2f}" for v in (s.mean, s.median, s.p90, s.p99, s.max)))
        return "\n".join(lines)


def compute_metrics(outputs: Sequence, duration: float | None = None,
                    slo: str | dict | None = None) -> ServingMetrics:
    """Summarise a run's final outputs (one per request)."""
    outputs = list(outputs)
    done = [o for o in outputs if completed(o)]
    aborted = sum(o.finish_reason == "abort" for o in outputs)
    failed = sum(o.finish_reason == "error" for o in outputs)
    duration = run_duration(outputs) if duration is None else float(duration)
    n_in = sum(len(o.prompt_token_ids) for o in done)
    n_out = sum(len(o.token_ids) for o in done)

    def summary(fn):
        return Summary.of([v for v in map(fn, done) if v is not None])

    m = ServingMetrics(
        num_requests=len(outputs), completed=len(done), aborted=aborted, failed=failed,
        unfinished=len(outputs) - len(done) - aborted - failed, duration=duration,
        total_input_tokens=n_in, total_output_tokens=n_out,
        request_throughput=_rate(len(done), duration), output_throughput=_rate(n_out, duration),
        total_token_throughput=_rate(n_in + n_out, duration),
        ttft=summary(ttft), queue=summary(queue_time), prefill=summary(prefill_time),
        tpot=summary(tpot), itl=Summary.of([g for o in done for g in itls(o)]),
        e2e=summary(e2e))
    if slo is not None:
        m.slo = parse_slo(slo)
        m.good_requests = sum(meets_slo(o, m.slo) for o in done)
        m.goodput = _rate(m.good_requests, duration)
        m.slo_attainment = m.good_requests / len(outputs) if outputs else math.nan
    return m


@dataclass
class Stratum:
    """Requests whose length falls in [lo, hi) (hi None: no upper bound)."""

    lo: int
    hi: int | None
    num_requests: int
    summary: Summary

    @property
    def label(self) -> str:
        return f"[{self.lo}, {'inf' if self.hi is None else self.hi})"


@dataclass
class Stratification:
    metric: str
    by: str
    strata: list[Stratum]

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        head = f"{self.metric} (ms) by {self.by} length"
        cols = ("mean", "median", "p90", "p99")
        lines = [f"{head:<22}{'n':>6}" + "".join(f"{c:>9}" for c in cols)]
        for s in self.strata:
            q = s.summary
            lines.append(f"{s.label:<22}{s.num_requests:>6}" + "".join(
                f"{1e3 * v:>9.2f}" for v in (q.mean, q.median, q.p90, q.p99)))
        return "\n".join(lines)


def stratify(outputs: Sequence, metric: str | Callable = "e2e", by: str = "output",
             buckets: Sequence[int] = (1, 32, 128, 512)) -> Stratification:
    """A metric's distribution per length bucket of completed requests.

    `buckets` are left edges: [1, 32, 128] gives [1, 32), [32, 128), [128, inf); a leading
    [0, edge0) bucket appears only when some request is shorter than the first edge. `metric`
    is a REQUEST_METRICS name, "itl" (every gap of the bucket's requests, pooled) or a
    function of one output returning seconds or None. `by` is "output" or "input".
    """
    if by not in ("output", "input"):
        raise ValueError(f"by={by!r} must be 'output' or 'input'")
    if callable(metric):
        fn, name = metric, getattr(metric, "__name__", "metric")
    elif metric == "itl" or metric in REQUEST_METRICS:
        fn, name = (itls if metric == "itl" else REQUEST_METRICS[metric]), metric
    else:
        raise ValueError(f"unknown metric {metric!r}; choose from "
                         f"{['itl', *REQUEST_METRICS]} or pass a function")
    edges = sorted({int(b) for b in buckets})
    if not edges or edges[0] < 0:
        raise ValueError(f"buckets={list(buckets)!r} must be non-empty edges >= 0")
    done = [o for o in outputs if completed(o)]
    length = (lambda o: len(o.token_ids)) if by == "output" else (lambda o: len(o.prompt_token_ids))
    if edges[0] > 0 and any(length(o) < edges[0] for o in done):
        edges = [0, *edges]
    strata = []
    for lo, hi in zip(edges, [*edges[1:], None]):
        members = [o for o in done if length(o) >= lo and (hi is None or length(o) < hi)]
        values = []
        for o in members:
            v = fn(o)
            values.extend(v if isinstance(v, list) else [] if v is None else [v])
        strata.append(Stratum(lo, hi, len(members), Summary.of(values)))
    return Stratification(name, by, strata)
