"""Shared by lessons 05-09: sizes, fresh engines over one loaded model, probes, tables.

`fresh_engine` gives each run its own scheduler and KV bookkeeping (an empty prefix cache, other
knobs) over the model already loaded, so a sweep loads the weights once. The probes time one
decode step, one prefill and one request alone on this device; workloads and SLOs are scaled
from them, so a lesson shows the same effect on a laptop CPU and on an H100.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from nanoserve import bench
from nanoserve.config import EngineConfig
from nanoserve.engine import LLM, LLMEngine
from nanoserve.metrics import ttft
from nanoserve.sampling_params import SamplingParams
from nanoserve.workload import Workload, greedy_params, random_tokens


def quick_mode() -> bool:
    """NANOSERVE_QUICK=1 (CI): small models, sweeps and workloads."""
    try:
        from nanoserve.experiments import quick_mode as shared
        return bool(shared())
    except ImportError:
        return os.environ.get("NANOSERVE_QUICK", "0").strip().lower() not in ("", "0", "false", "no")


def device_kind(device: str | None = None) -> str:
    from nanoserve.config import default_device
    return "cuda" if (device or default_device()).startswith("cuda") else "cpu"


# Per lesson: quick (CI, any device), cpu and cuda sizes. Models are random-weight presets of real
# shapes: timing depends on shapes, not weights.
SIZES: dict[str, dict[str, dict]] = {
    "05": {
        "quick": dict(model="preset:tiny", num_decoders=4, long_prompt_len=1024, num_long=2,
                      budgets=(32, 128, 512)),
        "cpu": dict(model="preset:llama-120m", num_decoders=8, long_prompt_len=1024, num_long=2,
                    budgets=(64, 128, 512)),
        "cuda": dict(model="preset:llama-3.2-1b", num_decoders=32, long_prompt_len=8192, num_long=4,
                     budgets=(512, 1024, 2048, 4096)),
    },
    "06": {
        "quick": dict(model="preset:tiny", num_requests=12, prefix_len=512, suffix_len=32, output_len=8,
                      evict_blocks=48, evict_prefix_len=256, evict_unrelated_len=112,
                      evict_counts=(0, 2, 4, 5, 6, 7, 8)),
        "cpu": dict(model="preset:llama-120m", num_requests=12, prefix_len=512, suffix_len=32,
                    output_len=16, evict_blocks=48, evict_prefix_len=256, evict_unrelated_len=112,
                    evict_counts=(0, 2, 4, 5, 6, 7, 8)),
        "cuda": dict(model="preset:llama-3.2-1b", num_requests=64, prefix_len=4096, suffix_len=128,
                     output_len=32, evict_blocks=1024, evict_prefix_len=4096,
                     evict_unrelated_len=2032, evict_counts=(0, 2, 4, 5, 6, 7, 8, 10)),
    },
    "07": {
        "quick": dict(model="preset:tiny", num_requests=16, input_median=64, output_median=24,
                      short_output_median=8, rate_fractions=(0.4, 0.8, 1.2), sweep_requests=12),
        "cpu": dict(model="preset:llama-120m", num_requests=16, input_median=64, output_median=24,
                    short_output_median=8, rate_fractions=(0.3, 0.6, 0.9, 1.2), sweep_requests=24),
        "cuda": dict(model="preset:llama-3.2-1b", num_requests=100, input_median=512, output_median=96,
                     short_output_median=32, rate_fractions=(0.3, 0.6, 0.9, 1.2), sweep_requests=150),
    },
    "08": {
        "quick": dict(model="preset:tiny", num_requests=8, input_len=96, output_len=16, caps=(1, 4, 8)),
        "cpu": dict(model="preset:llama-120m", num_requests=16, input_len=256, output_len=48,
                    caps=(1, 4, 16)),
        "cuda": dict(model="preset:llama-3.2-1b", num_requests=128, input_len=1024, output_len=256,
                     caps=(1, 8, 32, 128)),
    },
    "09": {
        "quick": dict(model="preset:tiny", num_requests=16, input_median=192, output_median=16,
                      sim_requests=40, rates=3, datasheet_requests=40),
        "cpu": dict(model="preset:llama-120m", num_requests=24, input_median=256, output_median=32,
                    sim_requests=120, rates=5, datasheet_requests=80),
        "cuda": dict(model="preset:llama-3.2-1b", num_requests=200, input_median=1024, output_median=128,
                     sim_requests=300, rates=5, datasheet_requests=120),
    },
}


def sizes(lesson: str, quick: bool | None = None, device: str | None = None) -> dict:
    """The sizes lesson `lesson` ("05".."09") uses here: quick, or for this device."""
    if lesson not in SIZES:
        raise ValueError(f"lesson {lesson!r} has no sizes; choose from {sorted(SIZES)}")
    quick = quick_mode() if quick is None else quick
    return dict(SIZES[lesson]["quick" if quick else device_kind(device)])


def load_llm(model: str, device: str | None = None, dtype: str | None = None, seed: int = 0,
             **config) -> LLM:
    """An LLM for timing (records its step trace). config: EngineConfig fields.

    Quick mode on a CPU runs torch on one thread: CI runs two notebooks at once on two cores, and
    two-thread OpenMP work sharing a core with other work slows down many times over."""
    if quick_mode() and device_kind(device) == "cpu":
        import torch
        torch.set_num_threads(1)
    return LLM(model, device=device, dtype=dtype, seed=seed, config=EngineConfig(**config))


def _engine(x) -> LLMEngine:
    return getattr(x, "engine", x)


def fresh_engine(engine_or_llm, **overrides) -> LLMEngine:
    """A new engine over the same loaded model and KV tensors: its own scheduler and block
    bookkeeping (so an empty prefix cache) and the EngineConfig fields in `overrides`.
    num_kv_blocks may shrink the cache (never grow it); block_size can't change."""
    engine = _engine(engine_or_llm)
    num_blocks = overrides.pop("num_kv_blocks", None) or engine.num_kv_blocks
    if num_blocks > engine.num_kv_blocks:
        raise ValueError(f"num_kv_blocks={num_blocks} exceeds the {engine.num_kv_blocks} blocks "
                         "allocated; load the model with a larger cache")
    if overrides.get("block_size", engine.config.block_size) != engine.config.block_size:
        raise ValueError("block_size is fixed by the allocated KV tensors; load the model again")
    config = replace(engine.config, num_kv_blocks=num_blocks, **overrides)
    new = LLMEngine(model_config=engine.model_config, config=config, executor=engine.executor,
                    tokenizer=engine.tokenizer)
    new.device, new.dtype, new.model = engine.device, engine.dtype, getattr(engine, "model", None)
    return new


def device_label(engine_or_llm) -> str:
    """'measured on <device> (<threads>), <dtype>, <N>M-param model' for figure titles."""
    engine = _engine(engine_or_llm)
    params = engine.model_config.num_params() / 1e6
    return f"measured on {bench.device_label(engine)}, {params:.0f}M-param model"


def generate(engine_or_llm, prompts: Sequence[list[int]], params: SamplingParams | Sequence) -> list:
    """All prompts at once, stepped to completion (no real-time arrivals). -> outputs in order."""
    engine = _engine(engine_or_llm)
    params = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    final = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    return [final[i] for i in ids]


def _tokens(engine, n: int, seed: int) -> list[int]:
    return random_tokens(n, np.random.default_rng(seed), engine.model_config.vocab_size)


def measure_decode_step(engine_or_llm, batch_size: int, context_len: int = 16, steps: int = 8) -> float:
    """Median seconds from one decode-only step of batch_size sequences to the next: the ITL a
    decoding request sees here, host work between steps included (measured)."""
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False,
                          max_num_seqs=max(batch_size, 1),
                          max_num_batched_tokens=max(batch_size * context_len, batch_size))
    generate(engine, [_tokens(engine, context_len, 1000 + i) for i in range(batch_size)],
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
        generate(engine, [_tokens(engine, prompt_len, 2000 + i)], greedy_params(1))
    return float(np.median([r.duration for r in engine.trace]))


class Table:
    """Rows of dicts shown as an aligned text table (print) or HTML (a notebook cell's value)."""

    def __init__(self, rows: Sequence[dict], title: str = "", floatfmt: str = ".3g"):
        self.rows, self.title, self.floatfmt = list(rows), title, floatfmt
        self.columns = list(dict.fromkeys(k for r in self.rows for k in r))

    def _cell(self, v) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else format(v, self.floatfmt)
        return str(v)

    def __repr__(self) -> str:
        cells = [[self._cell(r.get(c, "")) for c in self.columns] for r in self.rows]
        width = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(self.columns)]
        lines = [self.title] if self.title else []
        lines.append("  ".join(c.rjust(w) for c, w in zip(self.columns, width)))
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, width)) for row in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{esc(self._cell(r.get(c, '')))}</td>"
                                        for c in self.columns) + "</tr>" for r in self.rows)
        cap = f"<caption>{esc(self.title)}</caption>" if self.title else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ms(seconds) -> float:
    return float(seconds) * 1e3 if seconds is not None else math.nan



def unloaded_latency(engine_or_llm, input_len: int, output_len: int = 16, repeats: int = 3) -> dict:
    """TTFT and TPOT (s) of one request running alone here, median of `repeats` (measured)."""
    from nanoserve.metrics import tpot
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False)
    outs = [generate(engine, [_tokens(engine, input_len, 5000 + i)], greedy_params(output_len))[0]
            for i in range(repeats)]
    return {"ttft": float(np.median([ttft(o) for o in outs])),
            "tpot": float(np.median([tpot(o) for o in outs]))}


def _round_up(x: float) -> float:
    """Two significant digits, rounded up: an SLO a person would write down."""
    e = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / e - 1e-9) * e


def unloaded_slo(engine_or_llm, input_len: int, ttft_factor: float = 5.0,
                 tpot_factor: float = 3.0) -> dict:
    """An SLO this device meets when idle and misses when overloaded: TTFT <= ttft_factor x and
    TPOT <= tpot_factor x those of one request with an input_len prompt running alone (measured)."""
    alone = unloaded_latency(engine_or_llm, input_len)
    return {"ttft": _round_up(ttft_factor * alone["ttft"]), "tpot": _round_up(tpot_factor * alone["tpot"])}


def slo_text(slo: dict) -> str:
    return ",".join(f"{k}<={v * 1e3:g}ms" for k, v in slo.items())


def measure_workload(engine_or_llm, workload: Workload, progress: bool = True,
                     **config) -> bench.BenchResult:
    """Replay a workload on a fresh engine (EngineConfig overrides in `config`)."""
    engine = fresh_engine(engine_or_llm, **config)
    return bench.replay(engine, workload, progress=progress, warmup=0, label=device_label(engine))
