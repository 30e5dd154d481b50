"""Exercise 10 (the SLO of a served load), checked against nanoserve.measure.metrics on random
loads: each load is a list of client-side outputs, saved with loadgen's own writer
(LoadResult.to_json)."""

import math

import pytest
from exercise_checks import graded
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.measure import metrics as M
from nanoserve.measure.http_result import HTTPOutput, LoadResult
from nanoserve.outputs import RequestMetrics


@pytest.fixture(scope="module")
def ex(load):
    return load("ex10_slo")


def http_output(i, arrival, ttft, gaps, failed):
    m = RequestMetrics(arrival_time=arrival)
    if not failed and gaps is not None:
        t = arrival + ttft
        m.first_token_time = t
        m.token_times.append(t)
        for g in gaps:
            t += g
            m.token_times.append(t)
        m.finished_time = t
    n = 0 if failed else len(m.token_times)
    return HTTPOutput(str(i), 16, m, n, not failed, None if failed else "length",
                      error="connection reset" if failed else "")


@st.composite
def loads(draw, rate=None):
    outs = []
    for i in range(draw(st.integers(1, 14))):
        failed = draw(st.booleans()) and draw(st.booleans())
        outs.append(http_output(i, draw(st.floats(0.0, 10.0)), draw(st.floats(0.01, 2.0)),
                                draw(st.lists(st.floats(0.0, 0.4), max_size=12)), failed))
    duration = draw(st.floats(1.0, 30.0))
    config = {"request_rate": rate if rate is not None else draw(st.floats(0.5, 20.0))}
    return outs, LoadResult(outs, duration, config).to_json()


slos = st.fixed_dictionaries({}, optional={"ttft": st.floats(0.05, 2.0), "tpot": st.floats(0.01, 0.4),
                                           "e2e": st.floats(0.2, 6.0)})


def test_worked_example(ex):
    result = {"ttfts": [0.2, 0.9, 0.1], "itls": [[0.1] * 10, [0.2] * 3, []],
              "latencies": [1.2, 1.5, 0.0], "output_lens": [11, 4, 0], "errors": ["", "", "timeout"],
              "duration": 2.0, "request_rate": 1.5}
    slo = {"ttft": 0.5, "tpot": 0.15}
    got = [ex.meets_slo(result, i, slo) for i in range(3)]
    assert got == [True, False, False], f"meets_slo of the worked example's three requests: got {got}"
    assert ex.tpot(result, 0) == pytest.approx(0.1), \
        f"TPOT of request 0: got {ex.tpot(result, 0)}, expected (1.2 - 0.2) / 10 = 0.1"
    assert ex.attainment(result, slo) == pytest.approx(1 / 3), \
        f"attainment: got {ex.attainment(result, slo)}, expected 1 of 3 requests sent"
    assert ex.goodput(result, slo) == pytest.approx(0.5), \
        f"goodput: got {ex.goodput(result, slo)}, expected 1 request / 2.0 s = 0.5"


@graded(60)
@given(load=loads(), slo=slos)
def test_meets_slo_matches_nanoserve(ex, load, slo):
    outs, result = load
    for i, o in enumerate(outs):
        want, got = M.meets_slo(o, slo), ex.meets_slo(result, i, slo)
        assert got == want, (
            f"request {i} ({'failed' if o.error else f'{o.output_len} tokens'}, TTFT {M.ttft(o)}, TPOT "
            f"{M.tpot(o)}, E2E {M.e2e(o)}) at SLO {slo}: meets_slo returned {got}, expected {want}")
        if not o.error and o.output_len:
            t = ex.tpot(result, i)
            want_t = M.tpot(o)
            assert (t is None and want_t is None) or (
                t is not None and want_t is not None and math.isclose(t, want_t, abs_tol=1e-9)), \
                f"TPOT of a {o.output_len}-token request: got {t}, expected {want_t}"


@graded(60)
@given(load=loads(), slo=slos)
def test_attainment_and_goodput_match_nanoserve(ex, load, slo):
    outs, result = load
    met = sum(M.meets_slo(o, slo) for o in outs)
    want_att, want_good = met / len(outs), M.goodput(outs, slo, result["duration"])
    got_att, got_good = ex.attainment(result, slo), ex.goodput(result, slo)
    assert got_att == pytest.approx(want_att), (
        f"attainment of {len(outs)} requests sent ({met} met SLO {slo}, "
        f"{sum(bool(o.error) for o in outs)} failed): got {got_att}, expected {want_att}: divide by every "
        f"request sent")
    assert got_good == pytest.approx(want_good), (
        f"goodput over {result['duration']:.4g} s: got {got_good}, expected {want_good} req/s")


@graded(40)
@given(sweep=st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]), min_size=1, max_size=5, unique=True)
       .flatmap(lambda rates: st.tuples(*[loads(rate=r) for r in rates])),
       slo=slos, target=st.sampled_from([0.5, 0.9, 0.99]))
def test_max_rate_meeting_the_target(ex, sweep, slo, target):
    results = [r for _, r in sweep]
    attained = [sum(M.meets_slo(o, slo) for o in outs) / len(outs) for outs, _ in sweep]
    ok = [r["request_rate"] for r, a in zip(results, attained) if a >= target]
    want = max(ok) if ok else None
    got = ex.max_rate_meeting(results, slo, target)
    assert got == want, (
        f"rates {[r['request_rate'] for r in results]} with attainment {[round(a, 3) for a in attained]}: "
        f"max_rate_meeting(target={target}) returned {got}, expected {want}")
