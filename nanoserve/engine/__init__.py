"""The serving core: requests, the scheduler, the paged KV cache, the model runner, the engine.

    LLM             offline batch inference: generate, stream            (llm.py)
    LLMEngine       add_request / step / abort: one scheduler iteration  (llm_engine.py)
    Scheduler       which tokens of which requests run each step         (scheduler.py)
    KVCacheManager  blocks, block tables, the prefix-cache hash chain    (kv_cache.py)
    ModelRunner     a SchedulerOutput -> tensors -> the model -> tokens  (model_runner.py)
    Executor        what the engine needs of whatever runs a step        (executor.py)
"""

from nanoserve.engine.executor import Executor, RequestFailed
from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.llm import LLM, engine_of
from nanoserve.engine.llm_engine import EngineStats, LLMEngine
from nanoserve.engine.model_runner import ModelRunner
from nanoserve.engine.scheduler import Scheduler, SchedulerBase, SchedulerOutput
from nanoserve.engine.trace import StepRecord, TraceEntry

__all__ = ["EngineStats", "Executor", "KVCacheManager", "LLM", "LLMEngine", "ModelRunner",
           "RequestFailed", "Scheduler", "SchedulerBase", "SchedulerOutput", "StepRecord", "TraceEntry",
           "engine_of"]
