"""Measurements behind lessons 05-09: interference, prefix caching, serving metrics, cost, disaggregation.

Every function here either runs the real engine on this device (bench.replay: a workload
replayed in real time) or the simulator calibrated on this device, and returns plain data: a
notebook cell prints it, a figure in `nanoserve.course.widgets` draws it. One module per lesson, all
re-exported here, so a notebook writes `from nanoserve.course import scenarios` and calls
`scenarios.interference_grid(...)`:

  common.py          probes (a decode step, a prefill, one request alone), a workload replayed
  interference.py    05: a long prefill stalls decoders; chunked prefill at several budgets
  prefix.py          06: a shared system prompt with prefix caching off and on; eviction
  chat.py            06, 07, 10: real chats with the real model (a shared system prompt, real
                     lengths, a chat over HTTP)
  serving.py         07: metrics, stratification, goodput; the simulator calibrated here
  pricing.py         08: $ per 1M input / output tokens, at a price per hour and at an SLO
  disaggregation.py  09: the simulator checked here; colocated vs disaggregated serving
  disagg_real.py     09: a real prefill and decode instance with a KV transfer, against one engine
                     (a module of its own: `scenarios.disagg_real.run_layouts(...)`, imported on
                     first use: it brings the HTTP server's packages, which lessons 05-08 don't need)

Shared set-up (sizes, loading, fresh engines) is course.setup. Deliberately left out: figures
and widgets (course.widgets) and engine logic of any kind.
"""

from nanoserve.course.scenarios.chat import (
    QUESTIONS,
    SYSTEM_PROMPT,
    ChatModel,
    ChatReply,
    chat_over_http,
    lengths_table,
    load_chat_model,
    real_chat_lengths,
    real_model_server,
    replay_maker,
    replies_table,
    shared_system_prompt_demo,
)
from nanoserve.course.scenarios.common import (
    measure_decode_step,
    measure_prefill,
    measure_workload,
    unloaded_latency,
    unloaded_slo,
)
from nanoserve.course.scenarios.disaggregation import (
    DisaggStudy,
    calibrated_study,
    datasheet_study,
    disagg_workload,
    kv_transfer_table,
    layout_table,
    validation_table,
)
from nanoserve.course.scenarios.interference import (
    InterferenceRun,
    InterferenceSetup,
    interference_answers,
    interference_grid,
    interference_setup,
    interference_table,
    run_interference,
)
from nanoserve.course.scenarios.prefix import (
    EvictionPoint,
    eviction_sweep,
    first_eviction,
    prefix_answers,
    prefix_cache_compare,
    prefix_summary,
    prefix_table,
    shared_prefix_workload,
    shared_prompt_demo,
)
from nanoserve.course.scenarios.pricing import (
    batch_cap_runs,
    cost_rows,
    default_price_per_hour,
    evaluate_caps,
    kv_memory_table,
    prefix_discount_table,
    provider_table,
    run_cost,
    tpot_slo,
)
from nanoserve.course.scenarios.serving import (
    DeviceModel,
    PromptSweep,
    RatePoint,
    calibrate_device,
    chat_maker,
    chat_workload,
    length_buckets,
    load_table,
    measured_capacity,
    metrics_table,
    p50_ratio,
    peak_goodput_fraction,
    rate_sweep,
    simulated_rate_sweep,
    stratified_table,
    ttft_by_input,
    workload_shift,
)


def __getattr__(name: str):
    if name == "disagg_real":
        import importlib
        return importlib.import_module(f"{__name__}.disagg_real")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "QUESTIONS", "SYSTEM_PROMPT", "ChatModel", "ChatReply", "chat_over_http", "lengths_table",
    "load_chat_model", "real_chat_lengths", "real_model_server", "replay_maker", "replies_table",
    "shared_system_prompt_demo",
    "DeviceModel", "DisaggStudy", "EvictionPoint", "InterferenceRun", "InterferenceSetup",
    "PromptSweep", "RatePoint", "batch_cap_runs", "calibrate_device", "calibrated_study", "chat_maker",
    "chat_workload", "cost_rows", "datasheet_study", "default_price_per_hour",
    "disagg_workload", "evaluate_caps", "eviction_sweep", "first_eviction", "prefix_answers",
    "interference_answers", "interference_grid", "interference_setup", "interference_table",
    "kv_transfer_table", "layout_table", "length_buckets", "measure_decode_step", "measure_prefill",
    "load_table", "measure_workload", "measured_capacity", "metrics_table", "p50_ratio",
    "peak_goodput_fraction", "prefix_cache_compare",
    "prefix_summary", "prefix_table", "kv_memory_table", "prefix_discount_table", "provider_table",
    "rate_sweep", "run_cost",
    "run_interference", "shared_prefix_workload", "shared_prompt_demo", "simulated_rate_sweep",
    "stratified_table", "tpot_slo", "ttft_by_input", "unloaded_latency", "unloaded_slo",
    "validation_table", "workload_shift",
]
