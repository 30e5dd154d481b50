"""measure/http_compare.py sends prompts no server has seen: a prompt already in the server's
prefix cache would skip its prefill, and an HTTP TTFT would come out below the in-process one
(benchmarks/results/http-2026-11-30T1615.md: 108 ms over HTTP against 229 ms in-process, because
the batch-1 prompts repeated the benchmark's own earlier workload)."""

from types import SimpleNamespace

import pytest

from nanoserve import LLM, EngineConfig
from nanoserve.measure import datasets, http_compare


@pytest.fixture
def sent(monkeypatch):
    """Every request http_compare sends, instead of a server: (the prompts, a fake result)."""
    batches = []

    def fake_load(target, reqs, max_concurrency=None, slo=None):
        batches.append([tuple(r.prompt) for r in reqs])
        m = SimpleNamespace(ttft=SimpleNamespace(median=0.01), itl=SimpleNamespace(median=0.01),
                            output_throughput=100.0, request_throughput=4.0)
        return SimpleNamespace(metrics=lambda: m)
    monkeypatch.setattr(http_compare, "_load", fake_load)
    return batches


def test_every_function_sends_prompts_of_its_own(sent):
    llm = LLM("preset:tiny", device="cpu", config=EngineConfig(num_kv_blocks=256))
    vocab, target = llm.engine.model_config.vocab_size, None
    http_compare.batch1_ttft(llm, target, 3, 32, 2)
    http_compare.throughput_vs_offline(llm, target, 4, 32, 2)
    http_compare.replay_vs_loadgen(llm, target, 3, 32, 2, rate=50.0)
    http_compare.rate_sweep(target, vocab, 4, 32, 2, (0.5, 1.0), min_requests=1)
    # batch1 one request at a time (in turn with in-process ones), throughput, replay, capacity,
    # two rates: the same span of arrivals each, so half the requests at half the capacity
    assert [len(b) for b in sent] == [1, 1, 1, 4, 3, 4, 2, 4]
    flat = [p for batch in sent for p in batch]
    assert len(set(flat)) == len(flat), "a prompt was sent twice"
    # nor any prompt of a caller's own workloads at small seeds (http_peers uses 1-3, lesson 10 0-9)
    theirs = {tuple(r.prompt) for s in range(10) for r in datasets.random_dataset(8, 32, 2, vocab, seed=s)}
    assert not theirs & set(flat)


def test_a_sweep_gives_each_rate_the_same_span_of_arrivals(sent):
    """The fake server completes 4 req/s: 20 requests at 0.25 of that would arrive over 20 s, so
    the sweep sends round(20 * 0.25) = 5 (8 at least by default) over about 5 s, as at capacity."""
    sweep = http_compare.rate_sweep(None, 1000, 20, 8, 2, (0.1, 0.25, 0.5, 1.0))
    assert [len(b) for b in sent] == [20, 8, 8, 10, 20]
    assert [rate for rate, _ in sweep] == [0.4, 1.0, 2.0, 4.0]
