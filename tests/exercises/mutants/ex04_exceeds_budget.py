"""Breaks rule 1: doesn't charge decodes to the token budget."""
from solutions.ex04_scheduler import BaseScheduler, SchedulerOutput


class ContinuousScheduler(BaseScheduler):
    def schedule(self, now):
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for req in list(self.running):
            if req not in self.running:
                break
            n = req.num_tokens - req.num_computed_tokens
            while not self.kv.allocate_slots(req, n):
                victim = self.running[-1]
                self.preempt(victim, out)
                if victim is req:
                    break
            else:
                self.add(req, n, out)  # budget not reduced
        if out.preempted:
            return out
        while len(self.running) < self.config.max_num_seqs:
            req = self.next_waiting(now)
            if req is None:
                break
            blocks, num_cached = self.kv.get_computed_blocks(req)
            n = req.num_tokens - num_cached
            if n > budget or not self.kv.allocate_slots(req, n, blocks):
                break
            self.admit(req, num_cached, n, out, now)
            budget -= n
        return out
