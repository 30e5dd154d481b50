"""Lesson 11: where a step's wall time goes between the host (Python deciding and preparing the
step, then sampling and turning its tokens into outputs) and the forward (the model itself), and
what the engine's ways of cutting host work change: CUDA graphs on a GPU, the layers in one call on a
CPU.

The phases are timed by wrapping the engine's own methods for a few decode steps: the scheduler's
`schedule` (scheduling), the runner's `prepare` (input preparation), the forward with the lm_head
(forward), the sampler (sampling) and the rest of `step` (outputs: the scheduler's update, the
RequestOutputs, the trace). On CUDA each timer waits for the GPU first (torch.cuda.synchronize),
so a phase holds the GPU work it launched; that costs a little overlap the engine would have.

On a CPU the forward itself splits in two: the ops' own time, and the Python between them (module
calls, the kernels' wrappers, dispatch), which a runtime that runs its whole graph in native code
(llama.cpp) does not pay. The ops' time comes from torch.profiler over the same number of further
decode steps, untimed otherwise: the profiler slows the Python it watches, not the ops' own time.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

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
    # CPU: the forward's time outside its ops, the Python between them: the median forward of a
    # timed step less the median of the ops' own time in a profiled one (0 where noise says less)
    forward_python_ms: float | None = None
    eager: bool = False  # loaded with enforce_eager=True: every kernel called one by one
    fused: bool = False  # CPU: the profiled steps ran the layers as one op (kernels/cpu_decode_layer.py)

    @property
    def forward_ops_ms(self) -> float | None:
        """CPU: the rest of the forward, its ops' own time."""
        return None if self.forward_python_ms is None else self.phases_ms["forward"] - self.forward_python_ms

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


FORWARD, STEP = "nanoserve::forward", "nanoserve::step"  # the profiler's ranges
FUSED_LAYERS = "nanoserve_cpu::decode_layers"  # the op of kernels/cpu_decode_layer.py


def _ranges(event):
    """The FORWARD and STEP range events an event runs within (None where it runs in none)."""
    forward = step = None
    while event.cpu_parent is not None:
        event = event.cpu_parent
        if event.name == FORWARD:
            forward = event
        elif event.name == STEP:
            step = event
    return forward, step


@contextlib.contextmanager
def _no_stderr():
    """torch's profiler writes a line to the process's stderr at each start and stop (from C++,
    so a notebook would show them): silence file descriptor 2 meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _forward_ops_ms(engine, runner, steps: int) -> tuple[float, bool]:
    """(median ms per decode step of the ops' own (self) time inside the forward and lm_head,
    whether the layers ran as one op), from torch.profiler over `steps` more decode steps."""
    def ranged(fn):
        def call(*args, **kwargs):
            with record_function(FORWARD):
                return fn(*args, **kwargs)
        return call
    forward, logits = runner.forward, runner.model.compute_logits
    runner.forward, runner.model.compute_logits = ranged(forward), ranged(logits)
    try:
        with _no_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                with record_function(STEP):
                    engine.step()
    finally:
        runner.forward, runner.model.compute_logits = forward, logits
    per_step, fused = {}, False  # id of a step's range -> its ops' self microseconds
    for e in prof.events():
        fused = fused or e.name == FUSED_LAYERS
        if e.name not in (FORWARD, STEP):
            forward, step = _ranges(e)
            if forward is not None and step is not None:
                per_step[id(step)] = per_step.get(id(step), 0.0) + e.self_cpu_time_total
    return (float(np.median(list(per_step.values()))) / 1e3 if per_step else 0.0), fused


def host_split(llm, batch: int, context: int, steps: int = 8, seed: int = 0) -> HostSplit:
    """Time `steps` decode steps of `batch` random prompts of `context` tokens, by phase; on a CPU,
    `steps` more under the profiler for the ops' share of the forward."""
    engine = fresh_engine(llm, enable_prefix_caching=False, max_num_seqs=max(batch, 1),
                          record_trace=False)
    runner = engine.executor
    if not hasattr(runner, "prepare"):
        raise ValueError(f"host_split times a real model; {type(runner).__name__} runs none")
    cuda = runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rng = np.random.default_rng(seed)
    ids = [engine.add_request(random_prompt(engine, context, rng), greedy_params(2 * steps + 2 * batch + 2))
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
        spent = dict(spent)  # the timers keep counting while the profiled steps run
        python_ms, fused = None, False
        if not cuda and runner.graphs is None:  # a replayed graph has no Python between its ops
            ops_ms, fused = _forward_ops_ms(engine, runner, steps)
            # against the forward's mean, the figure the split shows, so its ops part is the
            # profiled ops (or the whole forward, when a noisy profile ran slower)
            python_ms = max(1e3 * spent["forward"] / steps - ops_ms, 0.0)
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
                     {p: 1e3 * v / steps for p, v in spent.items()}, len(replays) == steps, python_ms,
                     runner.ecfg.enforce_eager, fused)


def host_table(splits: list[HostSplit], title: str = "") -> Table:
    rows = [dict(batch=s.batch, context=s.context, graphs="yes" if s.graphs else "no",
                 **{"step ms": s.step_ms}, **{f"{p} ms": s.phases_ms[p] for p in PHASES},
                 **({} if s.forward_ops_ms is None else {"of it ops ms": s.forward_ops_ms,
                                                         "of it Python ms": s.forward_python_ms}),
                 **{"host share": f"{100 * s.host_share:.0f}%"}) for s in splits]
    return Table(rows, title or "one decode step, by phase (ms, mean over steps)")


def eager_on_off(model: str, batches, context: int, steps: int = 8, device: str | None = None,
                 **config) -> list[HostSplit]:
    """The same decode steps as the engine runs them by default (CUDA graphs on CUDA; on a CPU
    every layer's kernels in one call at a few sequences, kernels/cpu_decode_layer.py) and with
    enforce_eager=True (every kernel called one by one from Python), each on its own load of
    `model` (graphs are captured at load time)."""
    out = []
    for eager in (False, True):
        llm = load_llm(model, device=device, enforce_eager=eager, **config)
        out += [host_split(llm, b, context, steps) for b in batches]
        del llm
        gc.collect()
        if device_kind(device) == "cuda":
            torch.cuda.empty_cache()
    return out
