"""Cost attribution on synthetic step traces with known coefficients."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from nanoserve.measure.cost import (
    PROVIDER_PRICES,
    Run,
    attribute_time,
    billed_tokens,
    cheapest_at_slo,
    cost_report,
    evaluate_runs,
    fit_step_time,
)
from nanoserve.outputs import RequestMetrics, RequestOutput

A, B, C = 0.010, 2e-5, 1e-3  # 10 ms per step, 20 us per prefill token, 1 ms per decode token


def trace_of(p, d, noise=0.0, seed=0, as_dict=True):
    """Back-to-back steps timed by the linear model (plus optional Gaussian noise)."""
    t = A + B * np.asarray(p) + C * np.asarray(d)
    t = t + np.random.default_rng(seed).normal(0, noise, len(t))
    ends = np.cumsum(t)
    rows = [{"start": float(e - dt), "end": float(e), "num_prefill_tokens": int(pp),
                 "num_decode_tokens": int(dd)} for e, dt, pp, dd in zip(ends, t, p, d)]
    return rows if as_dict else [SimpleNamespace(**r) for r in rows]


def mixed_sizes(n=300, seed=0):
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 3, n)  # pure prefill, pure decode, mixed
    p = np.where(kind == 1, 0, rng.integers(16, 512, n))
    d = np.where(kind == 0, 0, rng.integers(1, 64, n))
    return p, d


def test_fit_recovers_coefficients_exactly():
    m = fit_step_time(trace_of(*mixed_sizes()))
    assert (m.a, m.b, m.c) == pytest.approx((A, B, C), rel=1e-6)
    assert m.r2 == pytest.approx(1.0)


def test_fit_recovers_coefficients_under_noise_and_attribute_access():
    m = fit_step_time(trace_of(*mixed_sizes(2000), noise=5e-4, as_dict=False))
    assert m.a == pytest.approx(A, rel=0.05)
    assert m.b == pytest.approx(B, rel=0.05)
    assert m.c == pytest.approx(C, rel=0.05)


def test_linear_attribution_splits_mixed_steps_by_marginal_cost():
    p, d = mixed_sizes()
    trace = trace_of(p, d)
    t = A + B * p + C * d
    want_pre = float((t * B * p / (B * p + C * d)).sum())
    pre, dec = attribute_time(trace)
    assert pre == pytest.approx(want_pre) and pre + dec == pytest.approx(t.sum())
    # token share hands decode far less time: a decode token is 50x a prefill token here
    pre_tok, dec_tok = attribute_time(trace, method="tokens")
    assert pre_tok > pre and dec_tok < dec
    assert pre_tok == pytest.approx(float((t * p / (p + d)).sum()))


def test_pure_steps_need_no_rule():
    trace = trace_of([100, 0, 300, 0], [0, 8, 0, 16])
    t = A + B * np.array([100, 0, 300, 0]) + C * np.array([0, 8, 0, 16])
    for method in ("linear", "tokens"):
        pre, dec = attribute_time(trace, method)
        assert pre == pytest.approx(t[[0, 2]].sum()) and dec == pytest.approx(t[[1, 3]].sum())


def test_cost_per_million_tokens_with_idle_time():
    # $3600/h = $1/s. 1 s of prefill for 1000 tokens, 1 s of decode for 10 tokens.
    trace = [{"start": 0.0, "end": 1.0, "num_prefill_tokens": 1000, "num_decode_tokens": 0},
             SimpleNamespace(start=1.0, end=2.0, num_prefill_tokens=0, num_decode_tokens=10)]
    r = cost_report(trace, price_per_hour=3600, providers={})
    assert r.duration == pytest.approx(2.0)
    assert r.usd_per_1m_input == pytest.approx(1000.0)
    assert r.usd_per_1m_output == pytest.approx(100_000.0)
    assert r.output_input_ratio == pytest.approx(100.0)
    idle = cost_report(trace, 3600, duration=4.0, input_tokens=2000, output_tokens=10)
    assert idle.prefill_seconds == pytest.approx(2.0)  # idle time shared in proportion
    assert idle.usd_per_1m_input == pytest.approx(1000.0)
    assert idle.usd_per_1m_output == pytest.approx(200_000.0)
    assert "this run" in idle.table() and "openai/gpt-4o" in idle.table()


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="empty"):
        cost_report([], 2.0)
    with pytest.raises(ValueError, match="price_per_hour=-1"):
        cost_report(trace_of([10], [0]), -1)
    with pytest.raises(ValueError, match="flops"):
        attribute_time(trace_of([10], [0]), method="flops")


def test_provider_prices_are_labelled():
    for pp in PROVIDER_PRICES.values():
        assert pp.ratio > 1 and pp.source and pp.date


def req(arrival, times, n_in=100):
    m = RequestMetrics(arrival, arrival, times[0], list(times), times[-1])
    return RequestOutput("r", [1] * n_in, [2] * len(times), True, "length", m)


def run(label, first_token_delay, duration, price=3600.0, n=10):
    """n requests; the trace fills `duration` seconds with one prefill and one decode step."""
    outs = [req(0.0, [first_token_delay, first_token_delay + 0.01]) for _ in range(n)]
    trace = [{"start": 0.0, "end": duration / 2, "num_prefill_tokens": 100 * n, "num_decode_tokens": 0},
             {"start": duration / 2, "end": duration, "num_prefill_tokens": 0, "num_decode_tokens": n}]
    return Run(label, outs, trace, price, duration=duration)


def test_cheapest_run_meeting_the_slo():
    runs = [run("cap=1", 0.1, 10.0), run("cap=8", 0.2, 2.0), run("cap=64", 0.9, 1.0)]
    best = cheapest_at_slo(runs, "ttft<=500ms")
    assert best.label == "cap=8"  # cap=64 is cheaper but misses TTFT
    assert cheapest_at_slo(runs, "ttft<=2s").label == "cap=64"
    assert cheapest_at_slo(runs, "ttft<=50ms") is None
    evals = evaluate_runs(runs, "ttft<=500ms")
    assert [e.meets_slo for e in evals] == [True, True, False]
    # $1/s for 2 s over 10 * (100 + 2) billed tokens
    assert evals[1].usd_per_1m_total == pytest.approx(2.0 / 1020 * 1e6)
    assert billed_tokens(runs[0].outputs) == (1000, 20)
    with pytest.raises(ValueError, match="cheapest"):
        cheapest_at_slo(runs, "ttft<=1s", key="cheapest")


def test_no_tokens_gives_nan_not_a_crash():
    r = cost_report(trace_of([0], [4]), 1.0, input_tokens=0)
    assert math.isnan(r.usd_per_1m_input) and math.isnan(r.output_input_ratio)
