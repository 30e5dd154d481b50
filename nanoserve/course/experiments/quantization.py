"""Lesson 13: fewer bytes per weight, measured: batch-1 decode against its roofline floor for each
weight format, and a compute-bound prefill, which fewer bytes do not speed up.

A weight format is (model dtype, quantization, lm_head as codes): "float32", "bfloat16", "int8" and
"fp8" (8-bit codes with per-channel scales beside bf16 activations, LLM(model, quantization=...)),
and "int8 + lm_head" (the lm_head as codes too, EngineConfig.quantization_lm_head). The floor of a
decode step is the bytes it must read (every linear weight at its format's width, the embedding's
rows, the KV cache) over the bandwidth this device measured (measure.roofline); the step time is
the engine's own, replayed here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from nanoserve.config import EngineConfig
from nanoserve.course.experiments.kv_dtype import alternating_step_times
from nanoserve.course.table import Table
from nanoserve.engine.llm import LLM, engine_of
from nanoserve.measure import roofline
from nanoserve.measure.workload import synthetic

# format -> (model dtype, quantization, the lm_head as codes too)
WEIGHT_FORMATS = {"float32": ("float32", None, False), "bfloat16": ("bfloat16", None, False),
                  "int8": ("bfloat16", "int8", False), "fp8": ("bfloat16", "fp8", False),
                  "int8 + lm_head": ("bfloat16", "int8", True)}

# the price in quality: each variant's EngineConfig fields, beside the unquantized engine's
QUALITY_VARIANTS = {"fp8 KV": {"kv_cache_dtype": "fp8"}, "int8 weights": {"quantization": "int8"},
                    "int8 + lm_head": {"quantization": "int8", "quantization_lm_head": True},
                    "fp8 weights": {"quantization": "fp8"}}


def load(model: str, weight_format: str, kv_cache_dtype: str = "auto", **config) -> LLM:
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}; choose from {list(WEIGHT_FORMATS)}")
    dtype, quantization, lm_head = WEIGHT_FORMATS[weight_format]
    return LLM(model, None, dtype, config=EngineConfig(quantization=quantization,
                                                        quantization_lm_head=lm_head,
                                                        kv_cache_dtype=kv_cache_dtype, **config))


def decode_step_cost(llm, batch: int, context: int) -> roofline.StepCost:
    """What a decode step of `llm` must read at least (modelled: measure.roofline.stored_step_cost):
    its linears' weights and lm_head as they are stored (8-bit codes and their scales, or the model
    dtype), activations in the model dtype, KV in the cache's."""
    engine = engine_of(llm)
    return roofline.stored_step_cost(engine.model, engine.model_config, roofline.decode_batch(batch, context),
                                     engine.dtype.itemsize, engine.kv_cache_dtype.itemsize)


def decode_floor(llm, batch: int, context: int, ceilings) -> tuple[float, float]:
    """(bytes, seconds) a decode step of `llm` must read at least, over this device's bandwidth."""
    cost = decode_step_cost(llm, batch, context)
    return cost.total_bytes, cost.total_bytes / ceilings.bandwidth


def kv_share(llm, batch: int, context: int) -> float:
    """The share of a decode step's bytes (decode_step_cost) that its attention reads: K and V, with
    the queries and outputs beside them, the only part a cache dtype can change."""
    cost = decode_step_cost(llm, batch, context)
    return cost.bytes["attention"] / cost.total_bytes


@dataclass
class WeightRow:
    weight_format: str
    weight_bytes: float  # bytes a decode step reads at least
    floor_s: float
    itl_s: float  # measured batch-1 decode step

    @property
    def share_of_floor(self) -> float:
        return self.floor_s / self.itl_s


def weight_formats_itl(model: str, formats, context: int, steps: int, ceilings,
                       rounds: int = 3) -> list[WeightRow]:
    """Each format's batch-1 decode step on this device against its floor, the formats timed in
    alternating rounds (kv_dtype.alternating_step_times)."""
    blocks = -(-(context + steps + 2) // EngineConfig.block_size) + 2
    llms = {fmt: load(model, fmt, num_kv_blocks=blocks) for fmt in formats}
    itl = alternating_step_times(llms, 1, context, steps, rounds)
    return [WeightRow(fmt, *decode_floor(llm, 1, context, ceilings), itl[fmt]) for fmt, llm in llms.items()]


def weights_table(rows: list[WeightRow]) -> Table:
    base = rows[0]
    return Table([{"weights": r.weight_format, "MB read a step (floor)": r.weight_bytes / 1e6,
                   "floor ms": 1e3 * r.floor_s, "measured ITL ms": 1e3 * r.itl_s,
                   "floor / measured": f"{r.share_of_floor:.0%}",
                   f"speed-up vs {base.weight_format}": round(base.itl_s / r.itl_s, 2)} for r in rows],
                 "Batch-1 decode: measured on this device; floor modelled from its measured bandwidth",
                 ".3g")


def prefill_time(llm, prompt_len: int, reps: int = 3) -> float:
    """Median seconds of one prefill step of a prompt_len-token prompt (the whole prompt in one
    step: max_num_batched_tokens must allow it)."""
    engine = engine_of(llm)
    if engine.config.max_num_batched_tokens < prompt_len:  # else it is chunked and no step is timed
        raise ValueError(f"prompt_len={prompt_len} is more than this engine's max_num_batched_tokens="
                         f"{engine.config.max_num_batched_tokens}: one step cannot prefill it")
    times = []
    for seed in range(reps):
        workload = synthetic(1, prompt_len, 1, seed=seed, vocab_size=engine.model_config.vocab_size)
        first = len(engine.trace)
        for r in workload:
            engine.add_request(r.prompt_token_ids, r.params)
        while engine.has_unfinished():
            engine.step()
        times += [s.duration for s in engine.trace[first:] if s.num_prefill_tokens == prompt_len]
    return statistics.median(times)


def prefill_times(model: str, prompt_len: int) -> dict[str, float]:
    """prefill_time of one prompt_len-token prompt with bf16 weights, int8 weights and an fp8 cache."""
    tokens = prompt_len + 8
    times = {}
    for name, weight_format, kv in (("bf16", "bfloat16", "auto"), ("int8 weights", "int8", "auto"),
                                    ("fp8 KV", "bfloat16", "fp8")):
        llm = load(model, weight_format, kv, num_kv_blocks=-(-tokens // EngineConfig.block_size) + 2,
                   max_num_batched_tokens=tokens)
        times[name] = prefill_time(llm, prompt_len)
        del llm  # one model at a time in memory
    return times
