"""Probes shared by lessons 05-09: one decode step, one prefill and one request alone, timed
on this device, and a workload replayed on a fresh engine. Workloads and SLOs are scaled from
the probes, so a lesson shows the same effect on a laptop CPU and on an H100.
"""

from __future__ import annotations

import math

import numpy as np

from nanoserve.course.setup import fresh_engine, generate
from nanoserve.measure import bench
from nanoserve.measure.figures import device_label
from nanoserve.measure.metrics import tpot, ttft
from nanoserve.measure.workload import Workload, greedy_params, random_tokens


def prompt_tokens(engine, n: int, seed: int) -> list[int]:
    return random_tokens(n, np.random.default_rng(seed), engine.model_config.vocab_size)


def measure_decode_step(engine_or_llm, batch_size: int, context_len: int = 16, steps: int = 8) -> float:
    """Median seconds from one decode-only step of batch_size sequences to the next: the ITL a
    decoding request sees here, host work between steps included (measured)."""
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False,
                          max_num_seqs=max(batch_size, 1),
                          max_num_batched_tokens=max(batch_size * context_len, batch_size))
    generate(engine, [prompt_tokens(engine, context_len, 1000 + i) for i in range(batch_size)],
             greedy_params(steps + 1))
    tr = engine.trace
    periods = [b.start - a.start for a, b in zip(tr, tr[1:])
               if a.num_prefill_tokens == 0 and b.num_prefill_tokens == 0]
    return float(np.median(periods)) if periods else float(np.median([r.duration for r in tr]))


def measure_prefill(engine_or_llm, prompt_len: int, repeats: int = 3) -> float:
    """Median of `repeats` single-step prefills of a prompt_len-token prompt (seconds, measured)."""
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False, enable_chunked_prefill=False,
                          max_num_batched_tokens=prompt_len)
    for i in range(repeats):
        generate(engine, [prompt_tokens(engine, prompt_len, 2000 + i)], greedy_params(1))
    return float(np.median([r.duration for r in engine.trace]))


def to_ms(seconds) -> float:
    return float(seconds) * 1e3 if seconds is not None else math.nan



def unloaded_latency(engine_or_llm, input_len: int, output_len: int = 16, repeats: int = 3) -> dict:
    """TTFT and TPOT (s) of one request running alone here, median of `repeats` (measured)."""
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False)
    outs = [generate(engine, [prompt_tokens(engine, input_len, 5000 + i)], greedy_params(output_len))[0]
            for i in range(repeats)]
    return {"ttft": float(np.median([ttft(o) for o in outs])),
            "tpot": float(np.median([tpot(o) for o in outs]))}


def round_up(x: float) -> float:
    """Two significant digits, rounded up: an SLO a person would write down."""
    e = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / e - 1e-9) * e


def unloaded_slo(engine_or_llm, input_len: int, ttft_factor: float = 5.0,
                 tpot_factor: float = 3.0) -> dict:
    """An SLO this device meets when idle and misses when overloaded: TTFT <= ttft_factor x and
    TPOT <= tpot_factor x those of one request with an input_len prompt running alone (measured)."""
    alone = unloaded_latency(engine_or_llm, input_len)
    return {"ttft": round_up(ttft_factor * alone["ttft"]), "tpot": round_up(tpot_factor * alone["tpot"])}


def measure_workload(engine_or_llm, workload: Workload, progress: bool = True,
                     **config) -> bench.BenchResult:
    """Replay a workload on a fresh engine (EngineConfig overrides in `config`)."""
    engine = fresh_engine(engine_or_llm, **config)
    return bench.replay(engine, workload, progress=progress, warmup=0, label=device_label(engine))
