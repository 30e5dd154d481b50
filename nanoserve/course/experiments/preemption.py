"""Lesson 11: a KV pool too small for the batch. The scheduler admits requests while their prompts
fit, their decodes then outgrow the pool, and it preempts the latest admitted (vLLM's recompute
preemption: blocks freed, the request back at the head of the queue, its prompt and generated
tokens prefilled again later). What that costs: preemptions, the prefill tokens computed beyond
the prompts (the recompute), and TTFT / ITL against the same requests at the default pool.
Prefix caching is off, so every recomputed token is computed again rather than found cached."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from nanoserve.course.setup import Table, engine_of, fresh_engine, generate, random_prompt
from nanoserve.measure.metrics import itls, ttft
from nanoserve.measure.workload import greedy_params


@dataclass
class PoolRun:
    """The same requests at one KV pool size."""

    num_kv_blocks: int
    requests: int
    finished: int  # requests that finished with all their max_tokens tokens
    preemptions: int
    recomputed_tokens: int  # prefill tokens computed beyond the prompts' own
    steps: int
    ttft_median_ms: float
    itl_median_ms: float
    itl_max_ms: float
    token_ids: list[list[int]]


@dataclass
class PreemptionStudy:
    small: PoolRun
    default: PoolRun

    @property
    def same_output(self) -> bool:
        """Greedy tokens of every request identical at both pools."""
        return self.small.token_ids == self.default.token_ids

    @property
    def matching(self) -> int:
        """Requests whose greedy tokens are identical at both pools."""
        return sum(a == b for a, b in zip(self.small.token_ids, self.default.token_ids))

    def table(self) -> Table:
        rows = [dict(pool=name, **{"KV blocks": r.num_kv_blocks}, finished=f"{r.finished}/{r.requests}",
                     preemptions=r.preemptions, **{"recomputed tokens": r.recomputed_tokens},
                     steps=r.steps, **{"TTFT median ms": r.ttft_median_ms,
                                       "ITL median ms": r.itl_median_ms, "ITL max ms": r.itl_max_ms})
                for name, r in (("small", self.small), ("default", self.default))]
        return Table(rows, "the same requests at a small KV pool and at the default one"
                           f" (greedy output identical: {'yes' if self.same_output else 'NO'})")


def _run(llm, prompts, max_tokens: int, num_kv_blocks: int, max_num_seqs: int) -> PoolRun:
    engine = fresh_engine(llm, num_kv_blocks=num_kv_blocks, enable_prefix_caching=False,
                          max_num_seqs=max_num_seqs)
    outs = generate(engine, prompts, greedy_params(max_tokens))
    stats = engine.stats
    gaps = [g for o in outs for g in itls(o)]
    return PoolRun(
        num_kv_blocks, len(prompts),
        sum(o.finish_reason == "length" and len(o.token_ids) == max_tokens for o in outs),
        stats.preemptions, stats.prefill_tokens_computed - sum(map(len, prompts)), stats.steps,
        1e3 * statistics.median(ttft(o) for o in outs),
        1e3 * statistics.median(gaps) if gaps else math.nan,
        1e3 * max(gaps) if gaps else math.nan, [list(o.token_ids) for o in outs])


def small_pool_blocks(llm, prompt_len: int, max_tokens: int, fits: float = 2.0) -> int:
    """A pool that holds `fits` requests at their full length (at least one, so none is refused)."""
    engine = engine_of(llm)
    need = engine.kv_manager.blocks_needed(prompt_len + max_tokens)
    return max(need, math.ceil(fits * need))


def preemption_study(llm, num_requests: int = 8, prompt_len: int = 32, max_tokens: int = 32,
                     small_blocks: int | None = None, seed: int = 0) -> PreemptionStudy:
    """num_requests prompts of prompt_len random tokens, max_tokens greedy tokens each, all at
    once, with room in the batch for all of them: at small_blocks KV blocks (default: room for
    half of them at full length, so most prompts are admitted and their decodes outgrow the
    pool) and at the engine's default pool."""
    engine = engine_of(llm)
    rng = np.random.default_rng(seed)
    prompts = [random_prompt(engine, prompt_len, rng) for _ in range(num_requests)]
    small = small_blocks or small_pool_blocks(engine, prompt_len, max_tokens, num_requests / 2)
    if small > engine.num_kv_blocks:
        raise ValueError(f"small_blocks={small} exceeds the engine's pool of {engine.num_kv_blocks}")
    return PreemptionStudy(_run(engine, prompts, max_tokens, small, num_requests),
                           _run(engine, prompts, max_tokens, engine.num_kv_blocks, num_requests))
