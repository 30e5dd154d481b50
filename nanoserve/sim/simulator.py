"""The simulator: the engine's own scheduler and KV cache manager, a cost model instead of a model.

`simulate` builds a real LLMEngine whose executor is a `SimExecutor` and whose clock is a
`SimClock`. Each step the real Scheduler decides what runs (continuous batching, chunked
prefill, prefix caching, preemption: nothing is re-implemented here); the executor counts
the step's FLOPs and bytes with roofline.step_cost, advances the clock by the cost model's
step time and returns a placeholder token for every sequence that samples. Output lengths
come from max_tokens (workloads set ignore_eos), so the RequestOutputs, the step trace and
every metric are the same objects a real run produces. measure.bench.drive, the loop that
feeds a workload to an engine, runs both; on the real clock against a real model (bench.replay)
it gives the runs the simulator is validated against.

The cost model is a roofline with overheads:

    step_time = overhead + per_seq * num_seqs + combine(bytes * s_byte, flops * s_flop
                                                        + attention_flops * s_attn)

with combine = max for datasheet devices (a step is bound by the slower of reading memory and
computing; the roofline) and sum for a model `sim.calibrate` fits to a measured trace (least
squares needs a linear model, and on a CPU memory traffic and arithmetic barely overlap).
Bytes are every weight once per step, the KV of each sequence's context, and activations.
`calibrate` fits the coefficients to a real run's trace and keeps its residuals, so a
calibrated simulation also carries the measured machine's step-to-step noise.
Everything a simulation prints is modelled: label it so. Left out: the time the host spends
between steps beyond a calibrated constant, overlap of one step's host work with the
previous step's kernels, and anything the placeholder tokens change (stop strings, EOS).
"""

from __future__ import annotations

import bisect
import itertools
import random
import time
from dataclasses import dataclass, field, replace

from nanoserve.config import EngineConfig, ModelConfig
from nanoserve.engine import Executor, LLMEngine, SchedulerOutput, StepRecord
from nanoserve.engine.kv_cache import kv_cache_torch_dtype
from nanoserve.kernels.cpu_decode_layer import MAX_ROWS as FEW_ROWS  # the CPU backend's layers in one call
from nanoserve.measure.bench import drive
from nanoserve.measure.metrics import ServingMetrics, compute_metrics
from nanoserve.measure.roofline import StepCost, dtype_bytes, dtype_name, step_cost
from nanoserve.measure.workload import Workload
from nanoserve.outputs import RequestOutput
from nanoserve.sim.devices import DeviceProfile, num_kv_blocks

NEIGHBOURS = 16  # measured steps a simulated step draws its noise from
TIE = 1e-9  # modelled times this close (relative) are one time computed in a different order


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
    # measured noise (calibrate): (modelled seconds, residual seconds) of each measured step of
    # a kind (step_kind: "prefill", "few" or "decode"), by modelled time.
    # Each simulated step adds the residual of one of the NEIGHBOURS measured steps of its kind
    # nearest it in modelled time, but never runs faster than min_ratio of its modelled time.
    # Empty: no noise.
    residuals: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict, repr=False)
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

    def noisy_step_time(self, t: float, kind: str, rng: random.Random) -> float:
        """A modelled step time t plus a residual of a measured step like it. Near steps, not
        the whole run: the fit's error depends on a step's size, and a residual drawn from any
        step turns that error into variance, which lengthens the simulated queues."""
        steps = self.residuals[kind]
        # Steps the fit cannot tell apart (their features differ only in a term fitted as free)
        # share one modelled time, give or take rounding: draw from all of them, since a window
        # at one end of the tie would keep only its first or last few measured steps.
        lo = bisect.bisect_left(steps, t * (1 - TIE), key=lambda s: s[0])
        hi = bisect.bisect_right(steps, t * (1 + TIE), key=lambda s: s[0])
        if hi - lo < NEIGHBOURS:
            lo = max(0, min((lo + hi) // 2 - NEIGHBOURS // 2, len(steps) - NEIGHBOURS))
            hi = lo + NEIGHBOURS
        return max(t + rng.choice(steps[lo:hi])[1], t * self.min_ratio)

    def describe(self) -> str:
        def rate(s, unit, scale):
            return f"{1 / s / scale:.3g} {unit}" if s > 0 else "free"
        op = "max" if self.combine == "max" else "sum"
        return (f"{self.overhead * 1e3:.3f} ms + {self.per_seq * 1e6:.1f} us/seq + {op}(bytes at "
                f"{rate(self.s_byte, 'GB/s', 1e9)}, FLOPs at {rate(self.s_flop, 'TFLOP/s', 1e12)}, "
                f"attention at {rate(self.s_attn, 'TFLOP/s', 1e12)})  [{self.label}]")


def step_kind(num_prefill_tokens: int, num_seqs: int) -> str:
    """Which measured steps a step's noise comes from: "prefill" (any prefill token), "few" (a
    decode step of up to FEW_ROWS sequences, which the CPU backend runs in one call for the layers:
    kernels/cpu_decode_layer.py, a saving no cost feature sees) or "decode"."""
    return "prefill" if num_prefill_tokens else "few" if num_seqs <= FEW_ROWS else "decode"


class SimClock:
    """A clock that moves only when told: the executor advances it by each step's time."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class SimExecutor(Executor):
    """Stands in for the ModelRunner: SchedulerOutput -> {request_id: token}, time passes.

    `kv_present[request_id] = n` says the first n tokens' KV arrived by transfer (a
    disaggregated decode instance): they occupy blocks and are read as context, but cost
    nothing to compute, unless the request is preempted and must recompute them.
    kv_cache_dtype (EngineConfig's): an fp8 cache's attention reads one byte a K/V value.
    """

    def __init__(self, model_config: ModelConfig, cost_model: CostModel, clock: SimClock,
                 seed: int = 0, kv_cache_dtype: str = "auto"):
        self.model_config, self.cost_model, self.clock = model_config, cost_model, clock
        self.dtype = cost_model.dtype
        self.rng = random.Random(seed)  # draws the cost model's residuals
        self.dtype_bytes = dtype_bytes(cost_model.dtype)
        self.kv_cache_dtype = kv_cache_torch_dtype(kv_cache_dtype, dtype_name(cost_model.dtype))
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

    def execute_model(self, out: SchedulerOutput) -> dict[str, int]:
        batch = self.batch(out)
        cm = self.cost_model
        t = cm.step_time(step_cost(self.model_config, batch, self.dtype_bytes,
                                   self.kv_cache_dtype.itemsize), len(batch))
        if cm.residuals:
            t = cm.noisy_step_time(t, step_kind(out.num_prefill_tokens, len(batch)), self.rng)
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
                device, model_config, dtype, config.block_size, memory_utilization,
                config.kv_cache_dtype))
    else:
        cost_model = device
        if config.num_kv_blocks is None:
            raise ValueError("simulating a bare CostModel needs EngineConfig.num_kv_blocks "
                             "(or pass a DeviceProfile, whose memory sizes the cache)")
    clock = SimClock()
    return LLMEngine.from_executor(SimExecutor(model_config, cost_model, clock, seed,
                                               config.kv_cache_dtype), config, clock=clock)


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
