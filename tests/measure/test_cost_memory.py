"""measure.cost: the prefix-cache discount at a hit rate and the KV memory-time a run holds."""

import pytest

from nanoserve.engine.trace import StepRecord, TraceEntry
from nanoserve.measure.cost import PROVIDER_PRICES, ProviderPrice, kv_memory_time


def test_input_price_at_a_hit_rate():
    p = ProviderPrice(3.00, 15.00, "test", "2025-01", cached_input_per_1m=0.30)
    assert p.input_at_hit_rate(0) == 3.00 and p.input_at_hit_rate(1) == 0.30
    assert p.input_at_hit_rate(0.5) == pytest.approx(1.65)
    assert ProviderPrice(1.0, 2.0, "test", "2025-01").input_at_hit_rate(0.9) == 1.0  # no discount
    with pytest.raises(ValueError, match="hit_rate=1.5"):
        p.input_at_hit_rate(1.5)
    assert all(pp.cached_input_per_1m < pp.input_per_1m for pp in PROVIDER_PRICES.values())


def test_kv_memory_time_counts_each_requests_context_for_each_step():
    def step(start, end, *entries):
        return StepRecord(0, start, end, 0, 0, 1, 0, 0.0, [], list(entries))
    trace = [step(0.0, 0.5, TraceEntry("a", "prefill", 10, 0, True)),  # 10 tokens held 0.5 s
             step(0.5, 0.6, TraceEntry("a", "decode", 1, 10, True),  # 11 tokens, 0.1 s
                  TraceEntry("b", "decode", 1, 99, True))]  # 100 tokens, 0.1 s
    pre, dec = kv_memory_time(trace, kv_bytes_per_token=2.0)
    assert pre == pytest.approx(10 * 2 * 0.5)
    assert dec == pytest.approx((11 + 100) * 2 * 0.1)
