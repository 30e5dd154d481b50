"""Breaks rule 5: admits waiting requests even in a step that preempted (the rule deleted)."""
from exercise_checks import solution_with

ContinuousScheduler = solution_with(
    "ex04_scheduler", ("        if out.preempted:\n            return out\n", "")).ContinuousScheduler
