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

import math
from collections.abc import Callable, Sequence

import numpy as np


def is_completed(output) -> bool:
    """Finished normally (not aborted, not failed), with at least one token and the timestamps above."""
    m = output.metrics
    return bool(output.finished and output.finish_reason not in ("abort", "error")
                and len(output.token_ids) > 0 and m.first_token_time is not None
                and m.finished_time is not None)


def ttft(output) -> float | None:
    """Time to first token, seconds; None if the request has no first token yet."""
    m = output.metrics
    return None if m.first_token_time is None else m.first_token_time - m.arrival_time


def inter_token_latencies(output) -> list[float]:
    """The gaps between consecutive token_times (n - 1 of them; [] for n <= 1).

    Hint: the first token's wait is TTFT, not an inter-token latency.
    """
    t = output.metrics.token_times
    return [b - a for a, b in zip(t, t[1:])]


def tpot(output) -> float | None:
    """Mean time per output token after the first: (E2E - TTFT) / (n - 1).

    None when n <= 1 or when finished_time or first_token_time is missing.
    """
    m, n = output.metrics, len(output.token_ids)
    if n <= 1 or m.finished_time is None or m.first_token_time is None:
        return None
    return (m.finished_time - m.first_token_time) / (n - 1)


def e2e(output) -> float | None:
    """End-to-end latency, seconds; None if not finished."""
    m = output.metrics
    return None if m.finished_time is None else m.finished_time - m.arrival_time


def goodput(outputs: Sequence, slo: dict[str, float], duration: float) -> float:
    """Requests per second that completed *and* met every limit of the SLO.

    slo maps "ttft", "tpot" or "e2e" to a limit in seconds, e.g. {"ttft": 0.5, "tpot": 0.05}.
    A metric a request doesn't have (TPOT of a 1-token output) counts as met.
    Example: 10 requests over 2.0 s of which 6 completed within the limits: 3.0 req/s.
    """
    fns = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
    good = 0
    for o in outputs:
        if not is_completed(o):
            continue
        values = ((fns[k](o), limit) for k, limit in slo.items())
        good += all(v is None or v <= limit for v, limit in values)
    return good / duration


def stratify_by_output_length(outputs: Sequence, metric: Callable, edges: Sequence[int]) -> list[float]:
    """Median of `metric` over the completed requests of each output-length bucket.

    edges are increasing left edges: [1, 8, 32] makes buckets [1, 8), [8, 32), [32, inf) of
    len(token_ids). metric(output) returns seconds or None (None values are left out). Returns
    one median per bucket (numpy's median), NaN for a bucket with no values.
    Why: a TPOT or E2E averaged over all requests mixes 2-token and 500-token answers; per
    bucket you see how latency grows with length.
    """
    done = [o for o in outputs if is_completed(o)]
    medians = []
    for lo, hi in zip(edges, [*edges[1:], None]):
        values = [metric(o) for o in done if len(o.token_ids) >= lo and (hi is None or len(o.token_ids) < hi)]
        values = [v for v in values if v is not None]
        medians.append(float(np.median(values)) if values else math.nan)
    return medians
