"""Lesson 05: decoders stalled by a long prefill, and chunked prefill at several token budgets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.course.scenarios.common import measure_decode_step, measure_prefill, prompt_tokens, to_ms
from nanoserve.course.setup import Table, engine_of, fresh_engine, generate
from nanoserve.measure import bench
from nanoserve.measure.figures import device_label
from nanoserve.measure.metrics import completed, itls, ttft
from nanoserve.measure.workload import Workload, WorkloadRequest, greedy_params, random_tokens


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
                f"{self.long_prompt_len} tokens arriving every {self.gap:.2f} s. Measured: decoders "
                f"get a token every {to_ms(self.decode_step):.1f} ms; one long prefill takes "
                f"{to_ms(self.long_prefill):.0f} ms.")


def interference_setup(engine_or_llm, num_decoders: int, long_prompt_len: int, num_long: int = 3,
                       min_budget: int = 64, decoder_prompt_len: int = 16, long_output_len: int = 4,
                       seed: int = 0) -> InterferenceSetup:
    """Measure a decode step and a long prefill here, then build the workload: long prompts
    arrive after 8 decode steps and then every 2 long-prefill times (so the decoders recover in
    between), and the decoders generate long enough to outlast the last long prompt's prefill
    at the smallest token budget to be tried (min_budget), with 16 tokens to spare."""
    engine = engine_of(engine_or_llm)
    step = measure_decode_step(engine, num_decoders, decoder_prompt_len)
    prefill = measure_prefill(engine, long_prompt_len)
    warm_chunked_prefill(engine, min_budget, decoder_prompt_len)
    first, gap = 8 * step, 2 * prefill
    chunk_steps = math.ceil(long_prompt_len / max(1, min_budget - num_decoders))
    out_len = int(math.ceil((first + (num_long - 1) * gap) / step)) + chunk_steps + 16
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


def warm_chunked_prefill(engine_or_llm, budget: int, decoder_prompt_len: int = 16):
    """One prompt prefilled in chunks of `budget` tokens beside two decoders, untimed. The probes
    above run whole prefills and pure decodes only; on a GPU the first chunked step compiles
    Triton kernels of its own (on an H200 the first chunked run of lesson 05 showed a 635 ms
    stall that later runs did not), which must not land in the first timed run."""
    engine = fresh_engine(engine_or_llm, enable_prefix_caching=False, enable_chunked_prefill=True,
                          max_num_batched_tokens=budget)
    decoders = [prompt_tokens(engine, decoder_prompt_len, 3000 + i) for i in range(2)]
    generate(engine, [*decoders, prompt_tokens(engine, 2 * budget + 1, 3002)], greedy_params(4))
    return engine


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
        return {"run": self.label, "decoder ITL p50 (ms)": to_ms(np.median(gaps)),
                "decoder ITL p99 (ms)": to_ms(np.percentile(gaps, 99)),
                "decoder ITL max (ms)": to_ms(gaps.max()),
                "long TTFT median (ms)": to_ms(np.median(firsts)),
                "long TTFT max (ms)": to_ms(firsts.max()),
                "steps": len(self.result.trace)}


def run_interference(engine_or_llm, setup: InterferenceSetup, budget: int | None,
                     scheduler=None) -> InterferenceRun:
    """Replay the setup's workload with chunked prefill at `budget` tokens per step, or without
    chunking (budget None: the step budget fits a whole long prompt plus every decoder);
    scheduler: a scheduler class in place of the engine's."""
    whole = setup.long_prompt_len + setup.num_decoders
    engine = fresh_engine(engine_or_llm, scheduler_cls=scheduler, enable_prefix_caching=False,
                          enable_chunked_prefill=budget is not None,
                          max_num_batched_tokens=budget or whole,
                          max_num_seqs=max(engine_of(engine_or_llm).config.max_num_seqs,
                                           setup.num_decoders + len(setup.long_ids)))
    res = bench.replay(engine, setup.workload, progress=False, warmup=0, label=device_label(engine))
    return InterferenceRun(budget, res, setup.long_ids)


def interference_grid(engine_or_llm, setup: InterferenceSetup, budgets: Sequence[int],
                      progress: bool = True, scheduler=None) -> list[InterferenceRun]:
    """No chunking, then each budget: one measured replay each (a progress bar over runs).
    scheduler: a chunked-prefill scheduler class (exercise 5's) for the chunked runs."""
    from tqdm.auto import tqdm
    runs = []
    for b in tqdm([None, *budgets], desc="token budgets", unit="run", disable=not progress, leave=False):
        runs.append(run_interference(engine_or_llm, setup, b, None if b is None else scheduler))
    return runs


def interference_table(runs: Sequence[InterferenceRun]) -> Table:
    return Table([r.summary() for r in runs], f"Interference, {runs[0].result.device_label}", ".1f")


def interference_answers(runs: Sequence[InterferenceRun]) -> dict:
    """What lesson 05 asks the learner to predict, measured: the worst decoder gap without
    chunking and at the smallest budget (runs[1]), and what that budget does to the long
    prompts' median TTFT."""
    whole, small = runs[0].summary(), runs[1].summary()
    return {"worst gap, no chunking (ms)": whole["decoder ITL max (ms)"],
            "worst gap, smallest budget (ms)": small["decoder ITL max (ms)"],
            "long TTFT, smallest budget / no chunking":
                small["long TTFT median (ms)"] / whole["long TTFT median (ms)"]}
