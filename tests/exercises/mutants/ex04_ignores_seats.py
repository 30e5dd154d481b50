"""Breaks rule 2: admits while budget is left, whatever the number of running requests."""
from exercise_checks import solution_with

_m = solution_with("ex04_scheduler",
                   ("and len(self.running) < self.config.max_num_seqs:", ":"))
ContinuousScheduler = _m.ContinuousScheduler
