"""Lesson 07: serving metrics, stratification, goodput, and the simulator calibrated on this device."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from nanoserve.config import EngineConfig
from nanoserve.course.scenarios.common import measure_workload, prompt_tokens, to_ms
from nanoserve.course.setup import Table, engine_of, fresh_engine, generate
from nanoserve.measure import bench
from nanoserve.measure.figures import device_label
from nanoserve.measure.metrics import compute_metrics, stratify, ttft
from nanoserve.measure.workload import LogNormal, Workload, greedy_params, synthetic
from nanoserve.sim.calibrate import calibrate
from nanoserve.sim.simulator import simulate


def chat_workload(num_requests: int, rate: float, input_median: int, output_median: int,
                  vocab_size: int, seed: int = 0, name: str = "chat", burstiness: float = 1.0) -> Workload:
    """Long-tailed prompt and answer lengths (log-normal, as chat traffic); Poisson arrivals, or
    more regular ones with burstiness > 1 (workload.arrival_times)."""
    return synthetic(num_requests, LogNormal(input_median, 0.5, 8, 8 * input_median),
                     LogNormal(output_median, 0.6, 2, 8 * output_median), rate, burstiness, seed=seed,
                     vocab_size=vocab_size, name=name)


def chat_maker(engine_or_llm, num_requests: int, input_median: int, output_median: int,
               seed: int = 3):
    """make_workload(rate) for sweeps and dashboards: the same requests, arriving at `rate`."""
    vocab = engine_of(engine_or_llm).model_config.vocab_size

    def make(rate: float) -> Workload:
        return chat_workload(num_requests, rate, input_median, output_median, vocab, seed=seed)
    return make


@dataclass
class DeviceModel:
    """The simulator's cost model fitted to a measured run on this device (sim.calibrate)."""

    calibration: object  # sim.Calibration
    result: bench.BenchResult  # the measured run it was fitted to
    num_kv_blocks: int
    config: EngineConfig
    label: str  # "modelled: calibrated on <device>"

    @property
    def cost_model(self):
        return self.calibration.cost_model

    @property
    def model_config(self):
        return self.result.model_config

    def simulate(self, workload: Workload, **config):
        """Run `workload` through the real scheduler on this device's fitted cost model."""
        cfg = replace(self.config, num_kv_blocks=self.num_kv_blocks, **config)
        return simulate(workload, self.model_config, self.cost_model, cfg, self.result.dtype)


def calibrate_device(engine_or_llm, num_requests: int, input_median: int, output_median: int,
                     progress: bool = True, seed: int = 0) -> DeviceModel:
    """Measure a varied offline run (prompts of many lengths, half of them queued at a time, so
    steps mix prefill chunks with decode batches of many sizes) and fit the simulator's cost
    model to its step times (sim.calibrate). The fit error is in `.calibration.describe()`."""
    engine = fresh_engine(engine_or_llm, max_num_seqs=max(2, num_requests // 2))
    wl = chat_workload(num_requests, math.inf, input_median, output_median,
                       engine.model_config.vocab_size, seed=seed + 7, name="calibration")
    res = bench.replay(engine, wl, realtime=False, progress=progress, warmup=1,
                       label=device_label(engine))
    cal = calibrate(res.trace, res.model_config, res.dtype,
                    label=f"calibrated on {res.device_label.removeprefix('measured on ')}")
    return DeviceModel(cal, res, engine.num_kv_blocks, engine_of(engine_or_llm).config,
                       f"modelled: {cal.cost_model.label}")



def measured_capacity(result: bench.BenchResult) -> float:
    """Requests/s of an offline run (everything queued at t=0): what the device serves flat out."""
    return result.metrics().request_throughput


def workload_shift(engine_or_llm, num_requests: int, input_median: int, output_median: int,
                   longer_output_median: int, progress: bool = True, rate: float | None = None) -> dict:
    """The same server measured on two weeks of traffic: in the second, answers are longer
    (output median longer_output_median instead of output_median). Both weeks arrive at the same,
    nearly regular rate: by default slow enough that a typical second-week request finishes before
    the next arrives (from one request measured alone here), so neither week queues or batches
    much and any difference is the mix; or `rate` (requests/s), to measure the weeks under load.
    -> {"before": BenchResult, "after": BenchResult}."""
    from nanoserve.course.scenarios.common import unloaded_latency
    if rate is None:
        alone = unloaded_latency(engine_or_llm, input_median)
        rate = 1 / (1.5 * (alone["ttft"] + longer_output_median * alone["tpot"]))
    vocab = engine_of(engine_or_llm).model_config.vocab_size
    weeks = [chat_workload(num_requests, rate, input_median, median, vocab, seed=seed, name=name,
                           burstiness=20.0)
             for name, median, seed in (("before", output_median, 21), ("after", longer_output_median, 22))]
    return {w.name: measure_workload(engine_or_llm, w, progress=progress) for w in weeks}


def p50_ratio(weeks: dict, metric: str) -> float:
    """Median `metric` ("ttft", "tpot", "itl", "e2e") of the "after" week over the "before" week's."""
    before, after = (getattr(compute_metrics(weeks[k].outputs), metric).median for k in ("before", "after"))
    return after / before


def load_table(conditions: dict) -> Table:
    """The two weeks under each condition (name -> workload_shift's dict): the arrival rate they had,
    how many requests ran at once, and the medians that stratification compares."""
    rows = []
    for cond, weeks in conditions.items():
        for week, r in weeks.items():
            m = compute_metrics(r.outputs)
            t = sorted(o.metrics.arrival_time for o in r.outputs)
            rows.append({"condition": cond, "week": week, "rate (req/s)": (len(t) - 1) / (t[-1] - t[0]),
                         "out tok (mean)": m.total_output_tokens / max(m.completed, 1),
                         "running per step (mean)": sum(s.num_running for s in r.trace) / len(r.trace),
                         "TPOT p50 (ms)": to_ms(m.tpot.median), "E2E p50 (ms)": to_ms(m.e2e.median)})
    return Table(rows, f"The two weeks idle and under load, {r.device_label}", ".2f")


@dataclass
class PromptSweep:
    """TTFT of prompts of many lengths, each sent alone (so TTFT is its prefill, no queue)."""

    input_lens: list[int]
    ttfts: list[float]  # s, measured
    device_label: str

    @property
    def growth(self) -> float:
        """TTFT of the longest prompt over the shortest's."""
        return self.ttfts[-1] / self.ttfts[0]


def ttft_by_input(engine_or_llm, shortest: int, longest: int, count: int, output_len: int = 2,
                  repeats: int = 3, seed: int = 0) -> PromptSweep:
    """`count` prompt lengths spaced evenly on a log scale from `shortest` to `longest`, each sent
    alone to a fresh engine without prefix caching, `repeats` times (other tokens each time):
    the median TTFT per length (measured), shortest first."""
    if not 1 <= shortest < longest or count < 2:
        raise ValueError(f"ttft_by_input: need 1 <= shortest < longest and count >= 2, got "
                         f"shortest={shortest}, longest={longest}, count={count}")
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False)
    lens = sorted({int(round(x)) for x in np.geomspace(shortest, longest, count)})
    generate(engine, [prompt_tokens(engine, shortest, seed + 999)], greedy_params(output_len))  # warm-up
    ttfts = [float(np.median([ttft(generate(engine, [prompt_tokens(engine, n, seed + 100 * i + r)],
                                            greedy_params(output_len))[0]) for r in range(repeats)]))
             for i, n in enumerate(lens)]
    return PromptSweep(lens, ttfts, device_label(engine))


def metrics_table(results: dict, slo: dict | None = None) -> Table:
    """Headline metrics of several runs (name -> BenchResult or SimResult), in milliseconds."""
    rows = []
    for name, r in results.items():
        m = compute_metrics(r.outputs, slo=slo)
        row = {"run": name, "requests": m.completed,
               "out tok (mean)": m.total_output_tokens / max(m.completed, 1)}
        for k in ("ttft", "tpot", "itl", "e2e"):
            s = getattr(m, k)
            row[f"{k.upper()} p50"], row[f"{k.upper()} p99"] = to_ms(s.median), to_ms(s.p99)
        if slo is not None:
            row["goodput (req/s)"], row["attained (%)"] = m.goodput, 100 * m.slo_attainment
        rows.append(row)
    return Table(rows, "latencies in ms", ".1f")


def length_buckets(median: int) -> tuple[int, ...]:
    """Left edges of length buckets around a workload's median: [1, m/2), [m/2, m), [m, 2m), [2m, inf)."""
    return (1, max(2, median // 2), median, 2 * median)


def stratified_table(results: dict, metric: str = "e2e", buckets=(1, 8, 16, 32, 64),
                     by: str = "output") -> Table:
    """Median `metric` per length bucket (by "output" or "input" length), one column per run:
    like with like."""
    strat = {name: stratify(r.outputs, metric, by, buckets) for name, r in results.items()}
    labels = list(dict.fromkeys(s.label for st in strat.values() for s in st.strata))
    rows = []
    for lab in labels:
        row = {f"{by} tokens": lab}
        for name, st in strat.items():
            s = next((s for s in st.strata if s.label == lab), None)
            row[f"{name}: n"] = s.num_requests if s else 0
            row[f"{name}: median {metric} (ms)"] = to_ms(s.summary.median) if s else math.nan
        rows.append(row)
    return Table(rows, f"{metric.upper()} stratified by {by} length", ".1f")


@dataclass
class RatePoint:
    rate: float  # the arrival rate asked for (requests/s)
    result: object  # BenchResult (measured) or SimResult (modelled)
    throughput: float  # completed requests/s
    goodput: float  # requests/s within the SLO
    attainment: float  # fraction of requests within the SLO

    @property
    def offered(self) -> float:
        """The arrival rate the workload's random arrivals actually had (requests/s): with a few
        dozen requests it can differ from `rate` by tens of percent."""
        t = sorted(o.metrics.arrival_time for o in self.result.outputs)
        return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else self.rate


def rate_sweep(engine_or_llm, rates: Sequence[float], make_workload, slo: dict,
               progress: bool = True, **config) -> list[RatePoint]:
    """Measured: replay make_workload(rate) at each rate; throughput and goodput under `slo`."""
    from tqdm.auto import tqdm
    points = []
    for rate in tqdm(list(rates), desc="arrival rates", unit="run", disable=not progress, leave=False):
        res = measure_workload(engine_or_llm, make_workload(rate), progress=False, **config)
        m = res.metrics(slo)
        points.append(RatePoint(rate, res, m.request_throughput, m.goodput, m.slo_attainment))
    return points


def peak_goodput_fraction(points: Sequence[RatePoint], capacity: float) -> float:
    """The arrival rate (as the workload had it) of the point with the highest goodput, as a
    fraction of the measured capacity."""
    return max(points, key=lambda p: p.goodput).offered / capacity


def simulated_rate_sweep(model: DeviceModel, rates: Sequence[float], make_workload, slo: dict,
                         **config) -> list[RatePoint]:
    """Modelled: the same sweep on the calibrated simulator."""
    points = []
    for rate in rates:
        res = model.simulate(make_workload(rate), **config)
        m = res.metrics(slo)
        points.append(RatePoint(rate, res, m.request_throughput, m.goodput, m.slo_attainment))
    return points
