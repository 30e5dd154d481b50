"""The simulator: the engine's own scheduler and KV cache manager, a cost model instead of a model.

`simulate` builds a real LLMEngine whose executor is a `SimExecutor` and whose clock is a
`SimClock`. Each step the real Scheduler decides what runs (continuous batching, chunked
prefill, prefix caching, preemption: nothing is re-implemented here); the executor counts
the step's FLOPs and bytes with roofline.step_cost, advances the clock by the cost model's
step time and returns a placeholder token for every sequence that samples. Output lengths
come from max_tokens (workloads set ignore_eos), so the RequestOutputs, the step trace and
every metric are the same objects a real run produces. `drive` runs the same loop against
the real clock and a real model (bench.replay): that is how the simulator is validated.

The cost model is a roofline with overheads:

    step_time = overhead + per_seq * num_seqs + combine(bytes * s_byte, flops * s_flop
                                                        + attention_flops * s_attn)

with combine = max for datasheet devices (a step is bound by the slower of reading memory and
computing; the roofline) and sum for a model `calibrate` fits to a measured trace (least
squares needs a linear model, and on a CPU memory traffic and arithmetic barely overlap).
Bytes are every weight once per step, the KV of each sequence's context, and activations.
`calibrate` fits the coefficients to a real run's trace and keeps its residuals, so a
calibrated simulation also carries the measured machine's step-to-step noise.
Everything a simulation prints is modelled: label it so. Left out: the time the host spends
between steps beyond a calibrated constant, overlap of one step's host work with the
previous step's kernels, and anything the placeholder tokens change (stop strings, EOS).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from nanoserve.config import EngineConfig, ModelConfig
from nanoserve.engine import LLMEngine, StepRecord
from nanoserve.metrics import ServingMetrics, compute_metrics
from nanoserve.outputs import RequestOutput
from nanoserve.roofline import StepCost, dtype_bytes, step_cost
from nanoserve.scheduler import SchedulerOutput
from nanoserve.sim_devices import DeviceProfile, num_kv_blocks
from nanoserve.workload import Workload


@dataclass
class CostModel:
    """Seconds per step from a StepCost; coefficients are seconds per unit (0: free)."""

    overhead: float  # per step: scheduling, input preparation, launches, sampling
    per_seq: float  # per scheduled sequence
    s_byte: float  # per byte moved (1 / effective bandwidth)
    s_flop: float  # per FLOP of the linear layers and lm_head (1 / effective FLOP/s)
    s_attn: float  # per FLOP of attention
    combine: str = "max"  # "max" (roofline) or "sum" (fitted)
    dtype: str = "bfloat16"
    label: str = ""  # where the numbers come from
    # measured noise (calibrate): each simulated step adds a residual (seconds) drawn at random
    # from those of its kind, "decode" (decode-only steps) or "prefill" (any prefill token),
    # but never runs faster than min_ratio of its modelled time. Empty: no noise.
    residuals: dict[str, tuple[float, ...]] = field(default_factory=dict, repr=False)
    min_ratio: float = 0.0

    def __post_init__(self):
        if self.combine not in ("max", "sum"):
            raise ValueError(f"combine={self.combine!r} must be 'max' or 'sum'")
        for name in ("overhead", "per_seq", "s_byte", "s_flop", "s_attn"):
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name}={getattr(self, name)!r} must be >= 0")

    @classmethod
    def from_profile(cls, p: DeviceProfile, dtype: str = "bfloat16") -> CostModel:
        s_flop = 1 / (p.peak_flops * p.flops_fraction)
        return cls(p.step_overhead, p.seq_overhead, 1 / (p.bandwidth * p.bandwidth_fraction),
                   s_flop, s_flop, "max", dtype, f"{p.name}, {p.source}")

    def step_time(self, cost: StepCost, num_seqs: int) -> float:
        memory = cost.total_bytes * self.s_byte
        compute = (cost.flops["linear"] + cost.flops["lm_head"]) * self.s_flop \
            + cost.flops["attention"] * self.s_attn
        busy = max(memory, compute) if self.combine == "max" else memory + compute
        return self.overhead + self.per_seq * num_seqs + busy

    def describe(self) -> str:
        def rate(s, unit, scale):
            return f"{1 / s / scale:.3g} {unit}" if s > 0 else "free"
        op = "max" if self.combine == "max" else "sum"
        return (f"{self.overhead * 1e3:.3f} ms + {self.per_seq * 1e6:.1f} us/seq + {op}(bytes at "
                f"{rate(self.s_byte, 'GB/s', 1e9)}, FLOPs at {rate(self.s_flop, 'TFLOP/s', 1e12)}, "
                f"attention at {rate(self.s_attn, 'TFLOP/s', 1e12)})  [{self.label}]")


class SimClock:
    """A clock that moves only when told: the executor advances it by each step's time."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class SimExecutor:
    """Stands in for the ModelRunner: SchedulerOutput -> {request_id: token}, time passes.

    `kv_present[request_id] = n` says the first n tokens' KV arrived by transfer (a
    disaggregated decode instance): they occupy blocks and are read as context, but cost
    nothing to compute, unless the request is preempted and must recompute them.
    """

    def __init__(self, model_config: ModelConfig, cost_model: CostModel, clock: SimClock,
                 seed: int = 0):
        self.cfg, self.cost_model, self.clock = model_config, cost_model, clock
        self.rng = random.Random(seed)  # draws the cost model's residuals
        self.dtype_bytes = dtype_bytes(cost_model.dtype)
        self.kv_present: dict[str, int] = {}
        # a placeholder for every sampled token; never EOS, so lengths are max_tokens
        self.token = next(t for t in itertools.count(1) if t not in model_config.eos_token_ids)

    def batch(self, out: SchedulerOutput) -> list[tuple[int, int, bool]]:
        """(tokens computed, context length, samples) per sequence, as step_cost takes it."""
        batch = []
        for s, req in zip(out.seqs, out.requests):
            ctx = s.start + len(s.token_ids)
            present = 0 if req.num_preemptions else self.kv_present.get(s.request_id, 0)
            q = ctx - max(s.start, present)
            if q > 0:
                batch.append((q, ctx, s.sample))
        return batch

    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        batch = self.batch(out)
        cm = self.cost_model
        t = cm.step_time(step_cost(self.cfg, batch, self.dtype_bytes), len(batch))
        if cm.residuals:
            noise = cm.residuals["prefill" if out.num_prefill_tokens else "decode"]
            t = max(t + self.rng.choice(noise), t * cm.min_ratio)
        self.clock.now += t
        return {s.request_id: self.token for s in out.seqs if s.sample}


@dataclass
class SimResult:
    outputs: list[RequestOutput]  # one per workload request, in workload order
    traces: dict[str, list[StepRecord]]  # per instance name
    wall_time: float  # seconds of real time the simulation took
    cost_model: CostModel
    description: str = ""

    @property
    def trace(self) -> list[StepRecord]:
        """Every instance's steps, by start time."""
        return sorted(itertools.chain(*self.traces.values()), key=lambda s: s.start)

    @property
    def requests_per_second(self) -> float:
        """Simulator speed: simulated requests per second of wall time."""
        return len(self.outputs) / self.wall_time if self.wall_time > 0 else float("inf")

    def metrics(self, slo: str | dict | None = None) -> ServingMetrics:
        return compute_metrics(self.outputs, slo=slo)


def drive(engine: LLMEngine, workload: Workload, wait_until: Callable[[float], None],
          start: float = 0.0) -> list[RequestOutput]:
    """Submit each request when the engine's clock reaches start + its arrival time (request id:
    its index in the workload), step until all finish, wait for the next arrival when idle.
    -> final outputs in workload order. The same loop serves the real and the simulated clock."""
    reqs = workload.requests
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time)
    final: dict[str, RequestOutput] = {}
    k = 0
    while k < len(order) or engine.has_unfinished():
        now = engine.clock()
        while k < len(order) and start + reqs[order[k]].arrival_time <= now:
            r = reqs[order[k]]
            engine.add_request(r.prompt_token_ids, r.params, start + r.arrival_time, str(order[k]))
            k += 1
        if not engine.has_unfinished():
            wait_until(start + reqs[order[k]].arrival_time)
            continue
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    return [final[str(i)] for i in range(len(reqs))]


def sim_engine(model_config: ModelConfig, device: DeviceProfile | CostModel,
               config: EngineConfig | None = None, dtype: str = "bfloat16",
               memory_utilization: float = 0.9, seed: int = 0) -> LLMEngine:
    """An LLMEngine on a SimClock with a SimExecutor. KV blocks: config.num_kv_blocks, else
    sized from the profile's memory (a bare CostModel has no memory: pass num_kv_blocks)."""
    config = config or EngineConfig()
    if isinstance(device, DeviceProfile):
        cost_model = CostModel.from_profile(device, dtype)
        if config.num_kv_blocks is None:
            config = replace(config, num_kv_blocks=num_kv_blocks(
                device, model_config, dtype, config.block_size, memory_utilization))
    else:
        cost_model = device
        if config.num_kv_blocks is None:
            raise ValueError("simulating a bare CostModel needs EngineConfig.num_kv_blocks "
                             "(or pass a DeviceProfile, whose memory sizes the cache)")
    clock = SimClock()
    return LLMEngine(model_config=model_config, config=config, clock=clock,
                     executor=SimExecutor(model_config, cost_model, clock, seed))


def simulate(workload: Workload, model_config: ModelConfig, device: DeviceProfile | CostModel,
             config: EngineConfig | None = None, dtype: str = "bfloat16",
             memory_utilization: float = 0.9, seed: int = 0) -> SimResult:
    """One engine instance serving `workload` on a modelled device. -> SimResult."""
    t0 = time.perf_counter()
    engine = sim_engine(model_config, device, config, dtype, memory_utilization, seed)
    outputs = drive(engine, workload, engine.clock.advance_to)
    cost_model = engine.executor.cost_model
    return SimResult(outputs, {"engine": engine.trace}, time.perf_counter() - t0, cost_model,
                     f"{workload.name} on {cost_model.label} (modelled)")


# --- Calibration: fit a CostModel to a measured trace ---

def trace_batches(trace: Sequence[StepRecord], outputs: Sequence[RequestOutput] = ()
                  ) -> list[list[tuple[int, int, bool]]]:
    """Each step's (tokens, context, samples) per sequence, rebuilt from the trace's entries.

    A request's computed tokens are counted up step by step, starting from its prefix-cache
    hits (outputs' num_cached_tokens) and from 0 after a preemption. A prefill chunk samples
    when it reaches the end of the prompt (prompt lengths from outputs; without them every
    chunk is taken to sample, over-counting lm_head for chunked prompts).
    """
    known = {o.request_id: o for o in outputs}
    done: dict[str, int] = {}
    batches = []
    for rec in trace:
        batch = []
        for rid, kind, n in rec.entries:
            o = known.get(rid)
            start = done.get(rid, o.num_cached_tokens if o is not None else 0)
            done[rid] = start + n
            sample = kind == "decode" or o is None or start + n >= len(o.prompt_token_ids)
            batch.append((n, start + n, sample))
        for rid in rec.preempted:
            done[rid] = 0
        batches.append(batch)
    return batches


@dataclass
class Calibration:
    cost_model: CostModel
    median_abs_rel_error: float  # of per-step times, fitted vs measured
    mape: float  # mean absolute percentage error, in percent
    host_gap: float  # median seconds between one step's end and the next one's start
    measured: np.ndarray = field(repr=False)  # seconds per step (duration + host_gap)
    predicted: np.ndarray = field(repr=False)

    def describe(self) -> str:
        return (f"calibrated on {len(self.measured)} steps: {self.cost_model.describe()}\n"
                f"fit error: median |rel| {100 * self.median_abs_rel_error:.1f}%, "
                f"MAPE {self.mape:.1f}%")


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares, exactly: with five unknowns every support set is tried."""
    best, best_res = np.zeros(a.shape[1]), float(b @ b)
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (x >= 0).all():
                res = float(((a[:, cols] @ x - b) ** 2).sum())
                if res < best_res:
                    best, best_res = np.zeros(a.shape[1]), res
                    best[list(cols)] = x
    return best


def calibrate(trace: Sequence[StepRecord], model_config: ModelConfig, dtype: str = "float32",
              outputs: Sequence[RequestOutput] = (), label: str = "calibrated") -> Calibration:
    """Fit a sum-form CostModel to a real run's trace. -> Calibration with the fit error.

    Each step's time is its duration plus the median gap between steps (host work the engine
    does outside a step: updating requests, building outputs; the simulator charges it per
    step). The fit minimises the absolute *relative* error (least squares reweighted towards
    least absolute deviation, coefficients kept >= 0): short decode steps count as much as
    long prefills, and the fit follows the typical step rather than the noise, which on a
    shared machine only ever slows steps down. The residuals (measured minus fitted seconds,
    kept apart for decode-only steps and steps with prefill, whose noise differs) stay with
    the model: the simulator adds one to each step, so its tails carry this machine's noise
    (replace(cost_model, residuals={}) for a noiseless model).
    """
    if len(trace) < 5:
        raise ValueError(f"calibrating needs at least 5 steps of trace, got {len(trace)}")
    db = dtype_bytes(dtype)
    gaps = [b.start - a.end for a, b in zip(trace, trace[1:])]
    host_gap = float(np.median(gaps)) if gaps else 0.0
    rows = []
    for batch in trace_batches(trace, outputs):
        c = step_cost(model_config, batch, db)
        rows.append([1.0, len(batch), c.total_bytes, c.flops["linear"] + c.flops["lm_head"],
                     c.flops["attention"]])
    x = np.asarray(rows)
    t = np.asarray([s.duration for s in trace]) + host_gap
    scale = x.max(axis=0)  # columns span 1 to 1e12: normalise before solving
    a, w = x / scale / t[:, None], np.ones(len(t))  # a @ coef = predicted / measured
    for _ in range(20):  # weights 1/sqrt|residual| turn squared error into absolute error
        coef = _nnls(a * w[:, None], w)
        w = 1 / np.sqrt(np.maximum(np.abs(a @ coef - 1), 1e-3))
    coef = coef / scale
    pred = x @ coef
    res = t - pred
    prefill = np.asarray([s.num_prefill_tokens > 0 for s in trace])
    # a kind the run never had borrows the other's residuals
    residuals = {k: tuple((res[m] if m.any() else res).tolist())
                 for k, m in (("prefill", prefill), ("decode", ~prefill))}
    cm = CostModel(*coef, combine="sum", dtype=dtype, label=label, residuals=residuals,
                   min_ratio=float((t / pred).min()))
    rel = np.abs(res) / t
    return Calibration(cm, float(np.median(rel)), float(100 * rel.mean()), host_gap, t, pred)
