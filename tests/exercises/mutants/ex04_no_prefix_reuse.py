"""Breaks rule 7: ignores the prefix cache: recomputes every prompt from its first token."""
from solutions.ex04_scheduler import BaseScheduler, SchedulerOutput


class ContinuousScheduler(BaseScheduler):
    def schedule(self, now):
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for req in list(self.running):
            if req not in self.running:
                break
            n = req.num_tokens - req.num_computed_tokens
            if n > budget:
                continue
            while not self.kv.allocate_slots(req, n):
                victim = self.running[-1]
                self.preempt(victim, out)
                if victim is req:
                    break
            else:
                self.add(req, n, out)
                budget -= n
        if out.preempted:
            return out
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.next_waiting(now)
            if req is None:
                break
            n = req.num_tokens
            if n > budget or not self.kv.allocate_slots(req, n):
                break
            self.admit(req, 0, n, out, now)
            budget -= n
        return out
