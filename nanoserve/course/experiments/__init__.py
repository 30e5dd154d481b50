"""Measurements behind lessons 00-04 and 11: the device's ceilings, the two phases, the KV cache,
batched decode, continuous batching, and where a step's time goes (host work, CUDA graphs,
preemption at a small KV pool). One module per idea; everything is re-exported here,
so a notebook writes `from nanoserve.course import experiments as ex` and calls
`ex.prefill_sweep(...)`.

Each function runs real requests through nanoserve on this device (or times plain torch
matmuls) and returns plain data: a notebook prints it, a figure in course.figures draws it. Timings
come from the engine's own clock (its step trace and each request's timestamps), so they
include scheduling, input preparation and sampling; they are medians over repetitions.
Experiments run on `setup.fresh_engine` engines over the loaded model with the knobs they
need (no prefix cache, one-step prefills, a large enough batch cap), so a lesson loads its
weights once. Whatever is not measured is computed from a formula and says so in its title:
the KV cache of other models, FLOP counts, datasheet ridge points, the simulated toy.

Sizes come from `course.setup.sizes(lesson)`: small in quick mode (NANOSERVE_QUICK=1), sized
for the device otherwise. Deliberately left out: figures (course.figures), lessons 05-10
(course.scenarios).
"""

from nanoserve.course.experiments.batch_context import (
    GridPoint,
    decode_grid,
    grid_cells,
    grid_table,
    kv_crossover_tokens,
)
from nanoserve.course.experiments.batching import (
    DecodePoint,
    GoodputPoint,
    PrefillBatchPoint,
    batch_floors,
    batching_gain_table,
    compare_policies,
    datasheet_critical_batches,
    decode_batch_sweep,
    decode_points,
    decode_table,
    goodput_points,
    goodput_table,
    itl_target,
    policy_table,
    prefill_batch_sweep,
    scaling_knee,
    serving_workload,
    toy_policy_steps,
)
from nanoserve.course.experiments.capacity import KVCapacity, datasheet_capacity, kv_capacity
from nanoserve.course.experiments.device import (
    LinearPoint,
    device_ceilings,
    linear_sweep,
    linear_table,
    weight_read_table,
)
from nanoserve.course.experiments.host_time import HostSplit, eager_on_off, host_split, host_table
from nanoserve.course.experiments.kv import (
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
)
from nanoserve.course.experiments.phases import (
    DecodeContextPoint,
    PhaseRun,
    PrefillFit,
    PrefillPoint,
    counted_prefill_flops,
    decode_context_sweep,
    decode_context_table,
    decode_floors,
    fit_prefill,
    prefill_outlook,
    prefill_sweep,
    roofline_points,
    two_phases,
)
from nanoserve.course.experiments.preemption import (
    PoolRun,
    PreemptionStudy,
    preemption_study,
    small_pool_blocks,
)
from nanoserve.course.experiments.replicas import replica_table

__all__ = [
    "AllocatorCheck", "DecodeContextPoint", "DecodePoint", "FragmentationRun", "Generation",
    "GoodputPoint", "LinearPoint", "PhaseRun", "PrefillBatchPoint", "PrefillFit", "PrefillPoint",
    "batch_floors", "batching_gain_table", "cache_table", "check_kv_allocator", "compare_policies",
    "counted_prefill_flops", "datasheet_critical_batches", "decode_batch_sweep", "decode_context_sweep",
    "decode_context_table", "decode_floors", "decode_points", "decode_table", "device_ceilings",
    "fit_prefill", "fragmentation_run", "fragmentation_workload", "generate_with_cache",
    "generate_without_cache", "goodput_points", "goodput_table", "itl_target", "kv_budget_table",
    "linear_sweep", "linear_table", "policy_table", "prefill_batch_sweep", "prefill_outlook",
    "prefill_sweep", "roofline_points", "scaling_knee", "serving_workload", "toy_policy_steps",
    "two_phases", "weight_read_table",
    "GridPoint", "KVCapacity", "datasheet_capacity", "decode_grid", "grid_cells", "grid_table",
    "kv_capacity", "kv_crossover_tokens", "replica_table",
    "HostSplit", "PoolRun", "PreemptionStudy", "eager_on_off", "host_split", "host_table",
    "preemption_study", "small_pool_blocks",
]
