"""Breaks rule 8: cuts a prompt that doesn't fit to the budget left (chunking, exercise 5's job)."""
from exercise_checks import solution_with

ContinuousScheduler = solution_with(
    "ex04_scheduler", ("            n = req.num_tokens - num_cached\n",
                       "            n = min(req.num_tokens - num_cached, budget)\n")).ContinuousScheduler
