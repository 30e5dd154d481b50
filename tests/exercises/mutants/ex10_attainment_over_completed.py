"""Divides by the requests that succeeded, not by every request sent: failures raise attainment."""
from solutions.ex10_slo import *  # noqa: F401,F403
from solutions.ex10_slo import meets_slo, succeeded


def attainment(result, slo):
    done = [i for i in range(len(result["ttfts"])) if succeeded(result, i)]
    return sum(meets_slo(result, i, slo) for i in done) / len(done) if done else float("nan")


def max_rate_meeting(results, slo, target=0.9):
    rates = [r["request_rate"] for r in results if attainment(r, slo) >= target]
    return max(rates) if rates else None
