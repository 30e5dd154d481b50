"""How much CPU the other processes on this machine take: the check a timing on a shared machine needs.

A benchmark reads it before it measures (and refuses, or labels its result, when the machine is
busy) and again after, for the average over the whole measurement.
"""

from __future__ import annotations

import os
import time

import psutil


class OtherProcesses:
    """Every process but this one, as they were when this was made; `cores()` reads their CPU."""

    def __init__(self):
        self.procs = [p for p in psutil.process_iter() if p.pid != os.getpid()]
        self.cores()  # psutil's first cpu_percent call of a process starts its counter

    def cores(self) -> float:
        """CPU they used since the last read, in cores (1.0: one core busy throughout)."""
        busy = 0.0
        for p in self.procs:
            try:
                busy += p.cpu_percent(None)
            except psutil.Error:  # ended meanwhile, or not ours to read
                pass
        return busy / 100


def other_cpu_load(interval: float = 1.0) -> float:
    """CPU used by every other process over `interval` seconds, in cores."""
    others = OtherProcesses()
    time.sleep(interval)
    return others.cores()
