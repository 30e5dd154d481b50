"""Calls nanoserve's own Scheduler.schedule on itself (reached through a package re-export)."""
from nanoserve import engine
from solutions.ex05_chunked_prefill import BaseScheduler


class ChunkedScheduler(engine.Scheduler, BaseScheduler):
    def schedule(self, now):
        return engine.Scheduler.schedule(self, now)
