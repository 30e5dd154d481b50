"""Counts a request without a TPOT (one token) as missing the TPOT limit."""
from solutions.ex10_slo import *  # noqa: F401,F403
from solutions.ex10_slo import succeeded, tpot


def meets_slo(result, i, slo):
    if not succeeded(result, i):
        return False
    values = {"ttft": result["ttfts"][i], "tpot": tpot(result, i), "e2e": result["latencies"][i]}
    return all(values[k] is not None and values[k] <= v for k, v in slo.items())
