"""Breaks rule 3: admits waiting prompts before serving running requests: decodes stall behind prefills."""
from solutions.ex04_scheduler import BaseScheduler, SchedulerOutput


class ContinuousScheduler(BaseScheduler):
    def schedule(self, now):
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        admitted = []
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.next_waiting(now)
            if req is None:
                break
            blocks, num_cached = self.kv.get_computed_blocks(req)
            n = req.num_tokens - num_cached
            if n > budget or not self.kv.allocate_slots(req, n, blocks):
                break
            self.admit(req, num_cached, n, out, now)
            admitted.append(req)
            budget -= n
        for req in [r for r in self.running if r not in admitted]:
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
        return out
