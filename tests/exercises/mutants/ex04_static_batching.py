"""Breaks rule 8: static batching: admits only when the whole previous batch has finished."""
from solutions.ex04_scheduler import ContinuousScheduler as Continuous
from solutions.ex04_scheduler import SchedulerOutput


class ContinuousScheduler(Continuous):
    def schedule(self, now):
        if self.running:
            out, budget = SchedulerOutput(), self.config.max_num_batched_tokens
            for req in list(self.running):
                if req not in self.running:
                    break
                while not self.kv.allocate_slots(req, 1):
                    victim = self.running[-1]
                    self.preempt(victim, out)
                    if victim is req:
                        break
                else:
                    self.add(req, req.num_tokens - req.num_computed_tokens, out)
                    budget -= 1
            return out
        return super().schedule(now)
