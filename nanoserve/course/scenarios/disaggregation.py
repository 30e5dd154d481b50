"""Lesson 09: the simulator checked against this device, and colocated vs disaggregated serving."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from nanoserve.config import EngineConfig
from nanoserve.course.scenarios.common import to_ms
from nanoserve.course.scenarios.serving import DeviceModel
from nanoserve.course.setup import Table
from nanoserve.engine.kv_cache import kv_bytes_per_token
from nanoserve.measure import bench
from nanoserve.measure.ceilings import dtype_name
from nanoserve.measure.workload import LogNormal, Workload, synthetic
from nanoserve.sim.simulator import CostModel


def validation_table(model: DeviceModel, workload: Workload, measured: bench.BenchResult) -> Table:
    """Measured vs modelled TTFT and ITL (median, p99) for one workload, with the error."""
    sim = model.simulate(workload)
    mm, ms = measured.metrics(), sim.metrics()
    rows = []
    for k in ("ttft", "itl", "e2e"):
        for stat in ("median", "p99"):
            a, b = getattr(getattr(mm, k), stat), getattr(getattr(ms, k), stat)
            rows.append({"metric": f"{k.upper()} {stat}", "measured (ms)": to_ms(a),
                         "modelled (ms)": to_ms(b), "error (%)": 100 * (b - a) / a if a else math.nan})
    return Table(rows, f"{workload.name}: {measured.device_label} vs {model.label}", ".1f")


def kv_transfer_table(model_name: str = "llama-3-8b", device: str = "H100-SXM",
                      prompt_lens: Sequence[int] = (512, 2048, 8192), dtype: str = "bfloat16") -> Table:
    """What disaggregation adds: moving a prompt's KV over each link vs computing its prefill
    (modelled: datasheet link bandwidths and device profile)."""
    from nanoserve.measure.roofline import dtype_bytes, step_cost
    from nanoserve.sim.devices import DEVICES, LINKS, model_shape
    cfg, prof = model_shape(model_name), DEVICES[device]
    cm = CostModel.from_profile(prof, dtype)
    per_tok = kv_bytes_per_token(cfg, dtype_name(dtype))
    rows = []
    for n in prompt_lens:
        row = {"prompt tokens": n, "KV (MB)": n * per_tok / 1e6,
               f"prefill on {prof.name} (ms)": to_ms(cm.step_time(step_cost(cfg, [(n, n, True)],
                                                                          dtype_bytes(dtype)), 1))}
        for key, link in LINKS.items():
            row[f"{link.name} (ms)"] = to_ms(n * per_tok / link.bandwidth)
        rows.append(row)
    return Table(rows, f"{model_name} KV transfer vs prefill (modelled: datasheet figures)", ".3g")


def disagg_workload(rate: float, num_requests: int, vocab_size: int, input_median: int = 1536,
                    output_median: int = 192, seed: int = 0) -> Workload:
    """Long prompts and medium answers (retrieval-style chat): where prefill interferes."""
    return synthetic(num_requests, LogNormal(input_median, 0.5, 64, 8 * input_median),
                     LogNormal(output_median, 0.5, 8, 8 * output_median), rate, seed=seed,
                     vocab_size=vocab_size, name="long-prompt chat")


@dataclass
class DisaggStudy:
    """Colocated vs disaggregated serving of one workload on one modelled device, at several
    arrival rates. Simulations are cached, so a widget re-scoring SLOs re-simulates nothing."""

    device: object  # sim.DeviceProfile (datasheet) or sim.CostModel (calibrated here)
    label: str  # "modelled: ..." for figure titles
    model_config: object
    config: EngineConfig
    make_workload: object  # rate -> Workload
    rates: list[float]
    total: int = 4  # instances in either layout
    dtype: str = "bfloat16"
    cache: dict = field(default_factory=dict)

    def colocated(self, max_num_batched_tokens: int | None = None) -> list:
        """The colocated layout at each rate; max_num_batched_tokens: its token budget (default:
        the study's), the knob that trades a prefill chunk's ITL spike against TTFT."""
        from nanoserve.sim.disagg import simulate_colocated
        budget = self.config.max_num_batched_tokens if max_num_batched_tokens is None else \
            int(max_num_batched_tokens)
        if budget < 1:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens!r} must be >= 1")
        key = ("colocated", budget)
        if key not in self.cache:
            config = replace(self.config, max_num_batched_tokens=budget)
            self.cache[key] = [simulate_colocated(self.make_workload(r), self.model_config, self.device,
                                                  self.total, config, self.dtype) for r in self.rates]
        return self.cache[key]

    def disaggregated(self, num_prefill: int, link_bandwidth: float) -> list:
        from nanoserve.sim.devices import Link
        from nanoserve.sim.disagg import simulate_disaggregated
        if not 1 <= num_prefill < self.total:
            raise ValueError(f"num_prefill={num_prefill} must be in [1, {self.total - 1}] "
                             f"(total {self.total} instances)")
        key = ("disaggregated", num_prefill, float(link_bandwidth))
        if key not in self.cache:
            link = Link(f"{link_bandwidth / 1e9:g} GB/s", float(link_bandwidth), "chosen in the lesson")
            self.cache[key] = [simulate_disaggregated(self.make_workload(r), self.model_config, self.device,
                                                      num_prefill, self.total - num_prefill, link,
                                                      self.config, self.dtype) for r in self.rates]
        return self.cache[key]


def datasheet_study(device: str = "H100-SXM", model: str = "llama-3-8b", num_requests: int = 60,
                    num_rates: int = 4, total: int = 4, max_num_batched_tokens: int = 2048) -> DisaggStudy:
    """A study on a datasheet GPU profile with a public model shape; rates span up to about twice
    what `total` colocated instances serve flat out (modelled)."""
    from nanoserve.sim.devices import DEVICES, model_shape
    from nanoserve.sim.disagg import simulate_colocated
    prof, cfg = DEVICES[device], model_shape(model)
    config = EngineConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=128)
    flat = simulate_colocated(disagg_workload(math.inf, num_requests, cfg.vocab_size), cfg, prof,
                              total, config)
    cap = num_requests / flat.metrics().duration
    rates = [round(cap * 2 * (k + 1) / num_rates, 2) for k in range(num_rates)]

    def make(rate):
        return disagg_workload(rate, num_requests, cfg.vocab_size)
    return DisaggStudy(prof, f"modelled: {model} on {prof.name} (datasheet profile)", cfg, config, make,
                       rates, total)


def calibrated_study(model: DeviceModel, make_workload, rates: Sequence[float],
                     total: int = 2) -> DisaggStudy:
    """A study on this device's calibrated cost model (modelled, fitted to a measured run)."""
    config = replace(model.config, num_kv_blocks=model.num_kv_blocks)
    return DisaggStudy(model.cost_model, model.label, model.model_config, config, make_workload,
                       list(rates), total, model.result.dtype)


def layout_table(study: DisaggStudy, num_prefill: int, link_bandwidth: float,
                 rate_index: int = 0) -> Table:
    """Latency percentiles of the colocated and the disaggregated layout at one of the study's
    rates (modelled)."""
    from nanoserve.measure.metrics import compute_metrics
    layouts = {f"colocated x{study.total}": study.colocated()[rate_index],
               f"{num_prefill}P:{study.total - num_prefill}D over {link_bandwidth / 1e9:g} GB/s":
               study.disaggregated(num_prefill, link_bandwidth)[rate_index]}
    rows = []
    for name, res in layouts.items():
        m = compute_metrics(res.outputs)
        rows.append({"layout": name, "TTFT p50 (ms)": to_ms(m.ttft.median),
                     "TTFT p90 (ms)": to_ms(m.ttft.p90),
                     "TPOT p50 (ms)": to_ms(m.tpot.median), "ITL p50 (ms)": to_ms(m.itl.median),
                     "ITL p99 (ms)": to_ms(m.itl.p99), "requests/s": m.request_throughput})
    return Table(rows, f"{study.rates[rate_index]:.3g} requests/s offered, {study.label}", ".1f")
