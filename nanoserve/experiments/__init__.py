"""Measurements behind lessons 00-04: the device's ceilings, the two phases, the KV cache,
batched decode and continuous batching. One module per idea; everything is re-exported here,
so a notebook writes `from nanoserve import experiments as ex` and calls `ex.prefill_sweep(...)`.

Each function runs real requests through nanoserve on this device (or times plain torch
matmuls) and returns plain data: a notebook prints it, a figure in viz.py draws it. Timings
come from the engine's own clock (its step trace and each request's timestamps), so they
include scheduling, input preparation and sampling; they are medians over repetitions.
Experiments run on `scenarios.fresh_engine` copies of the loaded model with the knobs they
need (no prefix cache, one-step prefills, a large enough batch cap), so a lesson loads its
weights once. Whatever is not measured is computed from a formula and says so in its title:
the KV cache of other models, FLOP counts, datasheet ridge points, the simulated toy.

Sizes come from `sizes(lesson)` (setup.py): small in quick mode (NANOSERVE_QUICK=1), sized for
the device otherwise. Deliberately left out: figures (viz.py), lessons 05-09 (scenarios.py).
"""

from nanoserve.experiments.batching import (
    DecodePoint,
    batch_floors,
    compare_policies,
    datasheet_critical_batches,
    decode_batch_sweep,
    decode_points,
    decode_table,
    goodput_table,
    itl_target,
    policy_table,
    scaling_knee,
    serving_workload,
    toy_policy_steps,
)
from nanoserve.experiments.device import (
    LinearPoint,
    device_ceilings,
    linear_sweep,
    linear_table,
)
from nanoserve.experiments.kv import (
    AllocatorCheck,
    FragmentationRun,
    Generation,
    cache_table,
    check_kv_allocator,
    fragmentation_run,
    fragmentation_workload,
    generate_with_cache,
    generate_without_cache,
    kv_budget_table,
    kv_bytes_per_token,
)
from nanoserve.experiments.phases import (
    PhaseRun,
    PrefillFit,
    PrefillPoint,
    counted_prefill_flops,
    decode_floors,
    fit_prefill,
    prefill_outlook,
    prefill_sweep,
    roofline_points,
    two_phases,
)
from nanoserve.experiments.setup import (
    MODELS,
    SIZES,
    default_dtype,
    device_kind,
    installed,
    lesson_llm,
    lesson_model,
    model_dtype,
    quick_mode,
    sizes,
    text_llm,
)

__all__ = [
    "AllocatorCheck", "DecodePoint", "FragmentationRun", "Generation", "LinearPoint", "MODELS",
    "PhaseRun", "PrefillFit", "PrefillPoint", "SIZES", "batch_floors", "cache_table",
    "check_kv_allocator", "compare_policies", "counted_prefill_flops", "datasheet_critical_batches",
    "decode_batch_sweep", "decode_floors", "decode_points", "decode_table", "default_dtype",
    "device_ceilings", "device_kind", "fit_prefill", "fragmentation_run", "fragmentation_workload",
    "generate_with_cache", "generate_without_cache", "goodput_table", "installed", "itl_target",
    "kv_budget_table", "kv_bytes_per_token", "lesson_llm", "lesson_model", "linear_sweep",
    "linear_table", "model_dtype", "policy_table", "prefill_outlook", "prefill_sweep", "quick_mode",
    "roofline_points", "scaling_knee", "serving_workload", "sizes", "text_llm", "toy_policy_steps",
    "two_phases",
]
