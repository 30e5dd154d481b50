"""The executor interface: what the engine needs of whatever runs a scheduled step.

The engine never looks inside its executor. The ModelRunner runs a real model; the simulator's
SimExecutor advances a clock by a cost model's step time; tests use small fakes. Each does two
things: execute one SchedulerOutput (-> the token sampled for every sequence that reached the end
of its known tokens) and forget requests that finished or were aborted (per-request state such
as a seeded sampler's generator). It also says what it runs: the model's shape, and the device,
dtype and module when there is a real model (None in a simulation).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

from nanoserve.config import ModelConfig
from nanoserve.engine.scheduler import SchedulerOutput


class Executor(abc.ABC):
    model_config: ModelConfig
    model = None  # the torch module, when a real model runs
    device = None  # torch device string or None
    dtype = None  # torch dtype (a real model) or dtype name (a cost model)
    tokenizer = None
    model_name: str | None = None  # what it was loaded from ("preset:tiny", a folder's name)

    @abc.abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> dict[str, int]:
        """Run one step. -> {request_id: sampled token} for the sequences with `sample` set."""

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        """Drop per-request state of requests that left the engine. Default: none kept."""
