"""Breaks rule 6: admits the head of the queue even when its slots can't be reserved."""
from exercise_checks import solution_with

ContinuousScheduler = solution_with(
    "ex04_scheduler",
    ("if n > budget or not self.kv.allocate_slots(req, n, blocks):",
     "if n > budget or (self.kv.allocate_slots(req, n, blocks) and False):")).ContinuousScheduler
