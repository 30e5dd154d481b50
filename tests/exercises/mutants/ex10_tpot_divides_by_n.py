"""TPOT divides the decode time by all n tokens, not by the n - 1 gaps after the first."""
from solutions.ex10_slo import *  # noqa: F401,F403


def tpot(result, i):
    n = result["output_lens"][i]
    return (result["latencies"][i] - result["ttfts"][i]) / n if n > 1 else None
