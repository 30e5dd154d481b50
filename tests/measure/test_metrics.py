"""Serving metrics on hand-made timestamps with known answers."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.measure.metrics import (
    Summary,
    completed,
    compute_metrics,
    e2e,
    goodput,
    itl_max,
    itl_p99,
    itls,
    meets_slo,
    parse_slo,
    percentiles,
    prefill_time,
    queue_time,
    run_duration,
    stratify,
    tpot,
    ttft,
)
from nanoserve.outputs import RequestMetrics, RequestOutput


def req(arrival, scheduled, times, finished=None, n_in=4, reason="length", done=True, rid="r"):
    """A request whose first token lands at times[0] and that finishes at its last token."""
    times = list(times)
    m = RequestMetrics(arrival, scheduled, times[0] if times else None, times,
                       (times[-1] if times else None) if finished is None else finished)
    return RequestOutput(rid, list(range(n_in)), list(range(len(times))), done,
                         reason if done else None, m)


def test_per_request_metrics():
    o = req(0.0, 0.1, [0.3, 0.4, 0.6, 0.7])
    assert ttft(o) == pytest.approx(0.3)
    assert queue_time(o) == pytest.approx(0.1)
    assert prefill_time(o) == pytest.approx(0.2)
    assert itls(o) == pytest.approx([0.1, 0.2, 0.1])
    assert itl_max(o) == pytest.approx(0.2)
    assert itl_p99(o) == pytest.approx(np.percentile([0.1, 0.2, 0.1], 99))
    assert tpot(o) == pytest.approx(0.4 / 3)
    assert e2e(o) == pytest.approx(0.7)


def test_one_token_output_has_ttft_but_no_tpot_or_itl():
    o = req(1.0, 1.5, [2.0])
    assert ttft(o) == pytest.approx(1.0) and e2e(o) == pytest.approx(1.0)
    assert tpot(o) is None and itls(o) == [] and itl_max(o) is None
    m = compute_metrics([o, req(0.0, 0.0, [0.5, 0.7, 0.8])])
    assert m.ttft.count == 2 and m.tpot.count == 1 and m.itl.count == 2
    assert m.tpot.mean == pytest.approx(0.15)


def test_aborted_failed_and_unfinished_are_counted_not_timed():
    good = req(0.0, 0.0, [0.1, 0.2])
    aborted = req(0.0, 0.0, [5.0, 9.0], reason="abort")
    failed = req(0.0, 0.0, [7.0, 8.0], reason="error")  # the engine finished it with an error
    running = req(0.0, 0.0, [3.0], done=False)
    waiting = RequestOutput("w", [1, 2], [], False, None, RequestMetrics(0.0))
    m = compute_metrics([good, aborted, failed, running, waiting], slo="ttft<=10s")
    assert (m.num_requests, m.completed, m.aborted, m.failed, m.unfinished) == (5, 1, 1, 1, 2)
    assert m.ttft.count == 1 and m.ttft.max == pytest.approx(0.1)
    assert m.e2e.max == pytest.approx(0.2) and m.good_requests == 1
    assert m.total_output_tokens == 2 and m.total_input_tokens == 4
    assert not any(map(completed, (aborted, failed, running, waiting)))
    assert "1/1/1/2" in m.table()


def test_itl_is_pooled_over_requests():
    a = req(0.0, 0.0, [1.0, 1.1, 1.2])  # gaps 0.1, 0.1
    b = req(0.0, 0.0, [1.0, 2.0])  # gap 1.0
    m = compute_metrics([a, b])
    assert m.itl.count == 3
    assert m.itl.mean == pytest.approx(1.2 / 3)  # pooled, not the mean of per-request means
    assert m.itl.median == pytest.approx(0.1)
    assert m.tpot.mean == pytest.approx((0.1 + 1.0) / 2)


def test_throughput_over_run_duration():
    a = req(0.0, 0.0, [1.0, 2.0], n_in=10)
    b = req(1.0, 1.0, [3.0, 3.5, 4.0], n_in=20)
    m = compute_metrics([a, b])
    assert m.duration == pytest.approx(4.0) == run_duration([a, b])
    assert m.request_throughput == pytest.approx(0.5)
    assert m.output_throughput == pytest.approx(5 / 4)
    assert m.total_token_throughput == pytest.approx(35 / 4)
    assert compute_metrics([a, b], duration=10.0).output_throughput == pytest.approx(0.5)


def test_works_on_any_object_with_the_same_attributes():
    m = SimpleNamespace(arrival_time=0.0, first_scheduled_time=0.0, first_token_time=0.2,
                        token_times=[0.2, 0.3], finished_time=0.3)
    o = SimpleNamespace(request_id="x", prompt_token_ids=[1, 2], token_ids=[5, 6], finished=True,
                        finish_reason="eos", metrics=m)
    assert compute_metrics([o]).ttft.mean == pytest.approx(0.2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50))
def test_percentiles_match_numpy(values):
    p = percentiles(values, (1, 50, 90, 99))
    assert [p[q] for q in (1, 50, 90, 99)] == pytest.approx(np.percentile(values, [1, 50, 90, 99]))
    s = Summary.of(values)
    assert (s.count, s.median) == (len(values), pytest.approx(np.median(values)))
    assert s.std == pytest.approx(np.std(values), abs=1e-6)


def test_percentiles_of_nothing_are_nan():
    assert all(math.isnan(v) for v in percentiles([]).values())
    assert Summary.of([]).count == 0 and math.isnan(Summary.of([]).p99)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=30))
def test_tpot_is_mean_itl_when_finish_is_last_token(gaps):
    o = req(0.0, 0.0, np.cumsum([0.5, *gaps]))
    assert tpot(o) == pytest.approx(np.mean(itls(o)))


def test_parse_slo():
    assert parse_slo("ttft<=500ms,itl_p99<=100ms,tpot<=50ms,e2e<=2s") == pytest.approx(
        {"ttft": 0.5, "itl_p99": 0.1, "tpot": 0.05, "e2e": 2.0})
    assert parse_slo(" TTFT <= 250 us , itl_max<=1.5s") == pytest.approx(
        {"ttft": 250e-6, "itl_max": 1.5})
    assert parse_slo({"ttft": 1}) == {"ttft": 1.0}


@pytest.mark.parametrize("bad, named", [
    ("ttft<=500", "ttft<=500"),  # no unit
    ("ttft<500ms", "ttft<500ms"),
    ("ttft<=500ms,bogus", "bogus"),
    ("latency<=1s", "latency"),
    ("ttft<=1s,ttft<=2s", "ttft"),
    ("", "''"),
])
def test_bad_slo_raises_naming_it(bad, named):
    with pytest.raises(ValueError, match=named.replace("<", ".").replace("*", ".")):
        parse_slo(bad)


def test_parse_slo_takes_vllm_goodput_syntax():
    """`vllm bench serve --goodput ttft:500 tpot:50 e2el:2000`: milliseconds, e2el is our e2e."""
    want = {"ttft": 0.5, "tpot": 0.05, "e2e": 2.0}
    assert parse_slo("ttft:500 tpot:50 e2el:2000") == pytest.approx(want)
    assert parse_slo(["ttft:500", "tpot:50", "e2el:2000"]) == pytest.approx(want)  # argparse nargs="+"
    assert parse_slo("  ttft:0.5  ") == pytest.approx({"ttft": 5e-4})
    assert parse_slo("e2el:1e3") == pytest.approx({"e2e": 1.0})
    o = req(0.0, 0.0, [0.3, 0.4])  # ttft 0.3 s, e2e 0.4 s
    assert meets_slo(o, "ttft:300 e2el:400") and not meets_slo(o, "ttft:299")
    assert meets_slo(o, "ttft:300 e2el:400") == meets_slo(o, "ttft<=300ms,e2e<=400ms")


@pytest.mark.parametrize("bad, named", [
    ("ttft:500 itl:10", "itl"),  # vLLM's goodput has ttft, tpot, e2el only
    ("e2e:100", "e2e"),  # vLLM spells it e2el
    ("ttft:fast", "ttft:fast"),
    ("ttft:", "ttft:"),
    ("ttft:-5", "-5"),
    ("ttft:nan", "ttft:nan"),
    ("ttft:500 ttft:600", "twice"),
    ("ttft:5:00", "ttft:5:00"),
])
def test_bad_goodput_raises_naming_it(bad, named):
    with pytest.raises(ValueError, match=named):
        parse_slo(bad)


def test_bad_slo_dict_raises():
    with pytest.raises(ValueError, match="nope"):
        parse_slo({"nope": 1.0})
    with pytest.raises(ValueError, match="-1"):
        parse_slo({"ttft": -1})


def test_meets_slo_and_goodput():
    fast = req(0.0, 0.0, [0.1, 0.2, 0.3])
    slow_first = req(0.0, 0.0, [0.9, 1.0])
    stall = req(0.0, 0.0, [0.1, 0.2, 0.9, 1.0])  # one 0.7 s gap; tpot 0.3 s
    single = req(0.0, 0.0, [0.2])  # no tpot or itl: those limits count as met
    aborted = req(0.0, 0.0, [0.1, 0.2], reason="abort")
    outs = [fast, slow_first, stall, single, aborted]
    slo = "ttft<=500ms,itl_max<=500ms"
    assert [meets_slo(o, slo) for o in outs] == [True, False, False, True, False]
    assert meets_slo(stall, "ttft<=500ms,tpot<=400ms")
    assert not meets_slo(stall, "itl_p99<=600ms")
    assert goodput(outs, slo, duration=2.0) == pytest.approx(1.0)
    m = compute_metrics(outs, slo=slo)
    assert m.good_requests == 2 and m.goodput == pytest.approx(2 / m.duration)
    assert m.slo_attainment == pytest.approx(2 / 5)
    assert m.to_dict()["slo"] == pytest.approx({"ttft": 0.5, "itl_max": 0.5})
    text = m.table()
    assert "TTFT" in text and "Goodput" in text and "ITL" in text


def test_stratify_by_output_length():
    outs = [req(0.0, 0.0, np.arange(1, n + 1) * 0.1) for n in (1, 5, 40, 40, 200)]
    s = stratify(outs, metric="e2e", by="output", buckets=[1, 32, 128])
    assert [(x.lo, x.hi, x.num_requests) for x in s.strata] == [(1, 32, 2), (32, 128, 2),
                                                                 (128, None, 1)]
    assert s.strata[0].summary.mean == pytest.approx((0.1 + 0.5) / 2)
    assert s.strata[1].summary.median == pytest.approx(4.0)
    assert s.strata[2].summary.p99 == pytest.approx(20.0)
    assert "[128, inf)" in s.table()


def test_stratify_input_leading_bucket_itl_and_callable():
    outs = [req(0.0, 0.0, [1.0, 1.5], n_in=n) for n in (2, 10, 100)]
    s = stratify(outs, metric="itl", by="input", buckets=[8, 64])
    assert [x.label for x in s.strata] == ["[0, 8)", "[8, 64)", "[64, inf)"]
    assert [x.summary.count for x in s.strata] == [1, 1, 1]
    s = stratify(outs, metric=lambda o: 2.0, by="input", buckets=[1000])
    assert s.strata[0].num_requests == 3 and s.strata[1].num_requests == 0
    assert math.isnan(s.strata[1].summary.mean)
    with pytest.raises(ValueError, match="latency"):
        stratify(outs, metric="latency")
    with pytest.raises(ValueError, match="prompt"):
        stratify(outs, by="prompt")
