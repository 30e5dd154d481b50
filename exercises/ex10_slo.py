"""Exercise 10: the SLO of a served load. Goodput and attainment from loadgen's saved result.

`python -m nanoserve loadgen ... --save-result` (lesson 10) writes what `vllm bench serve` writes:
a JSON object with, per request sent, in the order sent, `ttfts` (s), `itls` (a list of gaps, s),
`latencies` (end to end, s), `output_lens` and `errors` (an empty string when it succeeded), and
the run's `duration` (s) and `request_rate` (requests/s asked for). A failed request has
output_lens 0 and latency 0.

A service-level objective (SLO) is a limit per request, here a dict of seconds with keys "ttft",
"tpot" and "e2e" (any of them). A request meets it when it succeeded, produced at least one token,
and is within every limit; TPOT = (latency - ttft) / (output_len - 1) exists only for 2 tokens or
more, and a metric a request doesn't have counts as met (as vLLM's goodput counts it).
*Attainment* is the fraction of the requests sent that met the SLO; *goodput* the requests per
second that met it. A capacity planner asks the last question: the highest request rate of a
sweep whose attainment still reaches the target.

Worked example: ttfts [0.2, 0.9, 0.1], latencies [1.2, 1.5, 0.0], output_lens [11, 4, 0],
errors ["", "", "timeout"], duration 2.0: at {"ttft": 0.5, "tpot": 0.15} request 0 meets it
(TPOT 0.1), request 1 misses TTFT, request 2 failed: attainment 1/3, goodput 0.5 req/s.
Write these from the definitions: a module that imports nanoserve's metrics scores 0.
"""

from __future__ import annotations

import math  # noqa: F401 (you will want it)
from collections.abc import Sequence

LIMITS = ("ttft", "tpot", "e2e")


def succeeded(result: dict, i: int) -> bool:
    """Request i succeeded: no error and at least one output token."""
    raise NotImplementedError("ex10: write succeeded")


def tpot(result: dict, i: int) -> float | None:
    """Time per output token after the first, seconds; None for fewer than 2 tokens."""
    raise NotImplementedError("ex10: write tpot")


def meets_slo(result: dict, i: int, slo: dict[str, float]) -> bool:
    """Request i succeeded and is within every limit of `slo`."""
    raise NotImplementedError("ex10: write meets_slo")


def attainment(result: dict, slo: dict[str, float]) -> float:
    """Fraction of the requests sent that met the SLO (nan when none was sent)."""
    raise NotImplementedError("ex10: write attainment")


def goodput(result: dict, slo: dict[str, float]) -> float:
    """Requests per second that met the SLO, over the run's duration."""
    raise NotImplementedError("ex10: write goodput")


def max_rate_meeting(results: Sequence[dict], slo: dict[str, float], target: float = 0.9) -> float | None:
    """The highest request_rate among `results` (a rate sweep) whose attainment is at least
    `target`; None when no run reaches it."""
    raise NotImplementedError("ex10: write max_rate_meeting")
