"""Lesson 06: a shared system prompt with prefix caching off and on, and what evicts it."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nanoserve.course.scenarios.common import measure_prefill, prompt_tokens, to_ms
from nanoserve.course.setup import Table, engine_of, fresh_engine, generate
from nanoserve.engine import LLM
from nanoserve.measure import bench
from nanoserve.measure.figures import device_label
from nanoserve.measure.metrics import completed, compute_metrics, ttft
from nanoserve.measure.workload import Workload, WorkloadRequest, greedy_params, random_tokens
from nanoserve.sampling_params import SamplingParams


def shared_prompt_demo(llm: LLM, shared: str, own: Sequence[str], max_tokens: int = 24) -> Table:
    """One shared opening (a system prompt) and each request's own text after it, sent one
    after another to one engine: the prompt tokens each took from the prefix cache, its TTFT
    and (with a tokenizer) the start of its greedy continuation. Each prompt also runs on an
    engine with prefix caching off, and the last column says whether the tokens are the same."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    uncached = fresh_engine(llm, enable_prefix_caching=False)
    rows = []
    for text in own:
        prompt = shared + text
        if llm.tokenizer is None:  # a preset without a tokenizer: stand-in ids, same lengths
            prompt = [10 + (ord(c) % 200) for c in prompt]
        o = llm.generate([prompt], params)[0]
        off = generate(uncached, [list(o.prompt_token_ids)], params)[0]
        continuation = (o.text or "(no tokenizer: ids)").replace("\n", " / ")
        rows.append({"own text": textwrap.shorten(text, 40, placeholder=" …"),
                     "prompt tokens": len(o.prompt_token_ids), "from cache": o.num_cached_tokens,
                     "TTFT (ms)": to_ms(ttft(o)),
                     "continuation": textwrap.shorten(continuation, 60, placeholder=" …"),
                     "same tokens, cache off": "yes" if list(off.token_ids) == list(o.token_ids) else "NO"})
    return Table(rows, "One shared opening, then each request's own text, one request at a time; "
                       "again with prefix caching off", ".1f")


def shared_prefix_workload(engine_or_llm, num_requests: int, prefix_len: int, suffix_len: int,
                           output_len: int, load: float = 0.6, seed: int = 0) -> tuple[Workload, float]:
    """One system prompt of prefix_len tokens shared by every request (own suffix each),
    Poisson arrivals at `load` times what uncached prefills can keep up with here (measured).
    -> (workload, rate in requests/s)."""
    engine = engine_of(engine_or_llm)
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


def prefix_cache_compare(engine_or_llm, workload: Workload, progress: bool = True,
                         kv_manager_cls=None) -> dict:
    """The same workload with prefix caching off, then on (each on an empty cache); with
    kv_manager_cls (exercise 6's pool, course.exercise_plugins), once more on that cache, prompts
    whole (it admits whole prompts). -> {"off": BenchResult, "on": BenchResult[, "yours": ...]}."""
    runs = [("off", False, None, {}), ("on", True, None, {})]
    if kv_manager_cls is not None:
        longest = max(len(r.prompt_token_ids) for r in workload.requests)
        budget = max(engine_of(engine_or_llm).config.max_num_batched_tokens, longest + 64)
        runs.append(("yours", True, kv_manager_cls,
                     dict(enable_chunked_prefill=False, max_num_batched_tokens=budget)))
    out = {}
    for name, on, kv_cls, extra in runs:
        engine = fresh_engine(engine_or_llm, kv_manager_cls=kv_cls, enable_prefix_caching=on, **extra)
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
            "prompt tokens": prompt,
            "prefill tokens computed": sum(r.num_prefill_tokens for r in result.trace),
            "TTFT p50 (ms)": to_ms(m.ttft.median), "TTFT p90 (ms)": to_ms(m.ttft.p90),
            "duration (s)": result.duration}


LABELS = {"off": "off", "on": "on", "yours": "on, your ex06 pool"}


def prefix_table(results: dict) -> Table:
    return Table([{**prefix_summary(r), "prefix caching": LABELS.get(k, k)} for k, r in results.items()],
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
    for n in tqdm(counts, desc="unrelated traffic", unit="run", disable=not progress, leave=False):
        engine = fresh_engine(engine_or_llm, num_kv_blocks=num_kv_blocks, enable_prefix_caching=True)
        prefix = prompt_tokens(engine, prefix_len, 3000)
        generate(engine, [prefix + prompt_tokens(engine, 8, 3001)], greedy_params(2))
        others = [prompt_tokens(engine, unrelated_len, 4000 + i) for i in range(n)]
        for p in others:  # one at a time: the cache sees them in order, as a stream of traffic
            generate(engine, [p], greedy_params(1))
        back = generate(engine, [prefix + prompt_tokens(engine, 8, 3002)], greedy_params(2))[0]
        points.append(EvictionPoint(n, n * unrelated_len, back.num_cached_tokens, ttft(back)))
    return points


def prefix_answers(results: dict) -> dict:
    """What lesson 06 asks the learner to predict, measured: the hit rate with caching on and how
    many times shorter the median TTFT is than with it off."""
    off, on = prefix_summary(results["off"]), prefix_summary(results["on"])
    return {"hit rate (%)": on["hit rate (%)"],
            "TTFT p50, off / on": off["TTFT p50 (ms)"] / on["TTFT p50 (ms)"]}


def first_eviction(points: Sequence[EvictionPoint]) -> float:
    """The fewest unrelated requests after which the returning prefix found fewer tokens cached
    than with no traffic in between (inf: none of the counts tried evicted any)."""
    full = max(p.cached_tokens for p in points)
    return next((p.unrelated_requests for p in sorted(points, key=lambda p: p.unrelated_requests)
                 if p.cached_tokens < full), math.inf)
