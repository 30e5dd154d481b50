"""Exercise 5: chunked prefill. Split long prompts across steps so every step fills its budget.

Without chunking a long prompt is admitted whole: it waits until a step has room for all of
it, and the step that runs it is long, stalling every decode in the batch behind it. With
chunked prefill a prompt is computed a chunk at a time: each step gives it what is left of the
token budget, and it keeps a seat in `running` until its last chunk produces the first token.
A running request then needs `req.num_tokens - req.num_computed_tokens` more tokens: 1 for a
decode, possibly many for a prompt mid-prefill.

Write `schedule(now)` as in exercise 4: its rules 1, 2, 4, 5, 6 and 7 hold as they are (a
request preempted earlier in the step is still in your copy of running; nobody is admitted in
a step that preempted). Rules 3 and 8 change:

- Rule 3, running requests (in order): n = min(tokens still needed, budget left), no skipping;
  stop when the budget is spent. Allocation failure preempts exactly as before.
- Rule 8, waiting requests (in arrival order, seats and budget permitting): after the cached
  prefix, n = min(req.num_tokens - num_cached, budget left): a prompt is cut where the budget
  runs out, and its next chunk runs next step, as a running request.

Worked example (budget 16): A decodes (1), B is a 40-token prompt arriving now: step 1 is
[A:1, B:15]; step 2 [A:1, B:15]; step 3 [A:1, B:10, ...] and B's first token comes out of
step 3, when its chunk reaches the end of the prompt. Every step but the last is full.

`BaseScheduler` (from exercise 4) gives next_waiting, add, admit and preempt.
"""

from __future__ import annotations

from nanoserve.engine.scheduler import SchedulerOutput

from .ex04_scheduler import BaseScheduler


class ChunkedScheduler(BaseScheduler):
    def schedule(self, now: float) -> SchedulerOutput:
        """One step with chunked prefill (see the module docstring).

        Hint: `self.add(req, n, out)` with n smaller than what the request needs schedules a
        chunk; the runner only samples when the chunk reaches the end of the known tokens.
        """
        out = SchedulerOutput()  # noqa: F841 (the helpers record every move in it)
        budget = self.config.max_num_batched_tokens  # noqa: F841 (tokens left this step)
        raise NotImplementedError("ex05: write ChunkedScheduler.schedule")
