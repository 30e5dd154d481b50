"""Chunks running prefills but admits a waiting prompt only if all of it fits (exercise 4's rule)."""
from solutions.ex05_chunked_prefill import BaseScheduler, SchedulerOutput


class ChunkedScheduler(BaseScheduler):
    def schedule(self, now):
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for req in list(self.running):
            if budget == 0 or req not in self.running:
                break
            n = min(req.num_tokens - req.num_computed_tokens, budget)
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
            blocks, num_cached = self.kv.get_computed_blocks(req)
            n = req.num_tokens - num_cached
            if n > budget or not self.kv.allocate_slots(req, n, blocks):
                break
            self.admit(req, num_cached, n, out, now)
            budget -= n
        return out
