"""Breaks rule 4: keeps serving requests of its copy of running that this step already preempted."""
from exercise_checks import solution_with

ContinuousScheduler = solution_with(
    "ex04_scheduler",
    ("            if req not in self.running:  # preempted while serving an earlier request\n"
     "                break\n", "")).ContinuousScheduler
