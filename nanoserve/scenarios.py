"""Measurements behind lessons 05-09: interference, prefix caching, serving metrics, cost, disaggregation.

Every function here either runs the real engine on this device (bench.replay: a workload
replayed in real time) or the simulator calibrated on this device, and returns plain data:
a notebook cell prints it, a figure in widgets.py draws it. Workloads are scaled to the
device by short measured probes (how long a decode step and a prefill take here), so a
lesson shows the same effect on a 2-core laptop and on an H100. Sizes come from `sizes()`:
small in quick mode (NANOSERVE_QUICK=1, set by CI), sized for the device otherwise.

`fresh_engine` gives each run its own scheduler and KV bookkeeping (an empty prefix cache,
other knobs) over the model already loaded, so a sweep loads the weights once.
Deliberately left out: figures and widgets (widgets.py), and engine logic of any kind.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from nanoserve import bench
from nanoserve.config import EngineConfig
from nanoserve.engine import LLM, LLMEngine
from nanoserve.metrics import completed, compute_metrics, itls, stratify, ttft
from nanoserve.sampling_params import SamplingParams
from nanoserve.workload import LogNormal, Workload, WorkloadRequest, greedy_params, random_tokens, synthetic

# --- sizes and setup ------------------------------------------------------------------------


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
        "cpu": dict(model="preset:llama-120m", num_decoders=8, long_prompt_len=2048, num_long=3,
                    budgets=(128, 256, 512, 1024)),
        "cuda": dict(model="preset:llama-3.2-1b", num_decoders=32, long_prompt_len=8192, num_long=4,
                     budgets=(512, 1024, 2048, 4096)),
    },
    "06": {
        "quick": dict(model="preset:tiny", num_requests=12, prefix_len=512, suffix_len=32, output_len=8,
                      evict_blocks=48, evict_prefix_len=256, evict_unrelated_len=112,
                      evict_counts=(0, 2, 4, 5, 6, 7, 8)),
        "cpu": dict(model="preset:llama-120m", num_requests=24, prefix_len=768, suffix_len=64,
                    output_len=16, evict_blocks=96, evict_prefix_len=512, evict_unrelated_len=240,
                    evict_counts=(0, 2, 4, 5, 6, 7, 8, 10)),
        "cuda": dict(model="preset:llama-3.2-1b", num_requests=64, prefix_len=4096, suffix_len=128,
                     output_len=32, evict_blocks=1024, evict_prefix_len=4096,
                     evict_unrelated_len=2032, evict_counts=(0, 2, 4, 5, 6, 7, 8, 10)),
    },
    "07": {
        "quick": dict(model="preset:tiny", num_requests=16, input_median=96, output_median=12,
                      long_output_median=48, rate_fractions=(0.4, 1.2), sweep_requests=12,
                      sim_requests=60),
        "cpu": dict(model="preset:llama-120m", num_requests=30, input_median=192, output_median=16,
                    long_output_median=48, rate_fractions=(0.3, 0.6, 0.9, 1.2), sweep_requests=24,
                    sim_requests=150),
        "cuda": dict(model="preset:llama-3.2-1b", num_requests=200, input_median=512, output_median=64,
                     long_output_median=256, rate_fractions=(0.3, 0.6, 0.9, 1.2),
                     sweep_requests=150, sim_requests=400),
    },
    "08": {
        "quick": dict(model="preset:tiny", num_requests=8, input_len=96, output_len=16, caps=(1, 8)),
        "cpu": dict(model="preset:llama-120m", num_requests=16, input_len=256, output_len=48,
                    caps=(1, 4, 16)),
        "cuda": dict(model="preset:llama-3.2-1b", num_requests=128, input_len=1024, output_len=256,
                     caps=(1, 8, 32, 128)),
    },
    "09": {
        "quick": dict(model="preset:tiny", num_requests=16, input_median=192, output_median=16,
                      sim_requests=40, rates=3, datasheet_requests=40),
        "cpu": dict(model="preset:llama-120m", num_requests=32, input_median=384, output_median=32,
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
    """An LLM for timing (records its step trace). config: EngineConfig fields."""
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


# --- 05: interference and chunked prefill --------------------------------------------------

@dataclass
class InterferenceSetup:
    """Decoders from t=0 and long prompts arriving every `gap` s, timed from measured probes."""

    workload: Workload
    num_decoders: int
    long_prompt_len: int
    decode_step: float  # s from one decode step of the decoders to the next, measured
    long_prefill: float  # s, one whole long prompt in one step, measured
    gap: float  # s between long arrivals
    long_ids: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (f"{self.num_decoders} decoders from t=0; {len(self.long_ids)} prompts of "
                f"{self.long_prompt_len} tokens arriving every {self.gap:.2f} s. Measured: decoders get a token every "
                f"{_ms(self.decode_step):.1f} ms; one long prefill takes {_ms(self.long_prefill):.0f} ms.")


def interference_setup(engine_or_llm, num_decoders: int, long_prompt_len: int, num_long: int = 3,
                       decoder_prompt_len: int = 16, long_output_len: int = 4,
                       seed: int = 0) -> InterferenceSetup:
    """Measure a decode step and a long prefill here, then build the workload: long prompts
    arrive after 8 decode steps and then every 2.5 long-prefill times (so the decoders recover
    in between), and the decoders generate long enough to still be running at the end."""
    engine = _engine(engine_or_llm)
    step = measure_decode_step(engine, num_decoders, decoder_prompt_len)
    prefill = measure_prefill(engine, long_prompt_len)
    first, gap = 8 * step, 2.5 * prefill
    window = first + num_long * gap
    out_len = int(math.ceil(window / step)) + 16
    rng = np.random.default_rng(seed)
    vocab = engine.model_config.vocab_size
    reqs = [WorkloadRequest(random_tokens(decoder_prompt_len, rng, vocab), greedy_params(out_len), 0.0)
            for _ in range(num_decoders)]
    reqs += [WorkloadRequest(random_tokens(long_prompt_len, rng, vocab), greedy_params(long_output_len),
                             first + k * gap) for k in range(num_long)]
    desc = (f"{num_decoders} decoders ({decoder_prompt_len} in, {out_len} out) at t=0; {num_long} "
            f"prompts of {long_prompt_len} tokens from t={first:.2f}s every {gap:.2f}s")
    wl = Workload("interference", desc, reqs)
    return InterferenceSetup(wl, num_decoders, long_prompt_len, step, prefill, gap,
                             [str(num_decoders + k) for k in range(num_long)])


@dataclass
class InterferenceRun:
    budget: int | None  # tokens per step with chunked prefill; None: no chunking
    result: bench.BenchResult
    long_ids: list[str]

    @property
    def label(self) -> str:
        return "no chunking" if self.budget is None else f"chunked, {self.budget} tok/step"

    def _split(self):
        longs = [o for o in self.result.outputs if o.request_id in self.long_ids]
        decs = [o for o in self.result.outputs if o.request_id not in self.long_ids]
        return decs, longs

    def decoder_itls(self) -> np.ndarray:
        """Every gap between two tokens of a decoder (seconds)."""
        decs, _ = self._split()
        return np.asarray([g for o in decs if completed(o) for g in itls(o)], dtype=float)

    def long_ttfts(self) -> np.ndarray:
        _, longs = self._split()
        return np.asarray([ttft(o) for o in longs if completed(o)], dtype=float)

    def summary(self) -> dict:
        gaps, firsts = self.decoder_itls(), self.long_ttfts()
        return {"run": self.label, "decoder ITL p50 (ms)": _ms(np.median(gaps)),
                "decoder ITL p99 (ms)": _ms(np.percentile(gaps, 99)),
                "decoder ITL max (ms)": _ms(gaps.max()),
                "long TTFT median (ms)": _ms(np.median(firsts)),
                "long TTFT max (ms)": _ms(firsts.max()),
                "steps": len(self.result.trace)}


def run_interference(engine_or_llm, setup: InterferenceSetup, budget: int | None) -> InterferenceRun:
    """Replay the setup's workload with chunked prefill at `budget` tokens per step, or without
    chunking (budget None: the step budget fits a whole long prompt plus every decoder)."""
    whole = setup.long_prompt_len + setup.num_decoders
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False,
                          enable_chunked_prefill=budget is not None,
                          max_num_batched_tokens=budget or whole,
                          max_num_seqs=max(_engine(engine_or_llm).config.max_num_seqs,
                                           setup.num_decoders + len(setup.long_ids)))
    res = bench.replay(engine, setup.workload, progress=False, warmup=0, label=device_label(engine))
    return InterferenceRun(budget, res, setup.long_ids)


def interference_grid(engine_or_llm, setup: InterferenceSetup, budgets: Sequence[int],
                      progress: bool = True) -> list[InterferenceRun]:
    """No chunking, then each budget: one measured replay each (a progress bar over runs)."""
    from tqdm.auto import tqdm
    runs = []
    for b in tqdm([None, *budgets], desc="token budgets", unit="run", disable=not progress):
        runs.append(run_interference(engine_or_llm, setup, b))
    return runs


def interference_table(runs: Sequence[InterferenceRun]) -> Table:
    return Table([r.summary() for r in runs], f"Interference, {runs[0].result.device_label}", ".1f")


# --- 06: prefix caching ---------------------------------------------------------------------

def shared_prompt_demo(llm: LLM, system_prompt: str, questions: Sequence[str],
                       max_tokens: int = 24) -> Table:
    """One system prompt, several questions, asked one after another on one engine: how many
    prompt tokens each took from the prefix cache, its TTFT and (with a tokenizer) its text."""
    rows = []
    for q in questions:
        prompt = system_prompt + q
        if llm.tokenizer is None:  # a preset without a tokenizer: stand-in ids, same lengths
            prompt = [10 + (ord(c) % 200) for c in prompt]
        o = llm.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0))[0]
        rows.append({"question": q.strip()[:40], "prompt tokens": len(o.prompt_token_ids),
                     "from cache": o.num_cached_tokens, "TTFT (ms)": _ms(ttft(o)),
                     "answer": (o.text or "").strip().replace("\n", " ")[:60]})
    return Table(rows, "A shared system prompt, asked one question at a time", ".1f")


def shared_prefix_workload(engine_or_llm, num_requests: int, prefix_len: int, suffix_len: int,
                           output_len: int, load: float = 0.6, seed: int = 0) -> tuple[Workload, float]:
    """One system prompt of prefix_len tokens shared by every request (own suffix each),
    Poisson arrivals at `load` times what uncached prefills can keep up with here (measured).
    -> (workload, rate in requests/s)."""
    engine = _engine(engine_or_llm)
    prefill = measure_prefill(engine, prefix_len + suffix_len)
    rate = load / prefill
    rng = np.random.default_rng(seed)
    vocab = engine.model_config.vocab_size
    prefix = random_tokens(prefix_len, rng, vocab)
    times = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, num_requests - 1))])
    reqs = [WorkloadRequest(prefix + random_tokens(suffix_len, rng, vocab), greedy_params(output_len),
                            float(t)) for t in times]
    desc = (f"{num_requests} requests sharing a {prefix_len}-token system prompt (+{suffix_len} own "
            f"tokens, {output_len} out), Poisson at {rate:.2f} req/s")
    return Workload("shared_prefix", desc, reqs), rate


def prefix_cache_compare(engine_or_llm, workload: Workload, progress: bool = True) -> dict:
    """The same workload with prefix caching off, then on (each on an empty cache).
    -> {"off": BenchResult, "on": BenchResult}."""
    out = {}
    for name, on in (("off", False), ("on", True)):
        engine = fresh_engine(engine_or_llm, enable_prefix_caching=on)
        out[name] = bench.replay(engine, workload, progress=progress, warmup=0,
                                 label=device_label(engine))
    return out


def prefix_summary(result: bench.BenchResult) -> dict:
    """Hit rate (prompt tokens served from cache / prompt tokens), prefill tokens computed, TTFT."""
    done = [o for o in result.outputs if completed(o)]
    prompt = sum(len(o.prompt_token_ids) for o in done)
    cached = sum(o.num_cached_tokens for o in done)
    m = compute_metrics(result.outputs)
    return {"prefix caching": "on" if result.config.enable_prefix_caching else "off",
            "hit rate (%)": 100 * cached / prompt if prompt else math.nan,
            "prompt tokens": prompt, "prefill tokens computed": sum(r.num_prefill_tokens for r in result.trace),
            "TTFT p50 (ms)": _ms(m.ttft.median), "TTFT p90 (ms)": _ms(m.ttft.p90),
            "duration (s)": result.duration}


def prefix_table(results: dict) -> Table:
    return Table([prefix_summary(r) for r in results.values()],
                 f"Prefix caching off vs on, {results['on'].device_label}", ".1f")


@dataclass
class EvictionPoint:
    unrelated_requests: int
    unrelated_tokens: int  # prompt tokens of other traffic between the two uses of the prefix
    cached_tokens: int  # of the returning request's prompt, served from the cache
    ttft: float  # of the returning request (s)


def eviction_sweep(engine_or_llm, num_kv_blocks: int, prefix_len: int, unrelated_len: int,
                   counts: Sequence[int], progress: bool = True) -> list[EvictionPoint]:
    """What evicts a cached prefix: a request with the prefix runs, then `n` unrelated requests
    pass through a cache of num_kv_blocks blocks, then the prefix comes back. For each n in
    counts (each on an empty cache): how much of the prefix was still cached, and its TTFT."""
    from tqdm.auto import tqdm
    points = []
    for n in tqdm(counts, desc="unrelated traffic", unit="run", disable=not progress):
        engine = fresh_engine(engine_or_llm, num_kv_blocks=num_kv_blocks, enable_prefix_caching=True)
        prefix = _tokens(engine, prefix_len, 3000)
        generate(engine, [prefix + _tokens(engine, 8, 3001)], greedy_params(2))
        others = [_tokens(engine, unrelated_len, 4000 + i) for i in range(n)]
        for p in others:  # one at a time: the cache sees them in order, as a stream of traffic
            generate(engine, [p], greedy_params(1))
        back = generate(engine, [prefix + _tokens(engine, 8, 3002)], greedy_params(2))[0]
        points.append(EvictionPoint(n, n * unrelated_len, back.num_cached_tokens, ttft(back)))
    return points


# --- 07: measuring a serving system ---------------------------------------------------------

def chat_workload(num_requests: int, rate: float, input_median: int, output_median: int,
                  vocab_size: int, seed: int = 0, name: str = "chat") -> Workload:
    """Long-tailed prompt and answer lengths (log-normal, as chat traffic), Poisson arrivals."""
    return synthetic(num_requests, LogNormal(input_median, 0.5, 8, 8 * input_median),
                     LogNormal(output_median, 0.6, 2, 8 * output_median), rate, seed=seed,
                     vocab_size=vocab_size, name=name)


def chat_maker(engine_or_llm, num_requests: int, input_median: int, output_median: int,
               seed: int = 3):
    """make_workload(rate) for sweeps and dashboards: the same requests, arriving at `rate`."""
    vocab = _engine(engine_or_llm).model_config.vocab_size

    def make(rate: float) -> Workload:
        return chat_workload(num_requests, rate, input_median, output_median, vocab, seed=seed)
    return make


@dataclass
class DeviceModel:
    """The simulator's cost model fitted to a measured run on this device (sim.calibrate)."""

    calibration: object  # sim.Calibration
    result: bench.BenchResult  # the measured run it was fitted to
    num_kv_blocks: int
    config: EngineConfig
    label: str  # "modelled: calibrated on <device>"

    @property
    def cost_model(self):
        return self.calibration.cost_model

    @property
    def model_config(self):
        return self.result.model_config

    def simulate(self, workload: Workload, **config):
        """Run `workload` through the real scheduler on this device's fitted cost model."""
        from nanoserve.sim import simulate
        cfg = replace(self.config, num_kv_blocks=self.num_kv_blocks, **config)
        return simulate(workload, self.model_config, self.cost_model, cfg, self.result.dtype)


def calibrate_device(engine_or_llm, num_requests: int, input_median: int, output_median: int,
                     progress: bool = True, seed: int = 0) -> DeviceModel:
    """Measure a varied offline run (prompts of many lengths, half of them queued at a time, so
    steps mix prefill chunks with decode batches of many sizes) and fit the simulator's cost
    model to its step times (sim.calibrate). The fit error is in `.calibration.describe()`."""
    from nanoserve.sim import calibrate
    engine = fresh_engine(engine_or_llm, max_num_seqs=max(2, num_requests // 2))
    wl = chat_workload(num_requests, math.inf, input_median, output_median,
                       engine.model_config.vocab_size, seed=seed + 7, name="calibration")
    res = bench.replay(engine, wl, realtime=False, progress=progress, warmup=1,
                       label=device_label(engine))
    cal = calibrate(res.trace, res.model_config, res.dtype, res.outputs,
                    label=f"calibrated on {res.device_label.removeprefix('measured on ')}")
    return DeviceModel(cal, res, engine.num_kv_blocks, _engine(engine_or_llm).config,
                       f"modelled: {cal.cost_model.label}")


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


def measured_capacity(result: bench.BenchResult) -> float:
    """Requests/s of an offline run (everything queued at t=0): what the device serves flat out."""
    return result.metrics().request_throughput


def workload_shift(engine_or_llm, num_requests: int, rate: float, input_median: int,
                   output_median: int, longer_output_median: int, progress: bool = True) -> dict:
    """The same server measured on two weeks of traffic: in the second, answers are longer
    (output median longer_output_median) and requests come proportionally less often, so the
    output tokens per second asked of the server are the same. -> {"before": ..., "after": ...}."""
    vocab = _engine(engine_or_llm).model_config.vocab_size
    before = chat_workload(num_requests, rate, input_median, output_median, vocab, seed=21,
                           name="before")
    after = chat_workload(num_requests, rate * output_median / longer_output_median, input_median,
                          longer_output_median, vocab, seed=22, name="after")
    return {w.name: measure_workload(engine_or_llm, w, progress=progress) for w in (before, after)}


def metrics_table(results: dict, slo: dict | None = None) -> Table:
    """Headline metrics of several runs (name -> BenchResult or SimResult), in milliseconds."""
    rows = []
    for name, r in results.items():
        m = compute_metrics(r.outputs, slo=slo)
        row = {"run": name, "requests": m.completed, "out tok (mean)": m.total_output_tokens / max(m.completed, 1)}
        for k in ("ttft", "tpot", "itl", "e2e"):
            s = getattr(m, k)
            row[f"{k.upper()} p50"], row[f"{k.upper()} p99"] = _ms(s.median), _ms(s.p99)
        if slo is not None:
            row["goodput (req/s)"], row["attained (%)"] = m.goodput, 100 * m.slo_attainment
        rows.append(row)
    return Table(rows, "latencies in ms", ".1f")


def stratified_table(results: dict, metric: str = "e2e", buckets=(1, 16, 32, 64, 128)) -> Table:
    """Median `metric` per output-length bucket, one column per run: like with like."""
    strat = {name: stratify(r.outputs, metric, "output", buckets) for name, r in results.items()}
    labels = list(dict.fromkeys(s.label for st in strat.values() for s in st.strata))
    rows = []
    for lab in labels:
        row = {"output tokens": lab}
        for name, st in strat.items():
            s = next((s for s in st.strata if s.label == lab), None)
            row[f"{name}: n"] = s.num_requests if s else 0
            row[f"{name}: median {metric} (ms)"] = _ms(s.summary.median) if s else math.nan
        rows.append(row)
    return Table(rows, f"{metric.upper()} stratified by output length", ".1f")


@dataclass
class RatePoint:
    rate: float  # offered requests/s
    result: object  # BenchResult (measured) or SimResult (modelled)
    throughput: float  # completed requests/s
    goodput: float  # requests/s within the SLO
    attainment: float  # fraction of requests within the SLO


def rate_sweep(engine_or_llm, rates: Sequence[float], make_workload, slo: dict,
               progress: bool = True, **config) -> list[RatePoint]:
    """Measured: replay make_workload(rate) at each rate; throughput and goodput under `slo`."""
    from tqdm.auto import tqdm
    points = []
    for rate in tqdm(list(rates), desc="arrival rates", unit="run", disable=not progress):
        res = measure_workload(engine_or_llm, make_workload(rate), progress=False, **config)
        m = res.metrics(slo)
        points.append(RatePoint(rate, res, m.request_throughput, m.goodput, m.slo_attainment))
    return points


def simulated_rate_sweep(model: DeviceModel, rates: Sequence[float], make_workload, slo: dict,
                         **config) -> list[RatePoint]:
    """Modelled: the same sweep on the calibrated simulator."""
    points = []
    for rate in rates:
        res = model.simulate(make_workload(rate), **config)
        m = res.metrics(slo)
        points.append(RatePoint(rate, res, m.request_throughput, m.goodput, m.slo_attainment))
    return points


# --- 08: cost -------------------------------------------------------------------------------

def default_price_per_hour(device: str | None = None) -> tuple[float, str]:
    """A placeholder price to start from (an assumption, not a quote): set your own."""
    if device_kind(device) == "cuda":
        return 3.0, "assumed on-demand price of one datacenter GPU; set your own"
    return 0.10, "assumed price of a small cloud VM (a few vCPUs); set your own"


def batch_cap_runs(engine_or_llm, caps: Sequence[int], num_requests: int, input_len: int,
                   output_len: int, progress: bool = True, seed: int = 0) -> dict:
    """The same offline workload (everything queued at t=0) at each max_num_seqs cap, measured.
    -> {cap: BenchResult}."""
    from tqdm.auto import tqdm
    engine = _engine(engine_or_llm)
    wl = synthetic(num_requests, input_len, output_len, math.inf, seed=seed,
                   vocab_size=engine.model_config.vocab_size, name="offline batch")
    out = {}
    for cap in tqdm(list(caps), desc="batch caps", unit="run", disable=not progress):
        out[cap] = measure_workload(engine, wl, progress=False, max_num_seqs=cap,
                                    enable_prefix_caching=False,
                                    max_num_batched_tokens=max(engine.config.max_num_batched_tokens,
                                                               input_len + cap))
    return out


def run_cost(result: bench.BenchResult, price_per_hour: float):
    """cost.cost_report of a measured run, charging its whole duration, billed tokens."""
    from nanoserve.cost import billed_tokens, cost_report
    n_in, n_out = billed_tokens(result.outputs)
    return cost_report(result.trace, price_per_hour, result.duration, n_in, n_out)


def cost_rows(runs: dict, price_per_hour: float, slo: dict | None = None) -> Table:
    """$/1M input and output tokens per run (name -> BenchResult) at one price per hour."""
    rows = []
    for name, r in runs.items():
        c = run_cost(r, price_per_hour)
        m = r.metrics(slo)
        row = {"max_num_seqs": name, "tok/s out": m.output_throughput,
               "TPOT p50 (ms)": _ms(m.tpot.median), "$/1M in": c.usd_per_1m_input,
               "$/1M out": c.usd_per_1m_output, "out/in": c.output_input_ratio}
        if slo is not None:
            row["within SLO (%)"] = 100 * m.slo_attainment
        rows.append(row)
    return Table(rows, f"at ${price_per_hour:.2f}/h, {next(iter(runs.values())).device_label}", ".3g")


def tpot_slo(engine_or_llm, input_len: int, factor: float = 2.0) -> dict:
    """A streaming-speed SLO for offline runs (where TTFT is queueing by construction): TPOT <=
    factor x the TPOT of one request running alone here (measured)."""
    return {"tpot": _round_up(factor * unloaded_latency(engine_or_llm, input_len)["tpot"])}


def evaluate_caps(runs: dict, price_per_hour: float, slo: dict, min_attainment: float = 0.9) -> list:
    """cost.evaluate_runs over the batch-cap runs: metrics, cost and whether each meets the SLO."""
    from nanoserve.cost import Run, evaluate_runs
    return evaluate_runs([Run(str(k), r.outputs, r.trace, price_per_hour, r.duration)
                          for k, r in runs.items()], slo, min_attainment)


def provider_table(measured_ratio: float | None = None) -> Table:
    """Providers' list prices (USD per 1M tokens; source and date) beside this device's ratio."""
    from nanoserve.cost import PROVIDER_PRICES
    rows = [{"who": name, "$/1M in": p.input_per_1m, "$/1M out": p.output_per_1m,
             "out/in": p.ratio, "source": f"list price, {p.source}, {p.date}"}
            for name, p in PROVIDER_PRICES.items()]
    if measured_ratio is not None:
        rows.append({"who": "this device (measured)", "$/1M in": math.nan, "$/1M out": math.nan,
                     "out/in": measured_ratio, "source": "this notebook"})
    return Table(rows, "Output/input price ratio", ".3g")


# --- 09: disaggregation ---------------------------------------------------------------------

def validation_table(model: DeviceModel, workload: Workload, measured: bench.BenchResult) -> Table:
    """Measured vs modelled TTFT and ITL (median, p99) for one workload, with the error."""
    sim = model.simulate(workload)
    mm, ms = measured.metrics(), sim.metrics()
    rows = []
    for k in ("ttft", "itl", "e2e"):
        for stat in ("median", "p99"):
            a, b = getattr(getattr(mm, k), stat), getattr(getattr(ms, k), stat)
            rows.append({"metric": f"{k.upper()} {stat}", "measured (ms)": _ms(a),
                         "modelled (ms)": _ms(b), "error (%)": 100 * (b - a) / a if a else math.nan})
    return Table(rows, f"{workload.name}: {measured.device_label} vs {model.label}", ".1f")


def kv_transfer_table(model_name: str = "llama-3-8b", device: str = "H100-SXM",
                      prompt_lens: Sequence[int] = (512, 2048, 8192), dtype: str = "bfloat16") -> Table:
    """What disaggregation adds: moving a prompt's KV over each link vs computing its prefill
    (modelled: datasheet link bandwidths and device profile)."""
    from nanoserve.roofline import dtype_bytes, step_cost
    from nanoserve.sim import CostModel
    from nanoserve.sim_devices import DEVICES, LINKS, kv_bytes_per_token, model_shape
    cfg, prof = model_shape(model_name), DEVICES[device]
    cm = CostModel.from_profile(prof, dtype)
    per_tok = kv_bytes_per_token(cfg, dtype)
    rows = []
    for n in prompt_lens:
        row = {"prompt tokens": n, "KV (MB)": n * per_tok / 1e6,
               f"prefill on {prof.name} (ms)": _ms(cm.step_time(step_cost(cfg, [(n, n, True)],
                                                                          dtype_bytes(dtype)), 1))}
        for key, link in LINKS.items():
            row[f"{link.name} (ms)"] = _ms(n * per_tok / link.bandwidth)
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

    device: object  # sim_devices.DeviceProfile (datasheet) or sim.CostModel (calibrated here)
    label: str  # "modelled: ..." for figure titles
    model_config: object
    config: EngineConfig
    make_workload: object  # rate -> Workload
    rates: list[float]
    total: int = 4  # instances in either layout
    dtype: str = "bfloat16"
    cache: dict = field(default_factory=dict)

    def colocated(self) -> list:
        from nanoserve.disagg import simulate_colocated
        key = ("colocated",)
        if key not in self.cache:
            self.cache[key] = [simulate_colocated(self.make_workload(r), self.model_config, self.device,
                                                  self.total, self.config, self.dtype) for r in self.rates]
        return self.cache[key]

    def disaggregated(self, num_prefill: int, link_bandwidth: float) -> list:
        from nanoserve.disagg import simulate_disaggregated
        from nanoserve.sim_devices import Link
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
    from nanoserve.disagg import simulate_colocated
    from nanoserve.sim_devices import DEVICES, model_shape
    prof, cfg = DEVICES[device], model_shape(model)
    config = EngineConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=128)
    flat = simulate_colocated(disagg_workload(math.inf, num_requests, cfg.vocab_size), cfg, prof, total, config)
    cap = num_requests / flat.metrics().duration
    rates = [round(cap * 2 * (k + 1) / num_rates, 2) for k in range(num_rates)]

    def make(rate):
        return disagg_workload(rate, num_requests, cfg.vocab_size)
    return DisaggStudy(prof, f"modelled: {model} on {prof.name} (datasheet profile)", cfg, config, make,
                       rates, total)


def calibrated_study(model: DeviceModel, make_workload, rates: Sequence[float], total: int = 2) -> DisaggStudy:
    """A study on this device's calibrated cost model (modelled, fitted to a measured run)."""
    config = replace(model.config, num_kv_blocks=model.num_kv_blocks)
    return DisaggStudy(model.cost_model, model.label, model.model_config, config, make_workload,
                       list(rates), total, model.result.dtype)
