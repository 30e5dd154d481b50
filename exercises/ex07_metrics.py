"""Exercise 7: serving metrics. TTFT, ITL, TPOT, goodput at an SLO, stratified by length.

The engine stamps each request (`RequestOutput.metrics`, seconds on the engine clock):
arrival_time, first_scheduled_time, first_token_time, token_times (one per generated token,
so token_times[0] == first_token_time) and finished_time. From these, as vLLM's benchmark:

    TTFT = first_token_time - arrival_time          (queueing + prefill: what a user waits)
    ITL  = token_times[i+1] - token_times[i]        (each gap between consecutive tokens)
    TPOT = (E2E - TTFT) / (n - 1), n = len(token_ids), defined only for n > 1
    E2E  = finished_time - arrival_time

Worked example: arrival 0.0, token_times [0.5, 0.6, 0.8], finished 0.8: TTFT 0.5, ITLs
[0.1, 0.2], TPOT (0.8 - 0.5) / 2 = 0.15, E2E 0.8.

A request is *completed* when finished normally: finished, neither aborted nor failed
(finish_reason not "abort" or "error"), with at least one token, a first_token_time and a
finished_time. Only completed requests count in goodput and stratification. Write these from the
definitions above: a module that imports nanoserve's own metrics scores 0.
"""

from __future__ import annotations

import math  # noqa: F401 (you will want it)
from collections.abc import Callable, Sequence

import numpy as np  # noqa: F401 (you will want it)


def is_completed(output) -> bool:
    """Finished normally (not aborted, not failed), with at least one token and the timestamps above."""
    raise NotImplementedError("ex07: write is_completed")


def ttft(output) -> float | None:
    """Time to first token, seconds; None if the request has no first token yet."""
    raise NotImplementedError("ex07: write ttft")


def inter_token_latencies(output) -> list[float]:
    """The gaps between consecutive token_times (n - 1 of them; [] for n <= 1).

    Hint: the first token's wait is TTFT, not an inter-token latency.
    """
    raise NotImplementedError("ex07: write inter_token_latencies")


def tpot(output) -> float | None:
    """Mean time per output token after the first: (E2E - TTFT) / (n - 1).

    None when n <= 1 or when finished_time or first_token_time is missing.
    """
    raise NotImplementedError("ex07: write tpot")


def e2e(output) -> float | None:
    """End-to-end latency, seconds; None if not finished."""
    raise NotImplementedError("ex07: write e2e")


def goodput(outputs: Sequence, slo: dict[str, float], duration: float) -> float:
    """Requests per second that completed *and* met every limit of the SLO.

    slo maps "ttft", "tpot" or "e2e" to a limit in seconds, e.g. {"ttft": 0.5, "tpot": 0.05}.
    A metric a request doesn't have (TPOT of a 1-token output) counts as met.
    Example: 10 requests over 2.0 s of which 6 completed within the limits: 3.0 req/s.
    """
    raise NotImplementedError("ex07: write goodput")


def stratify_by_output_length(outputs: Sequence, metric: Callable, edges: Sequence[int]) -> list[float]:
    """Median of `metric` over the completed requests of each output-length bucket.

    edges are increasing left edges: [1, 8, 32] makes buckets [1, 8), [8, 32), [32, inf) of
    len(token_ids). metric(output) returns seconds or None (None values are left out). Returns
    one median per bucket (numpy's median), NaN for a bucket with no values.
    Why: a TPOT or E2E averaged over all requests mixes 2-token and 500-token answers; per
    bucket you see how latency grows with length.
    """
    raise NotImplementedError("ex07: write stratify_by_output_length")
