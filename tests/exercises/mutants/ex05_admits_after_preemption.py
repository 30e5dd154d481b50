"""Admits waiting requests even in a step that preempted (exercise 4's rule 5 deleted)."""
from exercise_checks import solution_with

ChunkedScheduler = solution_with(
    "ex05_chunked_prefill", ("        if out.preempted:\n            return out\n", "")).ChunkedScheduler
