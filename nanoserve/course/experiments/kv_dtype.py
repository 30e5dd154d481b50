"""Lesson 13: what an fp8 KV cache buys, measured on this device: the same KV memory holds twice
the blocks of bf16 (capacity), so more requests run at once and fewer wait or are preempted
(goodput at a fixed SLO), while a decode step over it is no faster (attention dequantizes on read).

Every engine here gets the same `kv_cache_memory` bytes and differs only in
EngineConfig.kv_cache_dtype; blocks and batch sizes are the engines' own (num_kv_blocks), the
goodput and step times are replays on this machine (measure.bench.replay). The arrival rates are
this device's too: `load_sweep` first gives each engine every request at once, which measures the
requests/s it can serve, then offers Poisson arrivals at multiples of the first engine's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from nanoserve.config import EngineConfig
from nanoserve.course.table import Table
from nanoserve.engine.llm import LLM, engine_of
from nanoserve.measure.bench import replay
from nanoserve.measure.metrics import goodput
from nanoserve.measure.workload import synthetic
from nanoserve.sampling_params import SamplingParams

KV_DTYPES = ("auto", "fp8")


def kv_engine(model: str, dtype: str, kv_cache_dtype: str, kv_memory: int, **config) -> LLM:
    """An engine of `model` whose KV cache gets exactly kv_memory bytes, in kv_cache_dtype."""
    return LLM(model, None, dtype, config=EngineConfig(kv_cache_memory=kv_memory,
                                                        kv_cache_dtype=kv_cache_dtype, **config))


@dataclass
class CapacityRow:
    kv_cache_dtype: str
    cache_dtype: str  # what the tensors hold
    num_kv_blocks: int
    block_size: int
    max_batch: int  # requests of request_len tokens whose blocks fit at once

    @property
    def tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


def capacity(llm, request_len: int) -> CapacityRow:
    """The engine's blocks and how many requests of request_len tokens (prompt + output) they hold."""
    engine = engine_of(llm)
    bs = engine.config.block_size
    return CapacityRow(engine.config.kv_cache_dtype, str(engine.kv_cache_dtype).removeprefix("torch."),
                       engine.num_kv_blocks, bs, engine.num_kv_blocks // -(-request_len // bs))


def capacity_table(rows: list[CapacityRow], kv_memory: int, request_len: int) -> Table:
    base = rows[0]
    return Table([{"kv_cache_dtype": r.kv_cache_dtype, "stored as": r.cache_dtype,
                   "blocks": r.num_kv_blocks, "tokens": r.tokens,
                   f"max batch ({request_len} tokens each)": r.max_batch,
                   "blocks vs first": round(r.num_kv_blocks / base.num_kv_blocks, 2)} for r in rows],
                 f"{kv_memory / 2**20:.3g} MiB of KV cache (measured: the engines' own block counts)")


@dataclass
class GoodputRun:
    kv_cache_dtype: str
    rate: float  # offered requests/s; inf: every request at once
    num_kv_blocks: int
    goodput: float  # requests/s within every SLO
    attainment: float  # share of requests within every SLO
    throughput: float  # output tokens/s
    ttft_p50: float
    ttft_p90: float
    tpot_p50: float
    preemptions: int
    max_running: int  # most decodes in one step
    duration: float
    outputs: list  # the requests' final RequestOutputs, to score against other SLOs

    def goodput_at(self, slo: str) -> float:
        """Requests/s of this run within `slo` (another SLO than the one it was scored at)."""
        return goodput(self.outputs, slo, self.duration)

    @property
    def served_rate(self) -> float:
        """Requests/s completed; with every request at once, what the engine can serve."""
        return len(self.outputs) / self.duration


def serve_workload(llm, num_requests: int, input_len: int, output_len: int, rate: float,
                   slo: str, seed: int = 0) -> GoodputRun:
    """Replay `num_requests` random prompts arriving at `rate` req/s (Poisson) in real time on
    the engine and score them against `slo` (lesson 07's goodput: completed within every SLO)."""
    engine = engine_of(llm)
    before = engine.stats.preemptions
    workload = synthetic(num_requests, input_len, output_len, rate=rate, seed=seed,
                         vocab_size=engine.model_config.vocab_size)
    res = replay(engine, workload, progress=False)
    m = res.metrics(slo)
    return GoodputRun(engine.config.kv_cache_dtype, rate, engine.num_kv_blocks, m.goodput, m.slo_attainment,
                      m.output_throughput, m.ttft.median, m.ttft.p90, m.tpot.median,
                      engine.stats.preemptions - before,
                      max((s.num_decode_tokens for s in res.trace), default=0), res.duration,
                      res.outputs)


def load_sweep(llms: list, num_requests: int, input_len: int, output_len: int, loads, slo: str,
               seed: int = 0) -> tuple[list[GoodputRun], list[GoodputRun]]:
    """(saturated, runs): each engine given every request at once (its served_rate: the requests/s
    it can serve on this workload), then the same Poisson workload at each of `loads` times the
    first engine's served_rate, on every engine in turn (load by load)."""
    saturated = [serve_workload(llm, num_requests, input_len, output_len, math.inf, slo, seed)
                 for llm in llms]
    base = saturated[0].served_rate
    return saturated, [serve_workload(llm, num_requests, input_len, output_len, load * base, slo, seed)
                       for load in loads for llm in llms]


def goodput_table(runs: list[GoodputRun], slo: str) -> Table:
    return Table([{"kv_cache_dtype": r.kv_cache_dtype,
                   "offered req/s": "all at once" if math.isinf(r.rate) else round(r.rate, 2),
                   "served req/s": r.served_rate, "goodput req/s": r.goodput,
                   "within SLO": f"{r.attainment:.0%}", "most running": r.max_running,
                   "preemptions": r.preemptions, "TTFT p50 s": r.ttft_p50, "TTFT p90 s": r.ttft_p90,
                   "TPOT p50 ms": 1e3 * r.tpot_p50}
                  for r in runs],  # the SLO in the title: in a header, one long word a slide can't fit
                 f"The same workload and KV memory, SLO {slo} (measured on this machine)", ".3g")


def slo_for(itl: float, output_len: int) -> str:
    """An SLO scaled to this device: the first token within 1.5 generations of output_len tokens
    at the batch-1 step `itl` (a request may wait for about one batch to finish, not for two),
    and each later token within 4 batch-1 steps."""
    return f"ttft<={1.5 * output_len * itl:.3g}s,tpot<={4 * itl:.3g}s"


def decode_step_time(llm, batch: int, context: int, steps: int = 16) -> float:
    """Median seconds of a decode-only step with `batch` sequences of about `context` tokens."""
    engine = engine_of(llm)
    workload = synthetic(batch, context, steps + 1, vocab_size=engine.model_config.vocab_size)
    res = replay(engine, workload, realtime=False, progress=False)
    decodes = [s.duration for s in res.trace if not s.num_prefill_tokens and s.num_decode_tokens == batch]
    if not decodes:
        raise RuntimeError(f"no decode step ran all {batch} sequences: is the cache big enough?")
    return statistics.median(decodes)


def alternating_step_times(llms: dict, batch: int, context: int, steps: int, rounds: int) -> dict:
    """name -> median seconds of a decode step of `batch` sequences at about `context` tokens on
    each engine of `llms`: `rounds` rounds that time every engine in turn, after a warm-up, so a
    shared machine's slower minutes fall on all alike."""
    for llm in llms.values():
        decode_step_time(llm, batch, context, 2)  # warm-up: lazy packing, first-call costs
    times = {name: [] for name in llms}
    for _ in range(rounds):
        for name, llm in llms.items():
            times[name].append(decode_step_time(llm, batch, context, steps))
    return {name: statistics.median(t) for name, t in times.items()}


def long_context_steps(model: str, dtype: str, batch: int, context: int, steps: int = 8,
                       rounds: int = 3) -> dict[str, float]:
    """kv_cache_dtype -> median seconds of a decode step of `batch` sequences at about `context`
    tokens, each on an engine whose cache just holds them: a context where attention's K/V reads
    are a large share of a step's bytes, unlike a short one."""
    blocks = batch * -(-(context + steps + 2) // EngineConfig.block_size) + 2
    llms = {kv: LLM(model, None, dtype, config=EngineConfig(num_kv_blocks=blocks, kv_cache_dtype=kv,
                                                             max_num_batched_tokens=batch * context))
            for kv in KV_DTYPES}
    return alternating_step_times(llms, batch, context, steps, rounds)


def kv_magnitudes(llm: LLM, prompts: list[list[int]]) -> tuple[float, float]:
    """The largest |K| and |V| an "auto" engine writes to its cache over `prompts` (greedy, 16
    tokens each): what an fp8 scale of 1.0 must hold (e4m3 keeps 3 mantissa bits from 2^-6 to 448)."""
    engine = engine_of(llm)
    if engine.kv_cache_dtype.itemsize == 1:
        raise ValueError("kv_magnitudes reads a float cache: pass an engine with kv_cache_dtype='auto'")
    for k, v in engine.executor.kv_caches:
        k.zero_()
        v.zero_()
    llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    caches = engine.executor.kv_caches
    return max(float(k.abs().max()) for k, _ in caches), max(float(v.abs().max()) for _, v in caches)
