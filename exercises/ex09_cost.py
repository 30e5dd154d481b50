"""Exercise 9: what a token costs. A run's price per token from its step trace; a bill with cached input.

A device is paid for by the hour, so a run costs price_per_hour * duration / 3600 dollars. Which
share of that buys input tokens and which output tokens? The engine's step trace says: every
step has `start` and `end` (seconds) and its `num_prefill_tokens` and `num_decode_tokens`
(engine.trace's StepRecords have these attributes). Split each step's time between its prefill
and its decode tokens in proportion to their counts (token share); a step with no tokens is
left out. The run's duration (by default from the first step's start to the last step's end)
is then split in the proportion of the prefill and decode seconds, and divided by the tokens
computed to give dollars per million input and output tokens.

A provider bills differently: per token, with a discount for prompt tokens its prefix cache
served (`RequestOutput.num_cached_tokens`). Lesson 06 measures the hit rate that earns it.

Worked example: two steps, (0.0-1.0 s, 30 prefill + 10 decode) and (1.0-1.5 s, 0 + 5): prefill
0.75 s, decode 0.25 + 0.5 = 0.75 s. At $3.60/h the 1.5 s cost $0.0015, half each: input $0.0015 /
2 / 30 tokens = $25 per 1M, output $0.00075 / 15 tokens = $50 per 1M.
Write these from the definitions: a module that imports nanoserve's cost module scores 0.
"""

from __future__ import annotations

from collections.abc import Sequence


def step_seconds(trace: Sequence) -> tuple[float, float]:
    """(prefill_seconds, decode_seconds): each step's end - start split by its token counts."""
    raise NotImplementedError("ex09: write step_seconds")


def usd_per_1m(trace: Sequence, price_per_hour: float,
               duration: float | None = None) -> tuple[float, float]:
    """(dollars per 1M input tokens, per 1M output tokens) of the run; duration in seconds
    (default: first step's start to last step's end). A side with no tokens costs nan."""
    raise NotImplementedError("ex09: write usd_per_1m")


def bill(outputs: Sequence, input_per_1m: float, output_per_1m: float,
         cached_input_per_1m: float) -> float:
    """Dollars a provider charges for the finished requests (finish_reason not "abort" or
    "error"): uncached prompt tokens at input_per_1m, cached ones (num_cached_tokens) at
    cached_input_per_1m, generated tokens at output_per_1m."""
    raise NotImplementedError("ex09: write bill")


def cache_savings(outputs: Sequence, input_per_1m: float, cached_input_per_1m: float) -> float:
    """Dollars the cached-input discount took off the bill of the finished requests."""
    raise NotImplementedError("ex09: write cache_savings")
