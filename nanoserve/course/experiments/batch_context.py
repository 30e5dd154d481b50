"""Lesson 03: decode step time over batch size x context length, against the roofline's bytes.

A decode step reads every weight once whatever the batch, and every sequence's whole KV cache:
B sequences at context C read B x C tokens of KV. Batching amortises the weights, never the KV
cache, so at real contexts the KV read overtakes the weights and the step stays memory-bound far
past the batch where the weights alone would reach the ridge point.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nanoserve.course.experiments.batching import decode_batch_sweep
from nanoserve.course.setup import Table, engine_of, progress_bar
from nanoserve.engine.kv_cache import kv_bytes_per_token
from nanoserve.measure import roofline


@dataclass
class GridPoint:
    batch: int
    context_len: int  # KV length of the median decode step
    step_seconds: float  # median decode-only step, measured
    weight_bytes: float  # modelled: the weights (and activations) read by that step
    kv_bytes: float  # modelled: its KV cache read (and this step's K, V, Q, output)
    flops: float  # modelled

    @property
    def kv_tokens(self) -> int:
        return self.batch * self.context_len

    def floor(self, ceilings: roofline.DeviceCeilings, dtype: str) -> float:
        """Roofline floor (seconds) from the measured ceilings."""
        return max((self.weight_bytes + self.kv_bytes) / ceilings.bandwidth,
                   self.flops / ceilings.peak(dtype))


def grid_cells(batches: Sequence[int], contexts: Sequence[int], max_kv_tokens: int) -> dict[int, list[int]]:
    """{context: batches} of the grid, leaving out cells past max_kv_tokens (B x context): the
    sizes a lesson measures in minutes and its KV pool holds."""
    return {c: [b for b in sorted(batches) if b * c <= max_kv_tokens] for c in sorted(contexts)}


def decode_grid(llm, batches: Sequence[int], contexts: Sequence[int], max_kv_tokens: int,
                steps: int = 6, reps: int = 2, progress: bool = True) -> list[GridPoint]:
    """Median decode step of B requests at each context length, with the roofline's bytes and
    FLOPs of that step beside it. Each of `reps` rounds measures every cell once
    (decode_batch_sweep, one round per context), so a burst of other work lands in one round of
    many cells, not in every round of one cell; a cell's time is its median over rounds."""
    engine = engine_of(llm)
    cfg, dtype = engine.model_config, roofline.dtype_name(engine.dtype)
    fits = engine.num_kv_blocks * engine.config.block_size
    cells = {c: bs for c, bs in grid_cells(batches, contexts, min(max_kv_tokens, fits)).items() if bs}
    if cells:  # untimed: the first cell would otherwise pay the one-off costs of a first step
        ctx, bs = next(iter(cells.items()))
        decode_batch_sweep(llm, bs[:1], ctx, 2, 1, progress=False)
    times: dict[tuple[int, int], list[float]] = {}
    with progress_bar(max(1, reps) * len(cells), "batch x context", progress) as bar:
        for r in range(max(1, reps)):
            for ctx, bs in cells.items():
                for p in decode_batch_sweep(llm, bs, ctx, steps, 1, seed=r, progress=False):
                    times.setdefault((p.batch, ctx), []).append(p.step_seconds)
                bar.update(1)
    out = []
    for (batch, ctx), ts in times.items():
        kv_len = ctx + 1 + steps // 2  # the KV length of the middle decode step
        cost = roofline.step_cost(cfg, roofline.decode_batch(batch, kv_len),
                                  roofline.dtype_bytes(dtype))  # the cache is in dtype too
        out.append(GridPoint(batch, kv_len, statistics.median(ts),
                             cost.bytes["linear"] + cost.bytes["lm_head"],
                             cost.bytes["attention"], cost.total_flops))
    return out


def kv_crossover_tokens(llm) -> float:
    """B x context at which a decode step's KV read equals its weight read (modelled)."""
    engine = engine_of(llm)
    cfg, dtype = engine.model_config, roofline.dtype_name(engine.dtype)
    weights = roofline.step_cost(cfg, roofline.decode_batch(1, 1), roofline.dtype_bytes(dtype))
    per_token = kv_bytes_per_token(cfg, engine.kv_cache_dtype)  # an fp8 cache: half of bf16's
    return (weights.bytes["linear"] + weights.bytes["lm_head"]) / per_token


def grid_table(points: Sequence[GridPoint], ceilings: roofline.DeviceCeilings, dtype: str) -> Table:
    rows = [{"batch": p.batch, "context": p.context_len, "B x context": p.kv_tokens,
             "step ms": round(1e3 * p.step_seconds, 2),
             "floor ms (modelled)": round(1e3 * p.floor(ceilings, dtype), 2),
             "KV / weight bytes": round(p.kv_bytes / p.weight_bytes, 2),
             "intensity FLOP/B": round(p.flops / (p.weight_bytes + p.kv_bytes), 2),
             "ridge FLOP/B": round(roofline.ridge_point(ceilings, dtype), 1)} for p in points]
    return Table(rows, "Decode step over batch x context: measured step, modelled bytes")
