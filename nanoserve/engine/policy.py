"""Scheduling policies: in which order one step serves running requests and admits waiting ones.

A policy is an object the Scheduler holds (`scheduler.policy`) and calls once a step; it makes the
step out of the Scheduler's two moves, `schedule_running(budget, out)` (decodes and unfinished
prefills, preempting the newest when blocks run out) and `schedule_waiting(now, budget, out)`
(admission in arrival order while budget, seats and blocks allow). `make_policy(config)` picks one
from EngineConfig's fields:

- `ContinuousBatching` (enable_chunked_prefill, the default; vLLM v1's scheduler): running requests
  first, then admission every step, a prompt cut to what is left of the budget.
- `WholePromptBatching` (chunking off, priority "decode"): the same order, but a prompt is admitted
  whole or not at all, and one longer than the whole budget gets a step of its own.
- `PrefillFirstBatching` (chunking off, priority "prefill": vLLM v0's default): admission first,
  running requests only in a step that admitted nobody.
- `StaticBatching(inner)` (scheduling_policy "static"): `inner`'s steps, but a batch, once formed,
  runs until every member finishes before anyone is admitted again.
"""

from __future__ import annotations

from nanoserve.config import EngineConfig


class ContinuousBatching:
    """Serve running requests first, then admit waiting ones, every step."""

    name = "continuous"

    def schedule(self, sched, now: float, out, admit: bool = True) -> None:
        """Fill `out` (a SchedulerOutput) for this step; `admit=False` admits nobody."""
        budget = sched.schedule_running(sched.config.max_num_batched_tokens, out)
        if admit and not out.preempted:  # memory just ran out: nobody new this step
            sched.schedule_waiting(now, budget, out)


class WholePromptBatching(ContinuousBatching):
    """Without chunked prefill: a prompt runs whole in the step that admits it."""

    name = "whole-prompt"

    def schedule(self, sched, now: float, out, admit: bool = True) -> None:
        if self.too_long(sched, now):
            self.schedule_alone(sched, now, out, admit)
        else:
            super().schedule(sched, now, out, admit)

    @staticmethod
    def too_long(sched, now: float) -> bool:
        """Is the arrived head of the queue longer than a whole step's budget?"""
        head = sched.next_waiting(now)
        return head is not None and (head.num_tokens - head.num_computed_tokens
                                     > sched.config.max_num_batched_tokens)

    @staticmethod
    def schedule_alone(sched, now: float, out, admit: bool, alone: bool = True) -> None:
        """Admission first (with `alone`, the head only, over budget, in a step of its own);
        running requests only if nobody was admitted."""
        budget = sched.config.max_num_batched_tokens
        if admit:
            budget = sched.schedule_waiting(now, budget, out, alone)
        if not out.seqs:
            sched.schedule_running(budget, out)


class PrefillFirstBatching(WholePromptBatching):
    """Without chunked prefill: prefill-only steps while prompts can be admitted."""

    name = "prefill-first"

    def schedule(self, sched, now: float, out, admit: bool = True) -> None:
        self.schedule_alone(sched, now, out, admit, alone=self.too_long(sched, now))


class StaticBatching:
    """Form a batch, run it until every member finishes, only then admit again."""

    def __init__(self, inner: ContinuousBatching):
        self.inner = inner
        self.name = f"static ({inner.name})"
        self.batch_open = True  # may the current batch still take requests?

    def schedule(self, sched, now: float, out, admit: bool = True) -> None:
        if not sched.running:
            self.batch_open = True
        self.inner.schedule(sched, now, out, admit and self.batch_open)
        if (len(sched.running) >= sched.config.max_num_seqs or sched.next_waiting(now) is None
                or any(not r.is_prefilling for r in sched.running)):
            self.batch_open = False  # full, nobody else waiting, or already decoding


def make_policy(config: EngineConfig):
    """The policy EngineConfig's fields select (see the module docstring)."""
    if config.enable_chunked_prefill:
        policy = ContinuousBatching()
    elif config.priority == "prefill":
        policy = PrefillFirstBatching()
    else:
        policy = WholePromptBatching()
    return StaticBatching(policy) if config.scheduling_policy == "static" else policy
