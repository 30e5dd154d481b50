"""Dollars per million input and output tokens from a measured run, and the cheapest run at an SLO.

The device is paid for by the hour, so a run costs price_per_hour * duration; the question is how
much of that buys input tokens (prefill) and how much output tokens (decode). The engine's step
trace answers it: each step has a `start`, an `end` and its `num_prefill_tokens` and
`num_decode_tokens` (StepRecord attributes or dict keys).

Attribution rule ("linear", the default). Fit step_time = a + b*prefill_tokens + c*decode_tokens
by least squares over the trace. Each step's measured time is split between prefill and decode
in proportion to their modelled marginal cost, b*P : c*D, so the fixed cost a (mostly reading
the weights once per step) is shared in the same proportion. Why not split by token share: at
small batch a decode token costs about as much as a whole step (the weights are re-read for a
handful of tokens) while a prefill token rides a large matmul, so token share would charge a
decode token like a prefill token and flatten the output/input ratio that the run actually shows.
"tokens" (the token-share rule) is kept as the naive baseline to compare against. Time not
inside any step (waiting for arrivals, scheduling) is still paid for; it is spread over prefill
and decode in proportion to their busy time.

Token counts default to the trace's (computed prefill tokens, decode-step tokens). Pass billed
counts (`billed_tokens(outputs)`) to price what a provider would charge for: cached prompt
tokens and the first output token (which a prefill step produces) then count too.
`kv_memory_time` adds what the split by step time leaves out: the KV memory each request holds
while it generates, in byte-seconds, for pricing memory when memory is what limits the batch.
Deliberately left out: energy, multi-device runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from nanoserve.measure.fit import nonneg_lstsq
from nanoserve.measure.metrics import ServingMetrics, completed, compute_metrics
from nanoserve.measure.slo import parse_slo


@dataclass(frozen=True)
class ProviderPrice:
    input_per_1m: float  # USD per 1M input tokens (uncached)
    output_per_1m: float  # USD per 1M output tokens
    source: str
    date: str  # when the price was listed at the source
    cached_input_per_1m: float | None = None  # USD per 1M input tokens read from a prompt cache

    @property
    def ratio(self) -> float:
        return self.output_per_1m / self.input_per_1m

    def input_at_hit_rate(self, hit_rate: float) -> float:
        """USD per 1M input tokens when `hit_rate` of them are billed as cache reads."""
        if not 0 <= hit_rate <= 1:
            raise ValueError(f"hit_rate={hit_rate!r} must be in [0, 1]")
        cached = self.input_per_1m if self.cached_input_per_1m is None else self.cached_input_per_1m
        return (1 - hit_rate) * self.input_per_1m + hit_rate * cached


# Public list prices, as published on each provider's pricing page at the date given. Prices
# change; pass your own dict to compare against current ones.
PROVIDER_PRICES: dict[str, ProviderPrice] = {
    # cached input: OpenAI's "cached input", Anthropic's cache read (writes cost 1.25x input,
    # left out), DeepSeek's "cache hit"
    "openai/gpt-4o": ProviderPrice(2.50, 10.00, "platform.openai.com/docs/pricing", "2025-03", 1.25),
    "openai/gpt-4o-mini": ProviderPrice(0.15, 0.60, "platform.openai.com/docs/pricing", "2025-03",
                                        0.075),
    "anthropic/claude-sonnet-4": ProviderPrice(3.00, 15.00, "anthropic.com/pricing", "2025-05", 0.30),
    "deepseek/deepseek-chat (V3.1)": ProviderPrice(
        0.56, 1.68, "api-docs.deepseek.com/quick_start/pricing", "2025-09", 0.07),
}


def _get(step, name: str):
    return step[name] if isinstance(step, dict) else getattr(step, name)


def _trace_arrays(trace: Sequence):
    if len(trace) == 0:
        raise ValueError("the step trace is empty: was the engine run with record_trace=True?")
    cols = [np.asarray([_get(s, k) for s in trace], dtype=float)
            for k in ("start", "end", "num_prefill_tokens", "num_decode_tokens")]
    start, end, p, d = cols
    return start, end, end - start, p, d


@dataclass
class StepTimeModel:
    """step_time = a + b * prefill_tokens + c * decode_tokens (seconds), fit to a trace."""

    a: float  # per step: weight reads, launches, sampling
    b: float  # per prefill token
    c: float  # per decode token
    r2: float  # fraction of step-time variance the fit explains

    def predict(self, prefill_tokens, decode_tokens):
        return self.a + self.b * np.asarray(prefill_tokens) + self.c * np.asarray(decode_tokens)


def fit_step_time(trace: Sequence) -> StepTimeModel:
    """Least-squares fit over the trace's steps, coefficients kept >= 0 (measure.fit: a token
    never has a negative cost). Needs pure and mixed steps of varied sizes to separate a, b and c."""
    _, _, t, p, d = _trace_arrays(trace)
    x = np.stack([np.ones_like(p), p, d], axis=1)  # (num_steps, 3)
    a, b, c = nonneg_lstsq(x, t)
    ss_tot = float(((t - t.mean()) ** 2).sum())
    ss_res = float(((t - x @ [a, b, c]) ** 2).sum())
    # equal step times leave nothing to explain (ss_tot is then rounding noise)
    r2 = 1 - ss_res / ss_tot if ss_tot > 1e-12 * float((t ** 2).sum()) else math.nan
    return StepTimeModel(float(a), float(b), float(c), r2)


def attribute_time(trace: Sequence, method: str = "linear",
                   model: StepTimeModel | None = None) -> tuple[float, float]:
    """(prefill_seconds, decode_seconds): the trace's step time split by `method` (see module
    docstring). A step whose model weights are both zero falls back to token share."""
    if method not in ("linear", "tokens"):
        raise ValueError(f"method={method!r} must be 'linear' or 'tokens'")
    _, _, t, p, d = _trace_arrays(trace)
    wp, wd = p.copy(), d.copy()
    if method == "linear":
        model = model or fit_step_time(trace)
        mp, md = model.b * p, model.c * d
        use = mp + md > 0
        wp[use], wd[use] = mp[use], md[use]
    tot = wp + wd
    share = np.divide(wp, tot, out=np.zeros_like(tot), where=tot > 0)
    worked = tot > 0  # steps without tokens are overhead, spread later with idle time
    return float((t * share)[worked].sum()), float((t * (1 - share))[worked].sum())


@dataclass
class CostReport:
    price_per_hour: float
    duration: float  # seconds paid for
    prefill_seconds: float  # duration attributed to prefill (idle time spread in proportion)
    decode_seconds: float
    input_tokens: int
    output_tokens: int
    usd_per_1m_input: float
    usd_per_1m_output: float
    output_input_ratio: float  # how many times dearer an output token is than an input token
    method: str
    model: StepTimeModel | None
    providers: dict[str, ProviderPrice] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        lines = [(f"device ${self.price_per_hour:.2f}/h for {self.duration:.2f} s "
                 f"(prefill {self.prefill_seconds:.2f} s, decode {self.decode_seconds:.2f} s; "
                 f"{self.method} attribution)")]
        if self.model is not None:
            m = self.model
            lines.append(f"step time = {m.a * 1e3:.3f} ms + {m.b * 1e6:.2f} us/prefill tok + "
                         f"{m.c * 1e6:.2f} us/decode tok (R² {m.r2:.3f})")
        lines.append(f"{'':<32}{'$/1M in':>10}{'$/1M out':>10}{'out/in':>8}")
        lines.append(f"{'this run':<32}{self.usd_per_1m_input:>10.4f}"
                     f"{self.usd_per_1m_output:>10.4f}{self.output_input_ratio:>8.2f}")
        for name, pp in self.providers.items():
            lines.append(f"{name:<32}{pp.input_per_1m:>10.4f}{pp.output_per_1m:>10.4f}"
                         f"{pp.ratio:>8.2f}  ({pp.source}, {pp.date})")
        return "\n".join(lines)


def billed_tokens(outputs: Sequence) -> tuple[int, int]:
    """(prompt tokens, generated tokens) of completed requests, as a provider would bill them."""
    done = [o for o in outputs if completed(o)]
    return sum(len(o.prompt_token_ids) for o in done), sum(len(o.token_ids) for o in done)


def _per_1m(usd: float, tokens: int) -> float:
    return usd / tokens * 1e6 if tokens > 0 else math.nan


def cost_report(trace: Sequence, price_per_hour: float, duration: float | None = None,
                input_tokens: int | None = None, output_tokens: int | None = None,
                method: str = "linear",
                providers: dict[str, ProviderPrice] | None = None) -> CostReport:
    """Cost per 1M input and output tokens of a run. `duration` defaults to the trace's span
    (first step start to last step end); pass the run's wall time to charge idle time too."""
    if price_per_hour < 0:
        raise ValueError(f"price_per_hour={price_per_hour!r} must be >= 0")
    start, end, _, p, d = _trace_arrays(trace)
    duration = float(end.max() - start.min()) if duration is None else float(duration)
    model = fit_step_time(trace) if method == "linear" else None
    pre_s, dec_s = attribute_time(trace, method, model)
    busy = pre_s + dec_s
    pre_frac = pre_s / busy if busy > 0 else 0.5
    n_in = int(p.sum()) if input_tokens is None else int(input_tokens)
    n_out = int(d.sum()) if output_tokens is None else int(output_tokens)
    usd = price_per_hour * duration / 3600
    per_in, per_out = _per_1m(usd * pre_frac, n_in), _per_1m(usd * (1 - pre_frac), n_out)
    return CostReport(price_per_hour, duration, duration * pre_frac, duration * (1 - pre_frac),
                      n_in, n_out, per_in, per_out,
                      per_out / per_in if per_in > 0 else math.nan, method, model,
                      dict(PROVIDER_PRICES if providers is None else providers))


def kv_memory_time(trace: Sequence, kv_bytes_per_token: float) -> tuple[float, float]:
    """(prefill, decode) byte-seconds of KV cache held by the requests of each step (StepRecords
    with entries): a request holds its whole context's KV, start + num_tokens tokens, for the
    step's duration. The decode share is what generating output tokens holds: each output token
    keeps the whole context in memory for one more step."""
    pre = dec = 0.0
    for step in trace:
        for e in step.entries:
            held = (e.start + e.num_tokens) * kv_bytes_per_token * step.duration
            if e.kind == "decode":
                dec += held
            else:
                pre += held
    return pre, dec


@dataclass
class Run:
    """One measured run of a workload (e.g. at one max_num_seqs) on a device at a price."""

    label: str
    outputs: Sequence
    trace: Sequence
    price_per_hour: float
    duration: float | None = None  # None: first arrival to last finish


@dataclass
class RunEvaluation:
    label: str
    metrics: ServingMetrics
    cost: CostReport
    meets_slo: bool
    usd_per_1m_total: float  # whole run's cost over all its billed tokens


def evaluate_runs(runs: Sequence[Run], slo: str | dict, min_attainment: float = 0.9,
                  method: str = "linear") -> list[RunEvaluation]:
    """Metrics and cost of each run; a run meets the SLO when at least min_attainment of its
    requests complete within every limit (DistServe's attainment-based goodput uses 90%).
    Each run pays for its whole wall time and is priced per billed token."""
    if not 0 < min_attainment <= 1:
        raise ValueError(f"min_attainment={min_attainment!r} must be in (0, 1]")
    slo = parse_slo(slo)
    evals = []
    for r in runs:
        m = compute_metrics(r.outputs, r.duration, slo)
        n_in, n_out = billed_tokens(r.outputs)
        c = cost_report(r.trace, r.price_per_hour, m.duration, n_in, n_out, method)
        total = _per_1m(r.price_per_hour * m.duration / 3600, n_in + n_out)
        evals.append(RunEvaluation(r.label, m, c, m.slo_attainment >= min_attainment, total))
    return evals


def cheapest_at_slo(runs: Sequence[Run], slo: str | dict, min_attainment: float = 0.9,
                    key: str = "total", method: str = "linear") -> RunEvaluation | None:
    """The run meeting the SLO at the lowest cost per 1M tokens of `key` ("total", "input" or
    "output"); None when no run meets it. For runs of one workload, "total" ranks runs by
    what serving that workload cost."""
    value = {"total": lambda e: e.usd_per_1m_total,
             "input": lambda e: e.cost.usd_per_1m_input,
             "output": lambda e: e.cost.usd_per_1m_output}.get(key)
    if value is None:
        raise ValueError(f"key={key!r} must be 'total', 'input' or 'output'")
    ok = [e for e in evaluate_runs(runs, slo, min_attainment, method) if e.meets_slo]
    return min(ok, key=value, default=None)
