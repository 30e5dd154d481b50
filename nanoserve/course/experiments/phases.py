"""Lesson 01: prefill and decode timed on one model; prefill time against prompt length, fitted
with a linear and a quadratic part; batch-1 decode steps against context length and the roofline
floor."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nanoserve.config import ModelConfig
from nanoserve.course.setup import (
    Table,
    engine_of,
    fresh_engine,
    generate,
    model_dtype,
    progress_bar,
    random_prompt,
)
from nanoserve.measure import roofline
from nanoserve.measure.fit import fit_relative
from nanoserve.measure.metrics import prefill_time
from nanoserve.measure.roofline import dtype_bytes, step_cost
from nanoserve.measure.workload import greedy_params
from nanoserve.presets import preset_config


@dataclass
class PhaseRun:
    """One request's steps: its prefill, then one decode step per output token."""

    prompt_len: int
    kinds: list[str]  # "prefill" | "decode", per step
    seconds: list[float]  # per step
    contexts: list[int]  # KV length each step attends to, including its own tokens

    @property
    def prefill_seconds(self) -> float:
        return sum(s for k, s in zip(self.kinds, self.seconds) if k == "prefill")

    @property
    def decode_seconds(self) -> list[float]:
        return [s for k, s in zip(self.kinds, self.seconds) if k == "decode"]

    @property
    def decode_contexts(self) -> list[int]:
        return [c for k, c in zip(self.kinds, self.contexts) if k == "decode"]

    def table(self) -> Table:
        dec = statistics.median(self.decode_seconds)
        rows = [{"phase": "prefill", "tokens per step": self.prompt_len,
                 "ms per step": round(1e3 * self.prefill_seconds, 2),
                 "tokens/s": round(self.prompt_len / self.prefill_seconds, 1)},
                {"phase": "decode (median)", "tokens per step": 1, "ms per step": round(1e3 * dec, 2),
                 "tokens/s": round(1 / dec, 1)}]
        return Table(rows, "One request, measured")


def two_phases(llm, prompt_len: int, max_tokens: int, seed: int = 0) -> PhaseRun:
    """One request of prompt_len tokens generating max_tokens, prefilled in one step."""
    engine = fresh_engine(llm, enable_prefix_caching=False, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(prompt_len, 1))
    rng = np.random.default_rng(seed)
    generate(engine, [random_prompt(engine, prompt_len, rng)], greedy_params(2))  # warm-up
    first = len(engine.trace)
    generate(engine, [random_prompt(engine, prompt_len, rng)], greedy_params(max_tokens))
    kinds, secs, ctxs, done = [], [], [], 0
    for rec in engine.trace[first:]:
        entry, = rec.entries
        done += entry.num_tokens
        kinds.append(entry.kind)
        secs.append(rec.duration)
        ctxs.append(done)
    return PhaseRun(prompt_len, kinds, secs, ctxs)


@dataclass
class PrefillPoint:
    length: int
    times: list[float]  # seconds, one per repetition

    @property
    def seconds(self) -> float:
        return statistics.median(self.times)


def prefill_sweep(llm, lengths: Sequence[int], reps: int = 3, seed: int = 0,
                  progress: bool = True) -> list[PrefillPoint]:
    """Prefill time (arrival at the scheduler to first token) of one prompt per length, each a
    fresh random prompt prefilled in one step; repetitions interleave lengths (noise spreads)."""
    lengths = sorted(set(int(n) for n in lengths))
    engine = fresh_engine(llm, enable_prefix_caching=False, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(lengths))
    if lengths[-1] > engine.max_model_len:
        raise ValueError(f"prompt length {lengths[-1]} exceeds max_model_len={engine.max_model_len}")
    rng = np.random.default_rng(seed)
    for n in (lengths[0], lengths[-1]):  # warm-up: the smallest and largest shapes
        generate(engine, [random_prompt(engine, n, rng)], greedy_params(1))
    times: dict[int, list[float]] = {n: [] for n in lengths}
    with progress_bar(reps * len(lengths), "prefill sweep", progress) as bar:
        for _ in range(reps):
            for n in lengths:
                o, = generate(engine, [random_prompt(engine, n, rng)], greedy_params(1))
                times[n].append(prefill_time(o))
                bar.update(1)
    return [PrefillPoint(n, times[n]) for n in lengths]


@dataclass
class PrefillFit:
    """seconds = fixed + per_token * L + per_token2 * L^2, fitted to measured prefills."""

    fixed: float
    per_token: float
    per_token2: float
    lengths: list[int]
    seconds: list[float]

    def predict(self, length) -> np.ndarray | float:
        L = np.asarray(length, dtype=float)
        return self.fixed + self.per_token * L + self.per_token2 * L * L

    def quadratic_share(self, length: float) -> float:
        return float(self.per_token2 * length * length / self.predict(length))

    def table(self, lengths: Sequence[int] = (300, 30000),
              measured: dict[int, float] | None = None) -> Table:
        """Fitted time per length, split into parts, beside a measurement where there is one."""
        measured = measured or {}
        rows = []
        for n in lengths:
            rows.append({"prompt tokens": n, "fit (s)": float(self.predict(n)),
                         "linear part (s)": self.fixed + self.per_token * n,
                         "quadratic part (s)": self.per_token2 * n * n,
                         "quadratic share": f"{100 * self.quadratic_share(n):.0f}%",
                         "measured (s)": measured.get(n, math.nan),
                         "source": "measured" if n in measured else
                         ("interpolated" if n <= max(self.lengths) else "extrapolated (fit)")})
        return Table(rows, "Prefill time: the fit to this device's measurements", ".3g")


def fit_prefill(lengths: Sequence[int], seconds: Sequence[float]) -> PrefillFit:
    """Least squares in relative error (each point counts alike across orders of magnitude),
    every coefficient kept >= 0 (measure.fit)."""
    L, t = np.asarray(lengths, float), np.asarray(seconds, float)
    if len(L) < 3:
        raise ValueError(f"fit_prefill needs at least 3 lengths, got {len(L)}")
    best = fit_relative(np.stack([np.ones_like(L), L, L * L], 1), t)
    return PrefillFit(*map(float, best), [int(x) for x in L], [float(x) for x in t])


def prefill_outlook(llm, fit: PrefillFit, lengths: Sequence[int] = (300, 30000),
                    limit_s: float = 30.0, reps: int = 2) -> Table:
    """Measure each length the model and the time allow (fit < limit_s); extrapolate the rest."""
    engine = engine_of(llm)
    can = [n for n in lengths if n <= engine.max_model_len and fit.predict(n) < limit_s]
    measured = ({p.length: p.seconds for p in prefill_sweep(llm, can, reps, seed=1, progress=False)}
                if can else {})
    return fit.table(lengths, measured)


def counted_prefill_flops(model: str | ModelConfig, lengths: Sequence[int] = (300, 30000)) -> Table:
    """FLOPs of a whole-prompt prefill by term (roofline.step_cost): counted, not measured."""
    cfg = preset_config(model.removeprefix("preset:")) if isinstance(model, str) else model
    rows = []
    for n in lengths:
        c = step_cost(cfg, roofline.prefill_batch(n))
        rows.append({"prompt tokens": n, "linear GFLOP": round(c.flops["linear"] / 1e9, 1),
                     "attention GFLOP": round(c.flops["attention"] / 1e9, 1),
                     "attention share": f"{100 * c.flops['attention'] / c.total_flops:.1f}%"})
    name = model if isinstance(model, str) else "model"
    return Table(rows, f"{name}: FLOPs of one prefill, counted from the shape (modelled)")


@dataclass
class DecodeContextPoint:
    """Batch-1 decode steps after a prompt of prompt_len tokens; context_len is the median KV
    length the timed steps attended to."""

    prompt_len: int
    context_len: int
    times: list[float]  # per repetition, the median of its decode steps (seconds)

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.times)


def decode_context_sweep(llm, prompt_lens: Sequence[int], steps: int = 8, reps: int = 3, seed: int = 0,
                         progress: bool = True) -> list[DecodeContextPoint]:
    """One request at a time: a fresh prompt of each length, prefilled in one step, then `steps`
    decode steps at batch 1. Repetitions interleave the lengths, so noise spreads over all."""
    lengths = sorted(set(int(n) for n in prompt_lens))
    engine = fresh_engine(llm, enable_prefix_caching=False, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(lengths))
    longest = lengths[-1] + steps + 1
    blocks = engine.kv_manager.blocks_needed(longest)
    if longest > engine.max_model_len or blocks > engine.num_kv_blocks:
        raise ValueError(f"a prompt of {lengths[-1]} tokens + {steps + 1} generated needs max_model_len "
                         f">= {longest} ({engine.max_model_len}) and {blocks} KV blocks "
                         f"({engine.num_kv_blocks})")
    rng = np.random.default_rng(seed)
    generate(engine, [random_prompt(engine, lengths[0], rng)], greedy_params(3))  # warm-up
    times: dict[int, list[float]] = {n: [] for n in lengths}
    contexts: dict[int, int] = {}
    with progress_bar(reps * len(lengths), "decode context sweep", progress) as bar:
        for _ in range(reps):
            for n in lengths:
                first = len(engine.trace)
                generate(engine, [random_prompt(engine, n, rng)], greedy_params(steps + 1))
                decode = [r for r in engine.trace[first:] if not r.num_prefill_tokens]
                times[n].append(statistics.median(r.duration for r in decode))
                contexts[n] = n + 1 + len(decode) // 2  # the KV length of the middle decode step
                bar.update(1)
    return [DecodeContextPoint(n, contexts[n], times[n]) for n in lengths]


def decode_context_table(points: Sequence[DecodeContextPoint], floors: Sequence[float]) -> Table:
    """Median decode step per context length beside its floor, and how both grew from the first."""
    rows = [{"context tokens": p.context_len, "step ms": round(1e3 * p.step_seconds, 2),
             "floor ms (modelled)": round(1e3 * f, 2), "floor / step": f"{f / p.step_seconds:.0%}",
             "step vs first": f"{p.step_seconds / points[0].step_seconds:.2f}x",
             "floor vs first": f"{f / floors[0]:.2f}x"} for p, f in zip(points, floors)]
    return Table(rows, "Batch-1 decode step against context length, measured (median over repeats)")


def decode_floors(llm, ceilings: roofline.DeviceCeilings, batch: int,
                  contexts: Sequence[int]) -> list[float]:
    """Roofline floor (seconds) of a decode step of `batch` sequences at each context length."""
    engine = engine_of(llm)
    return [roofline.decode_step_floor(engine.model_config, batch, c, ceilings, model_dtype(engine))
            for c in contexts]


def roofline_points(llm, steps: Sequence[tuple[str, list, float]]) -> list[tuple[str, float, float]]:
    """(label, batch for step_cost, measured seconds) -> plot points (label, FLOP/byte, FLOP/s)."""
    engine = engine_of(llm)
    nbytes = dtype_bytes(model_dtype(engine))
    return [roofline.roofline_point(label, step_cost(engine.model_config, batch, nbytes), s)
            for label, batch, s in steps]
