"""Lesson 11: where a step's wall time goes between the host (Python deciding and preparing the
step, then sampling and turning its tokens into outputs) and the forward (the model itself), and
what CUDA graphs change on a GPU.

The phases are timed by wrapping the engine's own methods for a few decode steps: the scheduler's
`schedule` (scheduling), the runner's `prepare` (input preparation), the forward with the lm_head
(forward), the sampler (sampling) and the rest of `step` (outputs: the scheduler's update, the
RequestOutputs, the trace). On CUDA each timer waits for the GPU first (torch.cuda.synchronize),
so a phase holds the GPU work it launched; that costs a little overlap the engine would have.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np
import torch

from nanoserve.config import default_device
from nanoserve.course.setup import Table, device_kind, fresh_engine, load_llm, random_prompt
from nanoserve.measure.workload import greedy_params

PHASES = ("scheduling", "input preparation", "forward", "sampling", "outputs")
HOST = ("scheduling", "input preparation", "sampling", "outputs")


@dataclass
class HostSplit:
    """Mean ms per decode step of `batch` sequences at about `context` tokens, by phase."""

    batch: int
    context: int
    steps: int
    step_ms: float
    phases_ms: dict[str, float]  # PHASES -> ms; they sum to step_ms
    graphs: bool  # the forward replayed CUDA graphs

    @property
    def host_ms(self) -> float:
        return sum(self.phases_ms[p] for p in HOST)

    @property
    def host_share(self) -> float:
        return self.host_ms / self.step_ms


class _Timed:
    """Stands in for a callable (a function or the sampler object) and adds its wall time to a
    phase; other attributes pass through to the wrapped object."""

    def __init__(self, fn, phase: str, spent: dict, sync):
        self._fn, self._phase, self._spent, self._sync = fn, phase, spent, sync

    def __call__(self, *args, **kwargs):
        self._sync()
        t = time.perf_counter()
        out = self._fn(*args, **kwargs)
        self._sync()
        self._spent[self._phase] += time.perf_counter() - t
        return out

    def __getattr__(self, name):
        return getattr(self._fn, name)


def host_split(llm, batch: int, context: int, steps: int = 8, seed: int = 0) -> HostSplit:
    """Time `steps` decode steps of `batch` random prompts of `context` tokens, by phase."""
    engine = fresh_engine(llm, enable_prefix_caching=False, max_num_seqs=max(batch, 1),
                          record_trace=False)
    runner = engine.executor
    if not hasattr(runner, "prepare"):
        raise ValueError(f"host_split times a real model; {type(runner).__name__} runs none")
    cuda = runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rng = np.random.default_rng(seed)
    ids = [engine.add_request(random_prompt(engine, context, rng), greedy_params(steps + 2 * batch + 2))
           for _ in range(batch)]
    while any(engine.requests[i].is_prefilling for i in ids):
        engine.step()  # untimed: every sequence decoding, and graphs (if any) warmed up
    engine.step()
    spent = dict.fromkeys(PHASES, 0.0)
    wrapped = {"prepare": "input preparation", "forward": "forward", "sampler": "sampling"}
    saved = {name: vars(runner)[name] for name in wrapped if name in vars(runner)}
    replays = []
    try:
        for name, phase in wrapped.items():
            setattr(runner, name, _Timed(getattr(runner, name), phase, spent, sync))
        model = runner.model
        model.compute_logits = _Timed(model.compute_logits, "forward", spent, sync)
        if runner.graphs is not None:
            replay = _Timed(runner.graphs.run, "forward", spent, sync)
            runner.graphs.run = lambda *a: replays.append(1) or replay(*a)
        engine.scheduler.schedule = _Timed(engine.scheduler.schedule, "scheduling", spent, sync)
        sync()
        t = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync()
        total = time.perf_counter() - t
    finally:
        for name in wrapped:
            vars(runner).pop(name, None)
        runner.__dict__.update(saved)
        vars(runner.model).pop("compute_logits", None)
        if runner.graphs is not None:
            vars(runner.graphs).pop("run", None)
        vars(engine.scheduler).pop("schedule", None)
        for i in ids:
            engine.abort(i)
    spent["outputs"] = total - sum(spent.values())
    return HostSplit(batch, context, steps, 1e3 * total / steps,
                     {p: 1e3 * v / steps for p, v in spent.items()}, len(replays) == steps)


def host_table(splits: list[HostSplit], title: str = "") -> Table:
    rows = [dict(batch=s.batch, context=s.context, graphs="yes" if s.graphs else "no",
                 **{"step ms": s.step_ms}, **{f"{p} ms": s.phases_ms[p] for p in PHASES},
                 **{"host share": f"{100 * s.host_share:.0f}%"}) for s in splits]
    return Table(rows, title or "one decode step, by phase (ms, mean over steps)")


def graphs_on_off(model: str, batches, context: int, steps: int = 8, device: str | None = None,
                  **config) -> list[HostSplit]:
    """CUDA only: the same decode steps with CUDA graphs (the default) and with
    enforce_eager=True, each on its own load of `model` (graphs are captured at load time)."""
    if device_kind(device) != "cuda":
        raise ValueError(f"graphs_on_off compares CUDA graphs with eager launches: CUDA only, "
                         f"not device={device or default_device()!r}")
    out = []
    for eager in (False, True):
        llm = load_llm(model, device=device, enforce_eager=eager, **config)
        out += [host_split(llm, b, context, steps) for b in batches]
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return out
