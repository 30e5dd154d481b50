"""Exercise 9 (what a token costs), checked against nanoserve.measure.cost's token-share rule on
random step traces, and against a provider's bill written out here."""

import math
from types import SimpleNamespace

import pytest
from exercise_checks import graded
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.measure.cost import attribute_time, cost_report
from nanoserve.outputs import RequestMetrics, RequestOutput


@pytest.fixture(scope="module")
def ex(load):
    return load("ex09_cost")


def step(start, seconds, prefill, decode):
    return SimpleNamespace(start=start, end=start + seconds, num_prefill_tokens=prefill,
                           num_decode_tokens=decode)


@st.composite
def traces(draw):
    t, out = 0.0, []
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.floats(0.0, 0.5))  # idle time between steps is paid for too
        seconds = draw(st.floats(1e-4, 0.3))
        prefill, decode = draw(st.sampled_from([0, 0, 1, 7, 64, 300])), draw(st.integers(0, 32))
        out.append(step(t, seconds, prefill, decode))
        t += seconds
    return out


WORKED = [step(0.0, 1.0, 30, 10), step(1.0, 0.5, 0, 5)]


def close(a, b) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_worked_example(ex):
    got = ex.step_seconds(WORKED)
    assert got == pytest.approx((0.75, 0.75)), \
        f"step_seconds of the worked example: got {got}, expected (0.75, 0.75)"
    got = ex.usd_per_1m(WORKED, 3.6)
    assert got == pytest.approx((25.0, 50.0)), \
        f"usd_per_1m of the worked example at $3.60/h: got {got}, expected (25, 50)"


@graded(60)
@given(trace=traces())
def test_step_seconds_split_by_token_share(ex, trace):
    want, got = attribute_time(trace, "tokens"), ex.step_seconds(trace)
    assert all(map(close, got, want)), (
        f"{len(trace)} steps: got (prefill, decode) = ({got[0]:.8g}, {got[1]:.8g}) s, expected "
        f"({want[0]:.8g}, {want[1]:.8g}): split each step's time by its prefill : decode token "
        f"counts, leave out steps without tokens")


@graded(60)
@given(trace=traces(), price=st.floats(0.1, 40.0), idle=st.sampled_from([None, 0.0, 2.5]))
def test_usd_per_1m_matches_the_token_share_rule(ex, trace, price, idle):
    span = max(s.end for s in trace) - min(s.start for s in trace)
    duration = None if idle is None else span + idle
    want = cost_report(trace, price, duration, method="tokens")
    got = ex.usd_per_1m(trace, price, duration)
    assert close(got[0], want.usd_per_1m_input) and close(got[1], want.usd_per_1m_output), (
        f"{len(trace)} steps at ${price:.4g}/h over {want.duration:.6g} s: got ${got[0]:.8g} / "
        f"${got[1]:.8g} per 1M input / output tokens, expected ${want.usd_per_1m_input:.8g} / "
        f"${want.usd_per_1m_output:.8g}")


def output(prompt, generated, cached, finish="length", finished=True):
    return RequestOutput("r", list(range(prompt)), list(range(generated)), finished, finish,
                         RequestMetrics(0.0), num_cached_tokens=cached)


@st.composite
def outputs(draw):
    """Finished, aborted, failed and running requests, some with prefix-cache hits (-1: never
    admitted)."""
    outs = []
    for _ in range(draw(st.integers(0, 12))):
        prompt = draw(st.integers(1, 400))
        cached = draw(st.sampled_from([-1, 0, 0, prompt // 2, prompt - 1]))
        finish = draw(st.sampled_from(["length", "length", "eos", "abort", "error"]))
        outs.append(output(prompt, draw(st.integers(0, 60)), cached, finish, draw(st.booleans())))
    return outs


def provider_bill(outs, inp, out, cached_in) -> float:
    usd = 0.0
    for o in outs:
        if o.finished and o.finish_reason not in ("abort", "error"):
            c = max(o.num_cached_tokens, 0)
            usd += ((len(o.prompt_token_ids) - c) * inp + c * cached_in + len(o.token_ids) * out) / 1e6
    return usd


def test_bill_worked_example(ex):
    outs = [output(1000, 100, 800), output(1000, 50, 0), output(500, 10, 0, "abort")]
    got = ex.bill(outs, 3.0, 15.0, 0.3)
    want = (200 * 3.0 + 800 * 0.3 + 1000 * 3.0 + 150 * 15.0) / 1e6
    assert got == pytest.approx(want), (
        f"bill: got ${got:.8g}, expected ${want:.8g}: 1200 uncached prompt tokens at $3/1M, 800 cached "
        f"at $0.3/1M, 150 generated at $15/1M; the aborted request is not billed")


@graded(60)
@given(outs=outputs(), inp=st.floats(0.05, 10.0), out_ratio=st.floats(1.0, 8.0), discount=st.floats(0.0, 1.0))
def test_bill_with_cached_input(ex, outs, inp, out_ratio, discount):
    cached_in = inp * (1 - discount)
    out = inp * out_ratio
    want, got = provider_bill(outs, inp, out, cached_in), ex.bill(outs, inp, out, cached_in)
    cached = sum(max(o.num_cached_tokens, 0) for o in outs)
    assert close(got, want), (
        f"bill of {len(outs)} requests ({cached} cached prompt tokens; aborted, failed and unfinished "
        f"ones are not billed) at ${inp:.4g} / ${out:.4g} / ${cached_in:.4g} per 1M input / output / "
        f"cached input: got ${got:.8g}, expected ${want:.8g}")


@graded(40)
@given(outs=outputs(), inp=st.floats(0.05, 10.0), discount=st.floats(0.0, 1.0))
def test_cache_savings(ex, outs, inp, discount):
    cached_in = inp * (1 - discount)
    want = provider_bill(outs, inp, 0.0, inp) - provider_bill(outs, inp, 0.0, cached_in)
    got = ex.cache_savings(outs, inp, cached_in)
    assert close(got, want) or abs(got - want) < 1e-12, (
        f"savings on {len(outs)} requests at ${inp:.4g} per 1M input, ${cached_in:.4g} cached: got "
        f"${got:.8g}, expected ${want:.8g} (cached tokens x the discount per token)")
