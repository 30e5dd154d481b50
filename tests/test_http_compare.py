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
    http_compare.rate_sweep(target, vocab, 3, 32, 2, (0.5, 1.0))
    # batch1 one request at a time (in turn with in-process ones), throughput, replay, capacity,
    # two rates
    assert [len(b) for b in sent] == [1, 1, 1, 4, 3, 3, 3, 3]
    flat = [p for batch in sent for p in batch]
    assert len(set(flat)) == len(flat), "a prompt was sent twice"
    # nor any prompt of a caller's own workloads at small seeds (http_peers uses 1-3, lesson 10 0-9)
    theirs = {tuple(r.prompt) for s in range(10) for r in datasets.random_dataset(8, 32, 2, vocab, seed=s)}
    assert not theirs & set(flat)
