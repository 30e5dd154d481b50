"""Counts the wait for the first token as an inter-token latency."""
from solutions.ex07_metrics import *  # noqa: F401,F403


def inter_token_latencies(output):
    t = [output.metrics.arrival_time, *output.metrics.token_times]
    return [b - a for a, b in zip(t, t[1:])]
