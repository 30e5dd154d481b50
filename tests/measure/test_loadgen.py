"""loadgen, the client that measures any OpenAI-compatible server: its workloads are the
in-process ones, its per-request outputs go through measure/metrics.py unchanged, and its report
has `vllm bench serve`'s layout and JSON keys. Runs against a real `nanoserve serve`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nanoserve.measure import datasets
from nanoserve.measure.bench import make_workload
from nanoserve.measure.loadgen import Target, main, run, run_sync
from nanoserve.measure.metrics import compute_metrics, stratify
from nanoserve.model import DEMO_MODEL_DIR
from nanoserve.serve.launch import ServerProcess

# servers start here under a time limit: the C++ ops are built before
pytestmark = pytest.mark.usefixtures("cpu_ops")

VOCAB = 4096  # the demo model's


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(None, "--num-kv-blocks", "512", "--uvicorn-log-level", "warning",
                        env={"OMP_NUM_THREADS": "1"}).start()
    yield srv
    srv.stop()


def test_random_dataset_is_the_in_process_workload():
    """One seed: the prompts, lengths and arrivals `nanoserve bench` replays in-process."""
    reqs = datasets.random_dataset(12, 40, 9, VOCAB, rate=5.0, burstiness=0.5, seed=7)
    wl = make_workload("synthetic", 12, 40, 9, 5.0, 0.5, 7, VOCAB)
    assert [r.prompt for r in reqs] == [w.prompt_token_ids for w in wl]
    assert [r.arrival_time for r in reqs] == wl.arrival_times
    assert all(r.max_tokens == 9 and r.prompt_len == 40 for r in reqs)
    spread = datasets.random_dataset(200, 100, 10, VOCAB, range_ratio=0.5, seed=1)
    lens = [r.prompt_len for r in spread]
    assert min(lens) >= 50 and max(lens) <= 150 and len(set(lens)) > 20


def test_trace_keeps_its_timestamps_or_follows_the_rate(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"prompt": [11, 12, 13], "output_tokens": 4, "timestamp": 2.0}\n\n'
                    '{"prompt": "To be", "max_tokens": 2, "timestamp": 2.5}\n')
    reqs = datasets.load_trace(str(path))
    assert [r.arrival_time for r in reqs] == [0.0, 0.5] and [r.max_tokens for r in reqs] == [4, 2]
    assert reqs[0].prompt_len == 3
    path.write_text("".join(json.dumps({"prompt": [11] * 3, "output_tokens": 2}) + "\n" for _ in range(50)))
    gaps = np.diff([r.arrival_time for r in datasets.load_trace(str(path), rate=10.0, seed=3)])
    assert abs(gaps.mean() - 0.1) < 0.04
    for bad in ('{"prompt": "", "output_tokens": 2}', '{"prompt": "x"}', "not json"):
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match="trace.jsonl:1"):
            datasets.load_trace(str(path))


def test_vocab_comes_from_the_checkpoint_or_preset():
    assert datasets.resolve_vocab_size(DEMO_MODEL_DIR) == VOCAB
    assert datasets.resolve_vocab_size("preset:llama-120m") == 32000
    assert datasets.resolve_vocab_size(None, 77) == 77
    with pytest.raises(ValueError, match="--tokenizer"):
        datasets.resolve_vocab_size(None)


def test_streamed_outputs_go_through_the_engine_metrics(server):
    reqs = datasets.random_dataset(8, 24, 6, VOCAB, rate=20.0, seed=0)
    result = run_sync(run(Target(server.base_url, "demo-model", ignore_eos=True), reqs,
                          max_concurrency=4, slo="ttft:60000 tpot:60000", progress=False))
    assert all(o.success for o in result.outputs), [o.error for o in result.outputs]
    for o in result.outputs:
        m = o.metrics
        assert o.output_len == 6 and len(m.token_times) == 6  # one chunk per token
        assert m.arrival_time < m.first_token_time <= m.finished_time == m.token_times[-1]
        assert o.prompt_len == 24 and o.finish_reason == "length" and o.text
    sm = compute_metrics(result.outputs, result.duration, "ttft<=60s")
    assert sm.completed == 8 and sm.total_output_tokens == 48 and sm.total_input_tokens == 8 * 24
    assert sm.itl.count == 8 * 5 and sm.queue.count == 0  # a client cannot see queueing
    assert sm.good_requests == 8
    assert stratify(result.outputs, "ttft", by="input", buckets=(1, 16)).strata[-1].num_requests == 8
    j = result.to_json()
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
                "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "median_itl_ms", "p99_e2el_ms", "max_output_tokens_per_s", "max_concurrent_requests"):
        assert key in j, key
    assert j["request_goodput"] == pytest.approx(8 / result.duration)
    assert j["median_ttft_ms"] == pytest.approx(1e3 * sm.ttft.median)
    events = sorted([(o.metrics.arrival_time, 1) for o in result.outputs]
                    + [(o.metrics.finished_time, -1) for o in result.outputs])
    assert max(np.cumsum([e for _, e in events])) <= 4  # --max-concurrency held


def test_cli_prints_vllms_table_and_writes_json(server, tmp_path, capsys):
    rc = main(["--base-url", server.base_url, "--tokenizer", DEMO_MODEL_DIR, "--num-prompts", "6",
               "--random-input-len", "16", "--random-output-len", "4", "--ignore-eos",
               "--request-rate", "50", "--burstiness", "2", "--goodput", "ttft:60000",
               "--endpoint", "/v1/chat/completions", "--probe-request-rate", "20", "--disable-tqdm",
               "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert "============ Serving Benchmark Result ============" in lines
    assert "{:<40} {:<10}".format("Successful requests:", 6) in lines
    assert "{:<40} {:<10.2f}".format("Request rate configured (RPS):", 50) in lines
    assert any(line.startswith("Request goodput (req/s):") for line in lines)
    assert "---------------Time to First Token----------------" in lines and lines[-2] == "=" * 50
    j = json.loads((tmp_path / "r.json").read_text())
    assert j["completed"] == 6 and j["model_id"] == "demo-model" and j["backend"] == "openai-chat"
    assert j["output_lens"] == [4] * 6 and j["probe_completed"] >= 1 and j["burstiness"] == 2


def test_failures_are_recorded_not_raised(server, capsys):
    rc = main(["--base-url", server.base_url, "--model", "no-such-model", "--vocab-size", "4096",
               "--num-prompts", "2", "--random-input-len", "8", "--random-output-len", "2",
               "--disable-tqdm"])
    out = capsys.readouterr().out
    assert rc == 1 and "Failed requests:                         2" in out and "HTTP 404" in out
    dead = run_sync(run(Target("http://127.0.0.1:9", "m", timeout=5.0),
                        datasets.random_dataset(1, 4, 2, VOCAB), progress=False))
    assert not dead.outputs[0].success and dead.outputs[0].error
    assert math.isnan(dead.metrics().ttft.median)
