"""Exercise 7 (serving metrics), checked against nanoserve.measure.metrics on random RequestOutputs."""

import math

import pytest
from exercise_checks import graded
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.measure import metrics as M
from nanoserve.outputs import RequestMetrics, RequestOutput


@pytest.fixture(scope="module")
def ex(load):
    return load("ex07_metrics")


def make_output(arrival, queue, gaps, state, prompt_len=4, rid="r"):
    """gaps[0] is the prefill time, then one gap per further token; state: done|abort|error|running."""
    m = RequestMetrics(arrival_time=arrival)
    t = arrival + queue
    m.first_scheduled_time = t
    for g in gaps:
        t += g
        m.token_times.append(t)
    m.first_token_time = m.token_times[0] if m.token_times else None
    if state != "running":
        m.finished_time = t + (0.001 if state in ("abort", "error") else 0.0)
    return RequestOutput(rid, list(range(prompt_len)), list(range(len(gaps))), state != "running",
                         {"done": "length", "abort": "abort", "error": "error", "running": None}[state], m)


times = st.floats(0.0, 2.0, allow_nan=False)
outputs = st.builds(make_output, st.floats(0.0, 100.0), times, st.lists(times, max_size=40),
                    st.sampled_from(["done", "done", "done", "abort", "error", "running"]))


def worked_example():
    return make_output(0.0, 0.2, [0.3, 0.1, 0.2], "done")  # tokens at 0.5, 0.6, 0.8


def test_worked_example(ex):
    o = worked_example()
    assert ex.ttft(o) == pytest.approx(0.5), f"TTFT: got {ex.ttft(o)}, expected 0.5"
    assert ex.inter_token_latencies(o) == pytest.approx([0.1, 0.2]), \
        f"ITLs: got {ex.inter_token_latencies(o)}, expected [0.1, 0.2]"
    assert ex.tpot(o) == pytest.approx(0.15), f"TPOT: got {ex.tpot(o)}, expected (0.8 - 0.5) / 2 = 0.15"
    assert ex.e2e(o) == pytest.approx(0.8), f"E2E: got {ex.e2e(o)}, expected 0.8"


def same(got, want):
    return (got is None and want is None) or (got is not None and want is not None and math.isclose(
        got, want, rel_tol=1e-9, abs_tol=1e-12))


@graded(60)
@given(o=outputs)
def test_per_request_metrics_match_nanoserve(ex, o):
    n = len(o.token_ids)
    for name, got, want in (("ttft", ex.ttft(o), M.ttft(o)), ("tpot", ex.tpot(o), M.tpot(o)),
                            ("e2e", ex.e2e(o), M.e2e(o))):
        assert same(got, want), \
            f"{name} of a {n}-token output ({o.finish_reason}): got {got}, expected {want}"
    got, want = ex.inter_token_latencies(o), M.itls(o)
    assert len(got) == len(want) and all(map(math.isclose, got, want)), (
        f"ITLs of a {n}-token output: got {len(got)} gaps {got[:3]}..., expected {len(want)}: {want[:3]}...")


def test_tpot_of_one_token_is_undefined(ex):
    o = make_output(0.0, 0.1, [0.4], "done")
    assert ex.tpot(o) is None, "TPOT of a 1-token output has no gaps: return None"


@graded(60)
@given(outs=st.lists(outputs, max_size=20), ttft_slo=st.floats(0.1, 3.0), tpot_slo=st.floats(0.05, 2.0),
       keys=st.sampled_from([("ttft",), ("tpot",), ("ttft", "tpot"), ("e2e",), ("ttft", "tpot", "e2e")]),
       duration=st.floats(1.0, 100.0))
def test_goodput_matches_nanoserve(ex, outs, ttft_slo, tpot_slo, keys, duration):
    slo = {k: {"ttft": ttft_slo, "tpot": tpot_slo, "e2e": 2 * ttft_slo + 10 * tpot_slo}[k] for k in keys}
    got, want = ex.goodput(outs, slo, duration), M.goodput(outs, slo, duration)
    assert got == pytest.approx(want), (
        f"goodput of {len(outs)} requests ({sum(M.completed(o) for o in outs)} completed) at SLO "
        f"{slo} over {duration:.2f} s: got {got}, expected {want} req/s")


def test_goodput_counts_only_completed_requests(ex):
    outs = [make_output(0.0, 0.0, [0.1, 0.1], s) for s in ("done", "abort", "error", "running")]
    got = ex.goodput(outs, {"ttft": 1.0}, 1.0)
    assert got == pytest.approx(1.0), (
        f"one completed request in 1 s (the others aborted, failed with an error, still running): "
        f"expected 1.0 req/s, got {got}")
    failed = outs[2]
    assert not ex.is_completed(failed), "is_completed: a request that finished with an error is not completed"


@graded(60)
@given(outs=st.lists(outputs, max_size=25), edges=st.sampled_from([[1, 8], [1, 2, 16, 32], [1, 4, 10]]),
       metric=st.sampled_from(["ttft", "tpot", "e2e"]))
def test_stratified_medians_match_nanoserve(ex, outs, edges, metric):
    fn = M.REQUEST_METRICS[metric]
    want = [s.summary.median for s in M.stratify(outs, fn, by="output", buckets=edges).strata]
    got = ex.stratify_by_output_length(outs, fn, edges)
    assert len(got) == len(want), f"{len(edges)} edges make {len(want)} buckets, got {len(got)} medians"
    for (lo, hi), g, w in zip(zip(edges, [*edges[1:], "inf"]), got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w), (
            f"median {metric} of outputs of length [{lo}, {hi}): got {g}, expected {w}")
