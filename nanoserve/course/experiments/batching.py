"""Lessons 03 and 04: decode throughput and latency against batch size, goodput at an SLO,
prefill throughput against the number of prompts in a step; static against continuous batching
on the same arrival workload."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.config import EngineConfig
from nanoserve.course.experiments.phases import roofline_points
from nanoserve.course.scenarios.common import measure_decode_step, measure_prefill
from nanoserve.course.setup import Table, engine_of, fresh_engine, generate, progress_bar, random_prompt
from nanoserve.measure import bench, roofline
from nanoserve.measure.bench import drive
from nanoserve.measure.metrics import compute_metrics, itls, tpot
from nanoserve.measure.roofline import dtype_bytes, dtype_name
from nanoserve.measure.workload import Uniform, Workload, WorkloadRequest, greedy_params, synthetic
from nanoserve.presets import preset_config
from nanoserve.sim.simulator import CostModel, sim_engine


@dataclass
class DecodePoint:
    batch: int
    context_len: int
    step_seconds: float  # median decode-only step (the model and the engine's work)
    itl_seconds: float  # median gap between a request's tokens (what a user sees)
    outputs: list = field(repr=False, default_factory=list)  # the round with the median ITL

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.itl_seconds


def decode_batch_sweep(llm, batch_sizes: Sequence[int], context_len: int = 64, steps: int = 12,
                       reps: int = 3, seed: int = 0, progress: bool = True) -> list[DecodePoint]:
    """For each batch size B: B requests with context_len-token prompts decode `steps` tokens
    together. Step time from decode-only steps of exactly B sequences, ITL from every request.
    After a warm-up, `reps` rounds each run every batch size (so a burst of other work lands in
    one round, not on one batch size); each point is the median over rounds of each round's
    median."""
    batch_sizes = sorted(set(int(b) for b in batch_sizes))
    engine = fresh_engine(llm, enable_prefix_caching=False, max_num_seqs=max(batch_sizes),
                          max_num_batched_tokens=max(batch_sizes) * context_len)
    need = max(batch_sizes) * engine.kv_manager.blocks_needed(context_len + steps + 1)
    if need > engine.num_kv_blocks:  # it would preempt, and time recomputation instead of decode
        raise ValueError(f"batch {max(batch_sizes)} at {context_len + steps + 1} tokens needs {need} KV "
                         f"blocks; the cache has {engine.num_kv_blocks}: load with more num_kv_blocks")
    rng = np.random.default_rng(seed)
    generate(engine, [random_prompt(engine, context_len, rng)], greedy_params(3))  # warm-up
    rounds: dict[int, list[tuple[float, float, list]]] = {b: [] for b in batch_sizes}
    with progress_bar(reps * len(batch_sizes), "decode batch sweep", progress) as bar:
        for _ in range(max(1, reps)):
            for b in batch_sizes:
                first = len(engine.trace)
                outs = generate(engine, [random_prompt(engine, context_len, rng) for _ in range(b)],
                                greedy_params(steps + 1))
                recs = [r for r in engine.trace[first:] if not r.num_prefill_tokens]
                full = [r.duration for r in recs if r.num_decode_tokens == b] or [r.duration for r in recs]
                gaps = [g for o in outs for g in itls(o)]
                rounds[b].append((statistics.median(full), statistics.median(gaps), outs))
                bar.update(1)
    out = []
    for b, rs in rounds.items():
        mid = sorted(rs, key=lambda r: r[1])[(len(rs) - 1) // 2]
        out.append(DecodePoint(b, context_len, statistics.median(r[0] for r in rs),
                               statistics.median(r[1] for r in rs), mid[2]))
    return out


def decode_table(points: Sequence[DecodePoint], floors: Sequence[float] | None = None) -> Table:
    rows = []
    for i, p in enumerate(points):
        row = {"batch": p.batch, "step ms": round(1e3 * p.step_seconds, 2),
               "ITL ms": round(1e3 * p.itl_seconds, 2), "tokens/s": round(p.tokens_per_s, 1),
               "vs batch 1": f"{p.tokens_per_s / points[0].tokens_per_s:.1f}x"}
        if floors is not None:
            row["floor ms (modelled)"] = round(1e3 * floors[i], 2)
        rows.append(row)
    return Table(rows, "Batched decode, measured")


def batch_floors(llm, ceilings: roofline.DeviceCeilings, points: Sequence[DecodePoint]) -> list[float]:
    """Roofline floor (seconds, modelled from the measured ceilings) of each point's decode step."""
    engine = engine_of(llm)
    return [roofline.decode_step_floor(engine.model_config, p.batch, p.context_len + 1, ceilings,
                                       roofline.dtype_name(engine.dtype)) for p in points]


def decode_points(llm, points: Sequence[DecodePoint]) -> list[tuple[str, float, float]]:
    """Roofline plot points of each batch's median decode step (context at mid-run)."""
    return roofline_points(llm, [(f"B={p.batch}", roofline.decode_batch(p.batch, p.context_len + 1),
                                  p.step_seconds) for p in points])


def scaling_knee(points: Sequence[DecodePoint], efficiency: float = 0.5) -> int:
    """The largest batch size at which each sequence still decodes at least `efficiency` times
    as fast as alone (ITL(B) <= ITL(1) / efficiency): up to it, batching is nearly free.
    Compared with batch 1 rather than step by step, so one noisy point can't end it early."""
    base = points[0].itl_seconds
    return max(p.batch for p in points if p.itl_seconds * efficiency <= base)


def datasheet_critical_batches(dtype: str = "bfloat16") -> Table:
    """Ridge point and critical decode batch of datasheet GPUs (modelled, from nanoserve.sim.devices)."""
    from nanoserve.sim.devices import DEVICES
    rows = [{"device": p.name, "TFLOP/s": round(p.peak_flops / 1e12), "TB/s": p.bandwidth / 1e12,
             "ridge FLOP/byte": round(p.peak_flops / p.bandwidth),
             "critical batch": round(p.peak_flops / p.bandwidth * dtype_bytes(dtype) / 2)}
            for p in DEVICES.values()]
    return Table(rows, f"Datasheet numbers, {dtype_name(dtype)} dense (modelled, not measured)", ".3g")


def itl_target(points: Sequence[DecodePoint]) -> tuple[int, int, float]:
    """(B, 2B, target): the doubling that raised throughput most while TPOT rose, and a TPOT
    target between the two batches' median TPOTs (so B meets it and 2B does not)."""
    by = {p.batch: p for p in points}
    pairs = [(by[b], by[2 * b]) for b in by if 2 * b in by]
    if not pairs:
        raise ValueError("the sweep needs two batch sizes B and 2B")

    def med(p):
        return statistics.median(v for o in p.outputs if (v := tpot(o)) is not None)
    rising = [(a, b) for a, b in pairs if med(b) > med(a)] or pairs
    a, b = max(rising, key=lambda ab: (ab[1].tokens_per_s / ab[0].tokens_per_s, ab[0].batch))
    return a.batch, b.batch, math.sqrt(med(a) * med(b))


@dataclass
class GoodputPoint:
    """One batch size's requests against a TPOT target: request throughput and goodput."""

    batch: int
    throughput: float  # completed requests / s
    goodput: float  # requests / s that met the target (vLLM's request goodput)
    met: int  # requests that met it, of `batch`
    median_tpot: float  # seconds


def goodput_points(points: Sequence[DecodePoint], tpot_slo: float) -> list[GoodputPoint]:
    """Each batch size's run scored as vLLM scores a serving run: requests per second, and
    requests per second whose TPOT met tpot_slo (goodput)."""
    out = []
    for p in points:
        m = compute_metrics(p.outputs, slo={"tpot": tpot_slo})
        out.append(GoodputPoint(p.batch, m.request_throughput, m.goodput, m.good_requests,
                                m.tpot.median))
    return out


def goodput_table(points: Sequence[DecodePoint], tpot_slo: float) -> Table:
    """Request throughput against request goodput (requests/s that met the TPOT target)."""
    rows = [{"batch": g.batch, "requests/s": round(g.throughput, 2),
             "median TPOT ms": round(1e3 * g.median_tpot, 2), "meet SLO": f"{g.met}/{g.batch}",
             "goodput requests/s": round(g.goodput, 2)} for g in goodput_points(points, tpot_slo)]
    return Table(rows, f"Goodput at TPOT <= {1e3 * tpot_slo:.2f} ms, measured")


@dataclass
class PrefillBatchPoint:
    """num_prompts prompts of prompt_len tokens prefilled together in one step."""

    num_prompts: int
    prompt_len: int
    times: list[float]  # seconds of that step, one per repetition

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.times)

    @property
    def tokens_per_s(self) -> float:
        return self.num_prompts * self.prompt_len / self.step_seconds


def prefill_batch_sweep(llm, prompt_counts: Sequence[int], prompt_len: int, reps: int = 3,
                        seed: int = 0, progress: bool = True) -> list[PrefillBatchPoint]:
    """For each n: n fresh prompts of prompt_len tokens prefilled in one step (no chunking, a
    budget of exactly n x prompt_len), timed from the engine's trace; repetitions interleave n."""
    counts = sorted(set(int(n) for n in prompt_counts))
    engine = fresh_engine(llm, enable_prefix_caching=False, enable_chunked_prefill=False,
                          max_num_seqs=max(counts), max_num_batched_tokens=max(counts) * prompt_len)
    need = max(counts) * engine.kv_manager.blocks_needed(prompt_len + 1)
    if need > engine.num_kv_blocks or prompt_len > engine.max_model_len:
        raise ValueError(f"{max(counts)} prompts of {prompt_len} tokens need {need} KV blocks (the cache "
                         f"has {engine.num_kv_blocks}) and max_model_len >= {prompt_len} "
                         f"({engine.max_model_len}): load with more num_kv_blocks or use shorter prompts")
    rng = np.random.default_rng(seed)
    generate(engine, [random_prompt(engine, prompt_len, rng)], greedy_params(1))  # warm-up
    times: dict[int, list[float]] = {n: [] for n in counts}
    with progress_bar(reps * len(counts), "prefill batch sweep", progress) as bar:
        for _ in range(reps):
            for n in counts:
                first = len(engine.trace)
                generate(engine, [random_prompt(engine, prompt_len, rng) for _ in range(n)], greedy_params(1))
                steps = [r for r in engine.trace[first:] if r.num_prefill_tokens]
                if len(steps) != 1:
                    raise RuntimeError(f"{n} prompts took {len(steps)} prefill steps, not one")
                times[n].append(steps[0].duration)
                bar.update(1)
    return [PrefillBatchPoint(n, prompt_len, times[n]) for n in counts]


def batching_gain_table(decode: Sequence[DecodePoint], prefill: Sequence[PrefillBatchPoint]) -> Table:
    """Tokens/s of a step with n sequences, decode beside prefill, and each as a multiple of n = 1."""
    dec = {p.batch: p.batch / p.step_seconds for p in decode}
    pre = {p.num_prompts: p.tokens_per_s for p in prefill}
    rows = [{"sequences in the step": n, "decode tokens/s": dec.get(n, ""),
             "decode gain": f"{dec[n] / dec[min(dec)]:.1f}x" if n in dec else "",
             f"prefill tokens/s ({prefill[0].prompt_len}-token prompts)": pre.get(n, ""),
             "prefill gain": f"{pre[n] / pre[min(pre)]:.1f}x" if n in pre else ""}
            for n in sorted(set(dec) | set(pre))]
    return Table(rows, "Batching decode vs batching prefill, one step each, measured", ".0f")


# --- 04: continuous batching --------------------------------------------------------------------


def toy_policy_steps(output_lens: Sequence[int], max_num_seqs: int) -> Table:
    """Steps to serve requests with these output lengths (1-token prompts, all at t=0) under each
    policy: the real scheduler, driven by the simulator with every step costing 1 s (modelled)."""
    cfg = preset_config("tiny")
    rows = []
    for policy in ("static", "continuous"):
        engine = sim_engine(cfg, CostModel(1.0, 0, 0, 0, 0, label="1 s per step"),
                            EngineConfig(num_kv_blocks=1024, max_num_seqs=max_num_seqs,
                                         scheduling_policy=policy, enable_prefix_caching=False))
        wl = Workload("toy", "", [WorkloadRequest([1], greedy_params(n), 0.0) for n in output_lens])
        outs = drive(engine, wl, engine.clock.advance_to)
        rows.append({"policy": policy, "steps": len(engine.trace),
                     "finish step per request": [round(o.metrics.finished_time) for o in outs],
                     "mean finish step": round(statistics.mean(o.metrics.finished_time for o in outs), 2)})
    return Table(rows, f"Output lengths {list(output_lens)}, max_num_seqs={max_num_seqs} "
                 "(simulated: 1 step = 1 s)")


def serving_workload(llm, num_requests: int, max_num_seqs: int, input_len: tuple[int, int],
                     output_len: tuple[int, int], load: float = 0.8, seed: int = 0) -> Workload:
    """Poisson arrivals at `load` times what continuous batching can serve here, estimated from
    a measured decode step at batch max_num_seqs and a measured prefill of a mean prompt."""
    mean_in, mean_out = sum(input_len) // 2, sum(output_len) / 2
    step = measure_decode_step(llm, max_num_seqs, mean_in, steps=4)
    per_request = mean_out * step / max_num_seqs + measure_prefill(llm, mean_in)
    rate = float(f"{load / per_request:.3g}")
    vocab = engine_of(llm).model_config.vocab_size
    wl = synthetic(num_requests, Uniform(*input_len), Uniform(*output_len), rate=rate, seed=seed,
                   vocab_size=vocab, token_low=min(10, vocab - 1), name="Poisson arrivals")
    wl.description += f" (= {load:g} x the estimated capacity of continuous batching here)"
    return wl


def compare_policies(llm, workload: Workload, max_num_seqs: int,
                     policies: Sequence[str] = ("static", "continuous"),
                     progress: bool = True) -> dict[str, bench.BenchResult]:
    """Replay the same workload in real time under each scheduling policy."""
    results = {}
    for policy in policies:
        engine = fresh_engine(llm, enable_prefix_caching=False, max_num_seqs=max_num_seqs,
                              scheduling_policy=policy)
        results[policy] = bench.replay(engine, workload, progress=progress,
                                       label=f"{policy} batching, {bench.device_label(engine)}")
    return results


def policy_table(results: dict[str, bench.BenchResult]) -> Table:
    rows = []
    for policy, r in results.items():
        m = r.metrics()
        rows.append({"policy": policy, "duration s": round(r.duration, 2),
                     "output tokens/s": round(m.output_throughput, 1),
                     "TTFT p50 ms": round(1e3 * m.ttft.median, 1), "TTFT p90 ms": round(1e3 * m.ttft.p90, 1),
                     "E2E p50 ms": round(1e3 * m.e2e.median, 1), "TPOT p50 ms": round(1e3 * m.tpot.median, 2),
                     "sequences per step": round(statistics.mean(len(s.entries) for s in r.trace), 2)})
    return Table(rows, "Same workload, two schedulers, measured")
