"""Exercise 4: a continuous-batching scheduler under a token budget (no chunked prefill).

Every engine step asks the scheduler one question: which tokens of which requests run now?
*Continuous* batching re-forms the batch every step: as soon as a request finishes, its seat
and blocks go to the next waiting request, instead of waiting for the whole batch to finish
(static batching). Without chunked prefill a prompt runs whole in the step that admits it, so a
running request always needs exactly 1 token: its next decode.

The answer is a SchedulerOutput, and you never fill it by hand: start with `out =
SchedulerOutput()` and let the Scheduler's helpers record each move in it:
`self.add(req, n, out)` schedules running `req`'s next n tokens (appends to out.seqs),
`self.admit(req, num_cached, n, out, now)` moves the head of the waiting queue to running and
adds it, `self.preempt(victim, out)` takes a running request out (appends to out.preempted).
Return `out`; an empty one means nothing runs this step.

The rules (`python -m nanoserve grade ex04` tests each one and names the rule a failure broke):

1. Token budget: at most `self.config.max_num_batched_tokens` tokens per step. A decode costs 1;
   an admitted prompt costs its tokens that the prefix cache does not serve.
2. Seats: at most `self.config.max_num_seqs` requests in `self.running`.
3. Running requests first, every step, in `self.running` order (oldest admission first), each
   with its n = req.num_tokens - req.num_computed_tokens tokens, while the budget lasts.
4. Blocks: before adding a running request, reserve its slots: `self.kv.allocate_slots(req, n)`.
   While that returns False, preempt the most recently admitted running request
   (`self.running[-1]`); if that victim is `req` itself, stop serving running requests.
   Careful: iterate over a copy, `list(self.running)`, since preempt removes from
   `self.running`; a request preempted earlier in this step is then still in your copy and
   comes up later: it is no longer `in self.running`, so skip it (or stop there).
5. Admit waiting requests only if nobody was preempted this step (`out.preempted` is empty):
   memory just ran out, and the victim went back to the head of the waiting queue (vLLM's v1
   scheduler has the same rule).
6. Admission is first come, first served: `req = self.next_waiting(now)` is the head of the
   waiting queue (None: nobody has arrived yet). Admit while a seat is free and budget is left;
   stop at the first request that doesn't fit the budget or whose slots can't be reserved
   (nobody overtakes it: `admit` only takes the head).
7. Prefix cache: `blocks, num_cached = self.kv.get_computed_blocks(req)` is the request's longest
   cached prefix; it needs n = req.num_tokens - num_cached tokens, reserved with
   `self.kv.allocate_slots(req, n, blocks)`, then `self.admit(req, num_cached, n, out, now)`.
8. A prompt is admitted whole, never cut (exercise 5 chunks), and a seat that frees is taken in
   the very next step (continuous, not static, batching).

Worked example (budget 8, max_num_seqs 3): running A and B decode (2 tokens); waiting C has a
5-token prompt (fits: 7 tokens), D a 3-token prompt (doesn't fit the 1 left): out.seqs is
[A:1, B:1, C:5], out.preempted []. Next step, if A finished, D is admitted beside B and C.

`BaseScheduler` is given: the queues, abort, the bookkeeping after each step, the KV manager in
`self.kv` and the four helpers above; it has no policy (its `schedule` raises). Write the policy
yourself: a module that subclasses or calls nanoserve's own Scheduler scores 0. Plug yours in
with `LLM("preset:tiny", scheduler=ContinuousScheduler)`; greedy outputs must not change.
Out of scope: a prompt longer than the whole budget (it would never be admitted; exercise 5
chunks it), priorities, static batching.
"""

from __future__ import annotations

from nanoserve.engine.scheduler import SchedulerBase, SchedulerOutput


class BaseScheduler(SchedulerBase):
    """Given, not an exercise: a scheduler's state and moves, with `schedule` left to subclasses.

    State you read: self.config (EngineConfig), self.kv (KVCacheManager), self.waiting (deque of
    Request, by arrival; preempted requests go back to its head), self.running (list of Request,
    admission order). A Request has num_tokens (prompt + output so far), num_computed_tokens
    (tokens whose KV is in the cache) and metrics.arrival_time. The moves you make are the
    helpers next_waiting(now), admit(req, num_cached, n, out, now), add(req, n, out) and
    preempt(req, out); each keeps the bookkeeping right.
    """


class ContinuousScheduler(BaseScheduler):
    def schedule(self, now: float) -> SchedulerOutput:
        """One step: serve running requests, then admit waiting ones (rules 1-8 of the module
        docstring). Returns the SchedulerOutput the helpers filled (empty if nothing can run).
        Hint: keep `budget` as a local, count seats as len(self.running).
        """
        out = SchedulerOutput()  # noqa: F841 (the helpers record every move in it)
        budget = self.config.max_num_batched_tokens  # noqa: F841 (tokens left this step)
        raise NotImplementedError("ex04: write ContinuousScheduler.schedule")
