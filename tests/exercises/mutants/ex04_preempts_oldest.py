"""Breaks rule 4: preempts the oldest running request (self.running[0]), not the newest."""
from exercise_checks import solution_with

ContinuousScheduler = solution_with(
    "ex04_scheduler", ("victim = self.running[-1]", "victim = self.running[0]")).ContinuousScheduler
