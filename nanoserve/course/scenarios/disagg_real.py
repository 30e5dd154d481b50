"""Lesson 09 for real, on this machine: lesson 05's interference workload (decoders streaming from
t=0, long prompts arriving among them) served over HTTP by one `nanoserve serve` engine on every
CPU (colocated), then by a prefill instance + decode instance + router (serve/disagg.Deployment:
half the CPUs each, one CPU each on a 2-core machine), both measured by the same client
(measure/loadgen.py); what the KV transfer costs against the simulator's link model
(measure/kv_transfer.py); and the simulator's prediction of both runs, on cost models calibrated
here at each instance's thread count.

Every engine (the colocated one, both instances, the simulated ones) runs one EngineConfig: the
in-process engine's block size and token budget, no prefix cache (random prompts: nothing to
hit), a KV cache sized for the workload. Before measuring, one short and one long request warm
each layout up (first-touch allocation, the router's connections). Servers are always stopped.
Deliberately left out: more than one instance per role, and a GPU transport (the CUDA IPC path
of engine/kv_transport.py runs where a GPU is lent).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch

from nanoserve.config import EngineConfig
from nanoserve.course.scenarios.common import round_up, to_ms
from nanoserve.course.scenarios.interference import InterferenceSetup, interference_setup
from nanoserve.course.scenarios.serving import DeviceModel, calibrate_device
from nanoserve.course.setup import Table, engine_of
from nanoserve.measure import loadgen
from nanoserve.measure.ceilings import dtype_name
from nanoserve.measure.datasets import LoadRequest, from_workload
from nanoserve.measure.kv_transfer import TransferFit, TransferPoint, fit_transfer, measure_transfers
from nanoserve.measure.metrics import completed, compute_metrics, itls, ttft
from nanoserve.measure.workload import Workload
from nanoserve.serve.disagg import Deployment, split_cpus
from nanoserve.serve.launch import ServerProcess


@dataclass
class RealSetup:
    """What both layouts serve, and how: the workload, the engine flags, the SLO, the CPUs."""

    model: str  # what the servers load ("preset:tiny", a checkpoint folder)
    dtype: str
    device: str  # "cpu" or "cuda"
    config: EngineConfig  # every engine's, real or simulated
    interference: InterferenceSetup  # lesson 05's workload, timed from probes in this process
    slo: dict  # {"itl_p99": s}: the request goodput's limit
    cpus: list[int]  # the colocated engine's; the deployment gives half to each instance

    @property
    def requests(self) -> list[LoadRequest]:
        return from_workload(self.interference.workload)

    @property
    def instance_cpus(self) -> tuple[str | None, str | None]:
        return split_cpus(self.cpus) if self.device == "cpu" else (None, None)

    def threads(self) -> tuple[int, int]:
        """torch threads of (the colocated engine, each instance)."""
        half = self.instance_cpus[0]
        return len(self.cpus), len(half.split(",")) if half else len(self.cpus)

    def server_args(self) -> list[str]:
        c = self.config
        return [self.model, "--dtype", self.dtype, "--device", self.device, "--seed", "0",
                "--block-size", str(c.block_size), "--num-kv-blocks", str(c.num_kv_blocks),
                "--max-num-seqs", str(c.max_num_seqs), "--max-num-batched-tokens",
                str(c.max_num_batched_tokens), "--no-enable-prefix-caching",
                "--uvicorn-log-level", "warning"]


def real_setup(llm, model: str, num_decoders: int, long_prompt_len: int, num_long: int,
               itl_factor: float = 3.0, seed: int = 0) -> RealSetup:
    """Lesson 05's workload (interference_setup, its probes timed at an instance's thread count)
    at the in-process engine's token budget, and an ITL SLO of `itl_factor` x the decoders' step
    measured so: a plain decode step meets it, a step that carries a long prefill chunk does not."""
    engine = engine_of(llm)
    budget = engine.config.max_num_batched_tokens
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    half = split_cpus(cpus)[0]
    with _threads(len(half.split(",")) if half else torch.get_num_threads()):
        inter = _settled(interference_setup(engine, num_decoders, long_prompt_len, num_long,
                                            min_budget=budget, seed=seed))
    bs = engine.config.block_size
    blocks = sum(-(-(len(r.prompt_token_ids) + r.params.max_tokens) // bs) for r in inter.workload)
    config = EngineConfig(block_size=bs, num_kv_blocks=blocks + 16, enable_prefix_caching=False,
                          max_num_batched_tokens=budget, max_num_seqs=max(len(inter.workload), 2))
    return RealSetup(model, dtype_name(engine.dtype), torch.device(engine.device).type, config, inter,
                     {"itl_p99": round_up(itl_factor * inter.decode_step)}, cpus)


def _settled(inter: InterferenceSetup) -> InterferenceSetup:
    """Long prompts one long prefill later than in lesson 05, decoders as many steps longer: over
    HTTP, and disaggregated through a hand-off, decoders take longer to be streaming."""
    lead, reqs = inter.long_prefill, inter.workload.requests
    more = math.ceil(lead / inter.decode_step)
    reqs = [replace(r, params=replace(r.params, max_tokens=r.params.max_tokens + more))
            for r in reqs[:inter.num_decoders]] + \
        [replace(r, arrival_time=r.arrival_time + lead) for r in reqs[inter.num_decoders:]]
    desc = (f"{inter.workload.description}; long prompts {to_ms(lead):.0f} ms later, decoders {more} "
            "tokens longer")
    return replace(inter, workload=Workload(inter.workload.name, desc, reqs))


@dataclass
class LayoutRun:
    """One layout's measured run: loadgen's result and, disaggregated, the KV transfers the two
    instances counted (their /metrics: count, bytes, seconds, failures per direction)."""

    layout: str
    result: loadgen.LoadResult
    num_decoders: int  # requests [0, num_decoders) are the decoders, the rest the long prompts
    transfers: dict | None = None

    @property
    def outputs(self) -> list:
        return self.result.outputs


def _metric_counters(url: str) -> dict:
    """nanoserve:kv_transfer_* counters of one instance: {(name, direction): value}."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return {(s.name.removeprefix("nanoserve:kv_transfer_").removesuffix("_total"),
             s.labels["direction"]): s.value
            for fam in text_string_to_metric_families(text) if fam.name.startswith("nanoserve:kv_transfer")
            for s in fam.samples if s.name.endswith("_total")}


def _transfers(dep: Deployment) -> dict:
    """Saves as the prefill instance counted them, loads as the decode instance did."""
    saves, loads = _metric_counters(dep.prefill.base_url), _metric_counters(dep.decode.base_url)
    return {k: (saves if k[1] == "save" else loads)[k] for k in saves}


def _load(url: str, setup: RealSetup, requests: list[LoadRequest]) -> loadgen.LoadResult:
    target = loadgen.Target(url, setup.model, ignore_eos=True)
    return loadgen.run_sync(loadgen.run(target, requests, progress=False))


def _warm_up(url: str, setup: RealSetup) -> None:
    """One short and one long request, one at a time, through everything the run will use."""
    reqs = setup.requests
    _load(url, setup, [replace(r, max_tokens=2, arrival_time=0.0) for r in (reqs[0], reqs[-1])])


@contextmanager
def colocated_server(setup: RealSetup):
    """One `nanoserve serve` on every CPU of `setup` (stopped on exit)."""
    pin = ["--cpu-omp-threads-bind", ",".join(map(str, setup.cpus))] \
        if setup.device == "cpu" and setup.cpus else []
    with ServerProcess(None, *setup.server_args(), *pin, startup_timeout=600) as srv:
        yield srv


def _thread_count(n: int) -> str:
    return f"{n} thread{'' if n == 1 else 's'}"


def run_colocated(setup: RealSetup) -> LayoutRun:
    with colocated_server(setup) as srv:
        _warm_up(srv.base_url, setup)
        res = _load(srv.base_url, setup, setup.requests)
    return LayoutRun(f"colocated, {_thread_count(setup.threads()[0])}", res, setup.interference.num_decoders)


def run_disaggregated(setup: RealSetup) -> LayoutRun:
    with Deployment(setup.server_args(), cpus=setup.instance_cpus, startup_timeout=600) as dep:
        _warm_up(dep.base_url, setup)
        before = _transfers(dep)
        res = _load(dep.base_url, setup, setup.requests)
        after = _transfers(dep)
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    return LayoutRun(f"disaggregated 1P:1D, {_thread_count(setup.threads()[1])} each", res,
                     setup.interference.num_decoders, moved)


def run_layouts(setup: RealSetup) -> dict[str, LayoutRun]:
    """{"colocated": ..., "disaggregated": ...}, run one after the other (never at once: they
    would share the CPUs)."""
    return {"colocated": run_colocated(setup), "disaggregated": run_disaggregated(setup)}


def layout_row(name: str, outputs, num_decoders: int, slo: dict) -> dict:
    """Decoders' ITL (p50, p99, max), long prompts' TTFT (median, p99) and request goodput at
    the SLO, for a measured or a simulated run (outputs in the workload's order)."""
    decs, longs = outputs[:num_decoders], outputs[num_decoders:]
    gaps = np.asarray([g for o in decs if completed(o) for g in itls(o)] or [math.nan])
    firsts = np.asarray([ttft(o) for o in longs if completed(o)] or [math.nan])
    m = compute_metrics(outputs, slo=slo)
    return {"layout": name, "decoder ITL p50 (ms)": to_ms(np.median(gaps)),
            "decoder ITL p99 (ms)": to_ms(np.percentile(gaps, 99)), "decoder ITL max (ms)": to_ms(gaps.max()),
            "long TTFT median (ms)": to_ms(np.median(firsts)),
            "long TTFT p99 (ms)": to_ms(np.percentile(firsts, 99)),
            "goodput (req/s)": m.goodput, "within SLO": f"{m.good_requests}/{len(outputs)}"}


def _slo_text(slo: dict) -> str:
    return ", ".join(f"{k} <= {to_ms(v):g} ms" for k, v in slo.items())


def layout_table(runs: dict[str, LayoutRun], setup: RealSetup) -> Table:
    rows = [layout_row(r.layout, r.outputs, r.num_decoders, setup.slo) for r in runs.values()]
    return Table(rows, f"measured over HTTP, {setup.model} {setup.dtype} on {setup.device}; "
                       f"goodput at {_slo_text(setup.slo)}", ".1f")


def transfer_lengths(long_prompt_len: int, block_size: int) -> tuple[int, ...]:
    """One block, then x4 each time, up to the long prompt."""
    lens = [block_size]
    while lens[-1] * 4 < long_prompt_len:
        lens.append(lens[-1] * 4)
    return (*lens, long_prompt_len)


def measure_transfer(llm, setup: RealSetup, reps: int = 5) -> tuple[list[TransferPoint], TransferFit]:
    """The shared-memory transfer of prompts up to the long prompt's length, timed in this
    process (measure/kv_transfer.py), and its fit latency + bytes / bandwidth."""
    points = measure_transfers(engine_of(llm), transfer_lengths(
        setup.interference.long_prompt_len, setup.config.block_size), reps)
    return points, fit_transfer(points)


def transfer_table(points: list[TransferPoint], fit: TransferFit, run: LayoutRun | None = None) -> Table:
    """Per prompt length: bytes, save and load time, per block, GB/s, the fit and the simulator's
    link model (bytes / the fitted bandwidth: no latency term) with its error; and, given the
    disaggregated run, what its transfers cost per request in the deployment."""
    rows = []
    for p in points:
        link = p.nbytes / fit.bandwidth
        rows.append({"prompt tokens": p.num_tokens, "blocks": p.num_blocks, "KV (KB)": p.nbytes / 1e3,
                     "save (ms)": to_ms(p.save), "load (ms)": to_ms(p.load), "total (ms)": to_ms(p.total),
                     "per block (ms)": to_ms(p.per_block), "GB/s": p.bandwidth / 1e9,
                     "fit (ms)": to_ms(fit.predict(p.nbytes)), "link model (ms)": to_ms(link),
                     "link model error (%)": 100 * (link - p.total) / p.total})
    if run is not None and run.transfers and run.transfers.get(("count", "load")):
        t, n = run.transfers, run.transfers[("count", "load")]
        seconds = t[("seconds", "save")] + t[("seconds", "load")]
        rows.append({"prompt tokens": "deployment, per request", "KV (KB)": t[("bytes", "load")] / n / 1e3,
                     "save (ms)": to_ms(t[("seconds", "save")] / n),
                     "load (ms)": to_ms(t[("seconds", "load")] / n), "total (ms)": to_ms(seconds / n),
                     "GB/s": t[("bytes", "load")] / seconds / 1e9})
    return Table(rows, f"KV transfer through shared memory (measured); fit: {to_ms(fit.latency):.2f} ms + "
                       f"bytes / {fit.bandwidth / 1e9:.3g} GB/s", ".3g")


@contextmanager
def _threads(n: int):
    """torch on n threads inside the block (as an instance pinned to n CPUs), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def calibrate_threads(llm, threads: int, num_requests: int, input_median: int,
                      output_median: int) -> DeviceModel:
    """calibrate_device on `threads` threads: the cost model of an instance pinned to that many CPUs."""
    with _threads(threads):
        return calibrate_device(llm, num_requests, input_median, output_median, progress=False)


def predict_layouts(llm, setup: RealSetup, fit: TransferFit, num_requests: int, input_median: int,
                    output_median: int, calibrated: DeviceModel | None = None) -> dict:
    """The simulator's prediction of both runs: each layout on a cost model calibrated here at
    its instances' thread count (calibrate_device's run at these sizes), the disaggregated one
    over a link of the measured transfer bandwidth. `calibrated`: a calibrate_device result the
    caller already has, taken at this process's current thread count (not calibrated again).
    -> {"colocated": SimResult, "disaggregated": ...}."""
    from nanoserve.sim.devices import Link
    from nanoserve.sim.disagg import simulate_colocated, simulate_disaggregated
    models = {} if calibrated is None else {torch.get_num_threads(): calibrated}
    for n in sorted(set(setup.threads()) - set(models)):
        models[n] = calibrate_threads(llm, n, num_requests, input_median, output_median)
    colo, inst = (models[n] for n in setup.threads())
    w, link = setup.interference.workload, Link("shared memory", fit.bandwidth, "measured here")
    return {"colocated": simulate_colocated(w, colo.model_config, colo.cost_model, 1, setup.config,
                                            setup.dtype),
            "disaggregated": simulate_disaggregated(w, inst.model_config, inst.cost_model, 1, 1,
                                                          link, setup.config, setup.dtype)}


def prediction_table(runs: dict[str, LayoutRun], predicted: dict, setup: RealSetup) -> Table:
    """Measured and modelled rows of each layout, side by side."""
    n, rows = setup.interference.num_decoders, []
    for name, run in runs.items():
        rows.append(layout_row(f"{run.layout} (measured)", run.outputs, n, setup.slo))
        rows.append(layout_row(f"{run.layout} (modelled)", predicted[name].outputs, n, setup.slo))
    return Table(rows, f"the simulator's prediction next to the measurement; goodput at "
                       f"{_slo_text(setup.slo)}", ".1f")
