"""Charges only the time inside steps: the idle time between them (and the duration given) is free."""
from solutions.ex09_cost import *  # noqa: F401,F403
from solutions.ex09_cost import step_seconds


def usd_per_1m(trace, price_per_hour, duration=None):
    prefill, decode = step_seconds(trace)
    n_in = sum(s.num_prefill_tokens for s in trace)
    n_out = sum(s.num_decode_tokens for s in trace)
    per = price_per_hour / 3600 * 1e6
    return (prefill * per / n_in if n_in else float("nan"), decode * per / n_out if n_out else float("nan"))
