"""The executor interface: what the engine needs of whatever runs a scheduled step.

The engine never looks inside its executor. The ModelRunner runs a real model; the simulator's
SimExecutor advances a clock by a cost model's step time; tests use small fakes. Each does two
things: execute one SchedulerOutput (-> the token sampled for every sequence that reached the end
of its known tokens) and forget requests that finished or were aborted (per-request state such
as a seeded sampler's generator). It also says what it runs: the model's shape, and the device,
dtype and module when there is a real model (None in a simulation).

A failure inside execute_model never poisons the engine. An executor that can tie it to some
requests raises RequestFailed naming them: the engine finishes those with finish_reason "error"
and lets the others go on. Any other exception fails every request of that step (and only them).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

from nanoserve.config import ModelConfig
from nanoserve.engine.scheduler import SchedulerOutput
from nanoserve.errors import InvalidRequest


class RequestFailed(Exception):
    """execute_model failed for some requests only.

    errors: {request_id: message}. sampled: the tokens of the step's other sampling requests
    when the step ran for them (a per-request sampling failure after the forward pass); None
    when nothing of the step can be used: the engine then runs it again without the failed
    requests. invalid_block_ids: blocks the failed requests were to fill by a KV transfer that
    failed (vLLM's get_block_ids_with_load_errors): they leave the prefix cache, and a request
    that took a prefix-cache hit on them is recomputed."""

    def __init__(self, errors: dict[str, str], sampled: dict[str, int] | None = None,
                 invalid_block_ids=frozenset()):
        super().__init__("; ".join(f"request {rid}: {msg}" for rid, msg in errors.items()))
        self.errors, self.sampled, self.invalid_block_ids = errors, sampled, set(invalid_block_ids)


class Executor(abc.ABC):
    model_config: ModelConfig
    model = None  # the torch module, when a real model runs
    device = None  # torch device string or None
    dtype = None  # torch dtype (a real model) or dtype name (a cost model)
    tokenizer = None
    model_name: str | None = None  # what it was loaded from ("preset:tiny", a folder's name)
    model_path: str | None = None  # the checkpoint folder (its tokenizer and chat template), if any
    kv_connector = None  # the worker side of a KV connector (kv_connector.py), once set up

    @abc.abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> dict[str, int]:
        """Run one step. -> {request_id: sampled token} for the sequences with `sample` set.
        Raises RequestFailed for a failure tied to some requests (see the module docstring)."""

    def compile_or_warm_up_model(self, config) -> None:
        """Get ready to run steps of an engine with this EngineConfig, before its first step
        (vLLM's name; the ModelRunner captures CUDA graphs up to its max_num_seqs). Default: nothing."""

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        """Drop per-request state of requests that left the engine. Default: none kept."""

    def init_kv_connector(self, kv_transfer_config) -> None:
        """Set up the worker side of a KV connector (disaggregated prefill/decode) over this
        executor's KV tensors. Default: refuse (a simulation holds no KV)."""
        raise InvalidRequest("kv_transfer_config", f"{type(self).__name__} holds no KV cache to "
                                                   "transfer; disaggregation needs a ModelRunner")
