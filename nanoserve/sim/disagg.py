"""Several simulated instances on one clock: colocated serving versus prefill/decode disaggregation.

Each instance is a whole engine (its own Scheduler, KV cache and cost model) from
sim.sim_engine, on its own SimClock; a discrete-event loop keeps them in step. It always
does the earliest thing next: deliver an event (a request arriving, a KV transfer landing)
or run one step of the instance that can step earliest. An instance's clock only moves
forward, so work that reaches a busy instance waits for its current step to end, as on a
real device.

Colocated: every instance prefills and decodes; a new request goes to the least loaded one
(fewest unfinished requests, the lowest index on a tie).

Disaggregated (as in DistServe and Splitwise): P prefill instances run each request with
max_tokens=1. Its first token ends the prefill; the prompt's KV then crosses the link
(prompt tokens * KV bytes per token / link bandwidth; one prefill instance's transfers go out
one after another) and lands on the least loaded of D decode instances. There the request
is added as prompt + first token with max_tokens - 1 and `SimExecutor.kv_present` marks its
prompt as transferred: the decode engine allocates blocks for the whole context, as a real
one must to receive the KV, but computes only the first token's position, so its admission
step costs one decode. Decode instances get a token budget that admits any transferred
prompt in one step (its tokens are not computed, so the budget does not apply to them).
The user sees the first token when the transfer lands, so TTFT includes the transfer; the
merged output's ITLs are the decode instance's. Left out: overlapping the transfer with the
prefill layer by layer, and link latency.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Callable

from nanoserve.config import EngineConfig, ModelConfig
from nanoserve.engine import LLMEngine
from nanoserve.engine.kv_cache import kv_bytes_per_token
from nanoserve.measure.metrics import ServingMetrics, compute_metrics
from nanoserve.measure.slo import parse_slo
from nanoserve.measure.workload import Workload
from nanoserve.outputs import RequestMetrics, RequestOutput
from nanoserve.sim.devices import DeviceProfile, Link
from nanoserve.sim.simulator import CostModel, SimResult, sim_engine


class Cluster:
    """Instances on a shared simulated timeline, fed by an event queue."""

    def __init__(self, engines: dict[str, LLMEngine]):
        self.engines = engines
        self.events: list = []  # (time, seq, callback(time))
        self._seq = itertools.count()

    def at(self, t: float, callback: Callable[[float], None]) -> None:
        heapq.heappush(self.events, (t, next(self._seq), callback))

    @staticmethod
    def ready_time(engine: LLMEngine) -> float:
        """When this instance can next step (inf: nothing to do)."""
        s = engine.scheduler
        if s.running:
            return engine.clock.now
        if s.waiting:
            return max(engine.clock.now, s.waiting[0].metrics.arrival_time)
        return math.inf

    def run(self, on_finished: Callable[[str, RequestOutput], None]) -> None:
        while True:
            name, t_step = min(((n, self.ready_time(e)) for n, e in self.engines.items()),
                               key=lambda p: p[1])
            t_event = self.events[0][0] if self.events else math.inf
            if t_event == math.inf and t_step == math.inf:
                return
            if t_event <= t_step:
                t, _, callback = heapq.heappop(self.events)
                callback(t)
                continue
            engine = self.engines[name]
            engine.clock.advance_to(t_step)
            for o in engine.step():
                if o.finished:
                    on_finished(name, o)


def least_loaded(engines: list[LLMEngine]) -> LLMEngine:
    return min(engines, key=lambda e: len(e.scheduler.running) + len(e.scheduler.waiting))


def simulate_colocated(workload: Workload, model_config: ModelConfig, device: DeviceProfile | CostModel,
                       num_instances: int = 1, config: EngineConfig | None = None,
                       dtype: str = "bfloat16") -> SimResult:
    """num_instances identical engines, each serving whole requests."""
    t0 = time.perf_counter()
    engines = {f"instance{i}": sim_engine(model_config, device, config, dtype, seed=i)
               for i in range(num_instances)}
    cluster, final = Cluster(engines), {}
    for i, r in enumerate(workload.requests):
        cluster.at(r.arrival_time, lambda t, i=i, r=r: least_loaded(list(engines.values()))
                   .add_request(r.prompt_token_ids, r.params, t, str(i)))
    cluster.run(lambda name, o: final.__setitem__(o.request_id, o))
    return _result(workload, final, engines, t0, f"colocated x{num_instances}")


def simulate_disaggregated(workload: Workload, model_config: ModelConfig, device: DeviceProfile | CostModel,
                           num_prefill: int = 1, num_decode: int = 1, link: Link | None = None,
                           config: EngineConfig | None = None,
                           dtype: str = "bfloat16") -> SimResult:
    """num_prefill prefill instances hand each request's KV over `link` to num_decode decode
    instances (see the module docstring for how a handed-off request is admitted)."""
    if link is None:
        raise ValueError("simulate_disaggregated needs a link (e.g. nanoserve.sim.LINKS['ib400'])")
    t0 = time.perf_counter()
    config = config or EngineConfig()
    decode_config = replace(config, max_num_batched_tokens=max(
        config.max_num_batched_tokens, model_config.max_position_embeddings + config.max_num_seqs))
    prefill = {f"prefill{i}": sim_engine(model_config, device, config, dtype, seed=i)
               for i in range(num_prefill)}
    decode = {f"decode{i}": sim_engine(model_config, device, decode_config, dtype,
                                       seed=num_prefill + i) for i in range(num_decode)}
    cluster = Cluster({**prefill, **decode})
    # what the link carries: the cache's bytes (an fp8 cache hands over half of bf16's)
    kv_per_token = kv_bytes_per_token(model_config, next(iter(decode.values())).kv_cache_dtype)
    link_free = dict.fromkeys(prefill, 0.0)  # when each prefill instance's link is idle
    originals, firsts, final = {}, {}, {}

    def arrive(t, i, r):
        originals[str(i)] = r
        least_loaded(list(prefill.values())).add_request(
            r.prompt_token_ids, replace(r.params, max_tokens=1), t, str(i))

    def hand_off(t, o: RequestOutput):
        r = originals[o.request_id]
        engine = least_loaded(list(decode.values()))
        engine.executor.kv_present[o.request_id] = len(o.prompt_token_ids)
        engine.add_request(o.prompt_token_ids + o.token_ids,
                           replace(r.params, max_tokens=r.params.max_tokens - 1), t, o.request_id)

    def finished(name, o: RequestOutput):
        r = originals[o.request_id]
        if name in decode:
            decode[name].executor.kv_present.pop(o.request_id)
            final[o.request_id] = _merge(firsts.pop(o.request_id), o)
        elif r.params.max_tokens == 1:  # nothing left to decode: the prefill output is final
            final[o.request_id] = o
        else:
            start = max(o.metrics.finished_time, link_free[name])
            link_free[name] = start + len(o.prompt_token_ids) * kv_per_token / link.bandwidth
            firsts[o.request_id] = o
            cluster.at(link_free[name], lambda t, o=o: hand_off(t, o))

    for i, r in enumerate(workload.requests):
        cluster.at(r.arrival_time, lambda t, i=i, r=r: arrive(t, i, r))
    cluster.run(finished)
    return _result(workload, final, cluster.engines, t0,
                   f"disaggregated {num_prefill}P{num_decode}D over {link.name}")


def _merge(first: RequestOutput, rest: RequestOutput) -> RequestOutput:
    """One request's output from its prefill part (first token) and decode part (the rest).
    The first token reaches the user when its KV lands on the decode instance."""
    landed = rest.metrics.arrival_time
    metrics = RequestMetrics(first.metrics.arrival_time, first.metrics.first_scheduled_time,
                             landed, [landed, *rest.metrics.token_times], rest.metrics.finished_time)
    return replace(rest, prompt_token_ids=first.prompt_token_ids,
                   token_ids=first.token_ids + rest.token_ids, metrics=metrics,
                   num_cached_tokens=first.num_cached_tokens, new_token_ids=[])


def _result(workload, final, engines, t0, layout) -> SimResult:
    outputs = [final[str(i)] for i in range(len(workload))]
    cost_model = next(iter(engines.values())).executor.cost_model
    return SimResult(outputs, {n: e.trace for n, e in engines.items()}, time.perf_counter() - t0,
                     cost_model, f"{workload.name}, {layout}, {cost_model.label} (modelled)")


@dataclass
class SweepPoint:
    rate: float  # requests / s offered
    layout: str  # "colocated" or "disaggregated"
    goodput: float  # requests / s within the SLO
    slo_attainment: float
    metrics: ServingMetrics


def goodput_sweep(rates, make_workload: Callable[[float], Workload], model_config: ModelConfig,
                  device: DeviceProfile | CostModel, slo: str | dict, num_prefill: int = 1,
                  num_decode: int = 1, link: Link | None = None,
                  config: EngineConfig | None = None, dtype: str = "bfloat16") -> list[SweepPoint]:
    """Goodput of P+D colocated instances and of P prefill + D decode instances as the
    arrival rate grows; make_workload(rate) builds the workload at each rate."""
    slo, points = parse_slo(slo), []
    for rate in rates:
        w = make_workload(rate)
        runs = {"colocated": simulate_colocated(w, model_config, device, num_prefill + num_decode,
                                                config, dtype),
                "disaggregated": simulate_disaggregated(w, model_config, device, num_prefill,
                                                        num_decode, link, config, dtype)}
        for layout, res in runs.items():
            m = compute_metrics(res.outputs, slo=slo)
            points.append(SweepPoint(rate, layout, m.goodput, m.slo_attainment, m))
    return points
