"""Exercise 4: a continuous-batching scheduler under a token budget (no chunked prefill).

Every engine step asks the scheduler one question: which tokens of which requests run now?
The answer must respect two limits of EngineConfig:

- `max_num_batched_tokens`: the step's token budget. A decode costs 1 token; admitting a
  prompt costs every prompt token not served by the prefix cache.
- `max_num_seqs`: the most requests in `running` at once (seats).

and one resource: free KV blocks (`self.kv.allocate_slots` says False when there are none).

*Continuous* batching means the batch is re-formed every step: as soon as a request finishes,
its seat and blocks go to the next waiting request, instead of waiting for the whole batch to
finish (static batching). Without chunked prefill a prompt is admitted whole or not at all.

Your `schedule(now)` builds one SchedulerOutput, in this order:

1. Running requests first, in `self.running` order (oldest admission first). Each needs
   `req.num_tokens - req.num_computed_tokens` tokens (1 for a decode). Skip one that doesn't fit
   the remaining budget. Reserve its KV slots with `self.kv.allocate_slots(req, n)`; while that
   fails, preempt the *last* request of `self.running` (the most recently admitted) with
   `self.preempt(victim, out)`, and stop serving running requests once `req` itself was the
   victim. Then `self.add(req, n, out)`.
2. If nobody was preempted, admit waiting requests in arrival order: take
   `req = self.next_waiting(now)` (None: nobody has arrived) while a seat is free and budget is
   left. `blocks, num_cached = self.kv.get_computed_blocks(req)` finds its longest cached
   prefix; it needs n = req.num_tokens - num_cached tokens. Stop at the first request that
   doesn't fit the budget or whose `self.kv.allocate_slots(req, n, blocks)` fails (first come,
   first served: nobody overtakes it). Otherwise `self.admit(req, num_cached, n, out, now)`.

Worked example (budget 8, max_num_seqs 3): running A and B decode (2 tokens); waiting C has a
5-token prompt (fits: 7 tokens), D a 3-token prompt (doesn't fit the 1 left): the step is
[A:1, B:1, C:5]. Next step, if A finished, D is admitted beside B's and C's decodes.

`BaseScheduler` is given: it is nanoserve's Scheduler (queues, abort, update_from_output, the
KV manager in `self.kv`, and the four public helpers above) without a `schedule`. Plug yours in with
`LLM("preset:tiny", scheduler=ContinuousScheduler)`; greedy outputs must not change.
Out of scope: a prompt longer than the whole budget (it would never be admitted; exercise 5
chunks it), priorities, static batching.
"""

from __future__ import annotations

from nanoserve.engine.scheduler import Scheduler, SchedulerOutput


class BaseScheduler(Scheduler):
    """Given, not an exercise: nanoserve's Scheduler with `schedule` left to subclasses.

    State you read: self.config (EngineConfig), self.kv (KVCacheManager), self.waiting (deque of
    Request, by arrival; preempted requests go back to its head), self.running (list of Request,
    admission order). A Request has num_tokens (prompt + output so far), num_computed_tokens
    (tokens whose KV is in the cache) and metrics.arrival_time. The moves you make are the
    Scheduler's public helpers: next_waiting(now), admit(req, num_cached, n, out, now),
    add(req, n, out) and preempt(req, out); each keeps the bookkeeping right.
    """

    def schedule(self, now: float) -> SchedulerOutput:
        raise NotImplementedError("subclasses write schedule(now)")


class ContinuousScheduler(BaseScheduler):
    def schedule(self, now: float) -> SchedulerOutput:
        """One step: serve running requests, then admit waiting ones (see the module docstring).

        Returns the SchedulerOutput the helpers filled (an empty one if nothing can run).
        Hint: iterate over a copy of self.running (preempt removes from it), keep `budget`
        as a local, and count seats as len(self.running).
        """
        raise NotImplementedError("ex04: write ContinuousScheduler.schedule")
