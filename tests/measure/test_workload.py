"""Seeded workloads: determinism, arrival statistics, structure of the special scenarios."""

import math

import numpy as np
import pytest

from nanoserve.measure.workload import (
    Choice,
    Fixed,
    LogNormal,
    Uniform,
    arrival_times,
    interference,
    poisson_arrivals,
    shared_prefix,
    synthetic,
)


def test_same_seed_same_workload_other_seed_differs():
    kw = {"input_len": Uniform(4, 64), "output_len": LogNormal(32, 0.8), "rate": 4.0, "burstiness": 0.5}
    a, b, c = synthetic(50, seed=1, **kw), synthetic(50, seed=1, **kw), synthetic(50, seed=2, **kw)
    assert a.requests == b.requests
    assert a.requests != c.requests


def test_rate_sweep_keeps_prompts_and_lengths():
    a = synthetic(20, Uniform(4, 64), Uniform(1, 32), rate=1.0, seed=3)
    b = synthetic(20, Uniform(4, 64), Uniform(1, 32), rate=8.0, burstiness=0.3, seed=3)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    assert a.output_lens == b.output_lens and a.arrival_times != b.arrival_times


def test_requests_are_greedy_fixed_length_and_avoid_special_ids():
    w = synthetic(30, input_len=16, output_len=Uniform(1, 9), vocab_size=100, token_low=10)
    assert w.input_lens == [16] * 30 and all(1 <= n <= 9 for n in w.output_lens)
    for r in w:
        assert r.params.temperature == 0 and r.params.ignore_eos
        assert min(r.prompt_token_ids) >= 10 and max(r.prompt_token_ids) < 100


def test_all_at_once():
    assert np.array_equal(arrival_times(5, math.inf), np.zeros(5))
    assert synthetic(4).arrival_times == [0.0] * 4


def test_poisson_mean_gap_is_one_over_rate():
    t = poisson_arrivals(20000, rate=5.0, rng=0)
    gaps = np.diff(t)
    assert t[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_burstiness_sets_cv_not_mean(burstiness):
    gaps = np.diff(arrival_times(20000, rate=10.0, burstiness=burstiness, rng=1))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert set(Fixed(7).sample(10, rng)) == {7}
    u = Uniform(3, 5).sample(1000, rng)
    assert set(u) == {3, 4, 5}
    ln = LogNormal(100, 0.5, lo=10, hi=300).sample(5000, rng)
    assert np.median(ln) == pytest.approx(100, rel=0.05) and ln.min() >= 10 and ln.max() <= 300
    assert set(Choice([2, 9]).sample(100, rng)) == {2, 9}


@pytest.mark.parametrize("make, named", [
    (lambda: arrival_times(3, rate=0), "rate=0"),
    (lambda: arrival_times(3, rate=1, burstiness=-1), "burstiness=-1"),
    (lambda: Uniform(5, 2), "Uniform"),
    (lambda: Fixed(0), "n=0"),
    (lambda: synthetic(2, input_len="long"), "long"),
    (lambda: synthetic(2, vocab_size=10, token_low=10), "token_low=10"),
])
def test_bad_arguments_raise_naming_the_value(make, named):
    with pytest.raises(ValueError, match=named):
        make()


def test_shared_prefix_structure():
    w = shared_prefix(num_groups=3, requests_per_group=4, prefix_len=20, suffix_len=Uniform(1, 5),
                      output_len=8, rate=2.0, seed=5)
    assert len(w) == 12
    prefixes = [tuple(r.prompt_token_ids[:20]) for r in w]
    assert len(set(prefixes)) == 3 and all(prefixes.count(p) == 4 for p in set(prefixes))
    assert all(21 <= n <= 25 for n in w.input_lens)
    assert np.all(np.diff(w.arrival_times) >= 0)
    ordered = shared_prefix(3, 4, 20, shuffle=False, seed=5)
    firsts = [r.prompt_token_ids[0] for r in ordered]
    assert firsts == sorted(firsts, key=firsts.index) and len(set(firsts[:4])) == 1


def test_interference_timing():
    w = interference(num_decoders=6, decoder_prompt_len=8, decoder_output_len=100,
                     long_prompt_len=500, long_arrival_time=0.75, long_output_len=4)
    assert w.arrival_times == [0.0] * 6 + [0.75]
    assert w.input_lens == [8] * 6 + [500] and w.output_lens == [100] * 6 + [4]
    assert interference(seed=0).requests == interference(seed=0).requests
