"""Lesson 08: dollars per million input and output tokens from measured runs, and per request
within an SLO (vLLM's request goodput)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nanoserve.course.scenarios.common import measure_workload, round_up, to_ms, unloaded_latency
from nanoserve.course.scenarios.prefix import prefix_summary
from nanoserve.course.setup import Table, device_kind, engine_of
from nanoserve.measure import bench
from nanoserve.measure.metrics import ServingMetrics
from nanoserve.measure.workload import synthetic


def default_price_per_hour(device: str | None = None) -> tuple[float, str]:
    """A placeholder price to start from (an assumption, not a quote): set your own."""
    if device_kind(device) == "cuda":
        return 3.0, "assumed on-demand price of one datacenter GPU; set your own"
    return 0.10, "assumed price of a small cloud VM (a few vCPUs); set your own"


def batch_cap_runs(engine_or_llm, caps: Sequence[int], num_requests: int, input_len: int,
                   output_len: int, progress: bool = True, seed: int = 0) -> dict:
    """The same offline workload (everything queued at t=0) at each max_num_seqs cap, measured.
    -> {cap: BenchResult}."""
    from tqdm.auto import tqdm
    engine = engine_of(engine_or_llm)
    wl = synthetic(num_requests, input_len, output_len, math.inf, seed=seed,
                   vocab_size=engine.model_config.vocab_size, name="offline batch")
    out = {}
    for cap in tqdm(list(caps), desc="batch caps", unit="run", disable=not progress, leave=False):
        out[cap] = measure_workload(engine, wl, progress=False, max_num_seqs=cap,
                                    enable_prefix_caching=False,
                                    max_num_batched_tokens=max(engine.config.max_num_batched_tokens,
                                                               input_len + cap))
    return out


def run_cost(result: bench.BenchResult, price_per_hour: float):
    """cost.cost_report of a measured run, charging its whole duration, billed tokens."""
    from nanoserve.measure.cost import billed_tokens, cost_report
    n_in, n_out = billed_tokens(result.outputs)
    return cost_report(result.trace, price_per_hour, result.duration, n_in, n_out)


def cost_rows(runs: dict, price_per_hour: float, slo: dict | None = None) -> Table:
    """$/1M input and output tokens per run (name -> BenchResult) at one price per hour; with an
    SLO, also its goodput and what each request within the SLO cost (evaluate_caps)."""
    rows = []
    for name, r in runs.items():
        c = run_cost(r, price_per_hour)
        m = r.metrics(slo)
        row = {"max_num_seqs": name, "tok/s out": m.output_throughput,
               "TPOT p50 (ms)": to_ms(m.tpot.median), "$/1M in": c.usd_per_1m_input,
               "$/1M out": c.usd_per_1m_output, "out/in": c.output_input_ratio}
        if slo is not None:
            e = _evaluate(name, m, price_per_hour)
            row.update({"within SLO (%)": 100 * m.slo_attainment, "goodput (req/s)": m.goodput,
                        "$/1k requests": e.usd_per_1k_requests,
                        "$/1k within SLO": e.usd_per_1k_good})
        rows.append(row)
    return Table(rows, f"at ${price_per_hour:.2f}/h, {next(iter(runs.values())).device_label}", ".3g")


def tpot_slo(engine_or_llm, input_len: int, factor: float = 2.0) -> dict:
    """A streaming-speed SLO for offline runs (where TTFT is queueing by construction): TPOT <=
    factor x the TPOT of one request running alone here (measured)."""
    return {"tpot": round_up(factor * unloaded_latency(engine_or_llm, input_len)["tpot"])}


@dataclass
class CapEvaluation:
    """One batch cap's run at a price and an SLO, scored by vLLM's request goodput."""

    label: str  # the max_num_seqs cap
    metrics: ServingMetrics  # with the SLO: .goodput, completed requests/s within every limit
    usd_per_1k_requests: float  # what the run cost per 1000 completed requests
    usd_per_1k_good: float  # per 1000 requests within the SLO: price per second / goodput (inf: none)


def _evaluate(label, m: ServingMetrics, price_per_hour: float) -> CapEvaluation:
    per_s = price_per_hour / 3600

    def per_1k(rate):
        return 1e3 * per_s / rate if rate > 0 else math.inf
    return CapEvaluation(str(label), m, per_1k(m.request_throughput), per_1k(m.goodput))


def evaluate_caps(runs: dict, price_per_hour: float, slo: dict) -> list[CapEvaluation]:
    """Each batch cap's run scored at the SLO: its goodput (vLLM's: completed requests per second
    within every limit) and the price of the device's time per request that met the SLO. The
    cheapest cap at the SLO is the one with the lowest usd_per_1k_good."""
    return [_evaluate(k, r.metrics(slo), price_per_hour) for k, r in runs.items()]


def provider_table(measured_ratio: float | None = None) -> Table:
    """Providers' list prices (USD per 1M tokens; source and date) beside this device's ratio."""
    from nanoserve.measure.cost import PROVIDER_PRICES
    rows = [{"who": name, "$/1M in": p.input_per_1m, "$/1M out": p.output_per_1m,
             "out/in": p.ratio, "source": f"list price, {p.source}, {p.date}"}
            for name, p in PROVIDER_PRICES.items()]
    if measured_ratio is not None:
        rows.append({"who": "this device (measured)", "$/1M in": math.nan, "$/1M out": math.nan,
                     "out/in": measured_ratio, "source": "this notebook"})
    return Table(rows, "Output/input price ratio", ".3g")


def prefix_discount_table(results: dict, price_per_hour: float) -> Table:
    """What a prefix-cache hit is worth. `results`: prefix_cache_compare's {"off", "on"} runs of
    a shared-prompt workload. This device: the busy time attributed to prefill per 1M billed
    prompt tokens, caching off and on (measured); providers: their list input price, their cached
    input price and the input price at the hit rate measured here."""
    from nanoserve.measure.cost import PROVIDER_PRICES, attribute_time, billed_tokens
    hit = prefix_summary(results["on"])["hit rate (%)"] / 100
    rows = []
    for name, r in results.items():
        n_in, _ = billed_tokens(r.outputs)
        prefill_s, _ = attribute_time(r.trace)
        rows.append({"who": f"this device, caching {name} (measured)", "hit rate (%)": 100 * hit if
                     name == "on" else 0.0, "$/1M in, list": "-", "$/1M cached in": "-",
                     "$/1M in at this hit rate": price_per_hour / 3600 * prefill_s / n_in * 1e6})
    for name, p in PROVIDER_PRICES.items():
        rows.append({"who": f"{name} ({p.date})", "hit rate (%)": 100 * hit,
                     "$/1M in, list": p.input_per_1m, "$/1M cached in": p.cached_input_per_1m,
                     "$/1M in at this hit rate": p.input_at_hit_rate(hit)})
    return Table(rows, f"Prefix-cache discount at the measured hit rate, ${price_per_hour:.2f}/h here", ".3g")


def kv_memory_table(engine_or_llm, runs: dict, price_per_hour: float) -> Table:
    """Per batch cap: the KV memory an output token holds (its request's context, for one step)
    and what that costs if memory is what limits the batch: the device's price per second spread
    over the byte-seconds of this engine's KV pool (modelled from the measured runs)."""
    from nanoserve.engine.kv_cache import kv_bytes_per_block, kv_bytes_per_token
    from nanoserve.measure.cost import kv_memory_time
    engine = engine_of(engine_or_llm)
    cfg, dtype = engine.model_config, engine.kv_cache_dtype
    per_token = kv_bytes_per_token(cfg, dtype)
    pool = engine.num_kv_blocks * kv_bytes_per_block(cfg, engine.config.block_size, dtype)
    rows = []
    for cap, r in runs.items():
        _, decode = kv_memory_time(r.trace, per_token)
        n_out = sum(s.num_decode_tokens for s in r.trace)
        steps = [s for s in r.trace if s.num_decode_tokens]
        held = sum((e.start + 1) * per_token for s in steps for e in s.entries if e.kind == "decode")
        rows.append({"max_num_seqs": cap, "KV held per output token (MiB)": held / n_out / 2**20,
                     "for (ms, one step)": 1e3 * decode / held if held else math.nan,
                     "MiB*s per output token": decode / n_out / 2**20,
                     "$/1M out, memory rent": price_per_hour / 3600 * decode / pool / n_out * 1e6,
                     "$/1M out, step time": run_cost(r, price_per_hour).usd_per_1m_output})
    return Table(rows, f"KV memory-time of output tokens, {pool / 2**30:.2f} GiB KV pool at "
                       f"${price_per_hour:.2f}/h (modelled rent, measured runs)", ".3g")
