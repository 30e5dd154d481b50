"""The server as an operator runs it: an API key, a bounded queue (503 + Retry-After), and a clean
SIGTERM (in-flight streams end with an error chunk, the process exits, the port is free again)."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from nanoserve.serve.launch import port_is_free
from tests.serve.conftest import scheduler_state, sse_events, start, wait_idle

LONG = {"prompt": "<|endoftext|>KING.\n", "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
        "stream": True}


def test_api_key_guards_v1_and_leaves_health_open():
    srv = start("--api-key", "sesame")
    try:
        url, body = srv.base_url, {"prompt": "hi", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            for method, path, kw in (("POST", "/v1/completions", {"json": body}),
                                     ("GET", "/v1/models", {})):
                r = httpx.request(method, url + path, headers=headers, timeout=30, **kw)
                assert r.status_code == 401, (headers, path, r.text)
                assert r.json()["error"]["code"] == 401 and r.json()["error"]["type"] == "Unauthorized"
        ok = {"Authorization": "Bearer sesame"}
        assert httpx.post(url + "/v1/completions", json=body, headers=ok, timeout=60).status_code == 200
        assert httpx.get(url + "/v1/models", headers=ok, timeout=30).status_code == 200
        assert httpx.get(url + "/health", timeout=30).status_code == 200
    finally:
        srv.stop()


def _read_stream(url: str, out: list, started: threading.Event) -> None:
    with httpx.stream("POST", url + "/v1/completions", json=LONG, timeout=120) as resp:
        out.append(resp.status_code)
        lines = []
        for line in resp.iter_lines():
            lines.append(line)
            if line.startswith("data: {"):
                started.set()
        out.append(sse_events(lines))


def test_backpressure_503_with_retry_after_then_recovery():
    srv = start("--max-num-queued-reqs", "2", "--max-num-seqs", "1")
    try:
        threads, outs, started = [], [[], []], [threading.Event(), threading.Event()]
        for i in range(2):  # two long requests fill the bound (one runs, one waits)
            threads.append(threading.Thread(target=_read_stream, args=(srv.base_url, outs[i], started[i])))
            threads[-1].start()
        deadline = time.monotonic() + 60  # whichever the engine admitted first streams
        while not any(e.is_set() for e in started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(e.is_set() for e in started)
        deadline = time.monotonic() + 30
        while (state := scheduler_state(srv.base_url))[:2] != (1.0, 1.0) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the second one is queued behind the first
        r = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", (state, outs, srv.log())
        assert r.json()["error"]["code"] == 503 and "busy" in r.json()["error"]["message"]
        metrics = httpx.get(srv.base_url + "/metrics", timeout=10).text
        assert 'vllm:admission_rejections_total{model_name="demo-model",reason="max_num_queued_reqs"} 1.0' \
            in metrics
        srv.signal(signal.SIGINT)  # Ctrl-C ends the long streams quickly (and tests SIGINT)
        for t in threads:
            t.join(60)
        assert all(o[0] == 200 for o in outs)
    finally:
        srv.stop()


def test_backpressure_clears_when_requests_finish():
    srv = start("--max-num-queued-reqs", "1")
    try:
        for _ in range(3):  # one at a time is always admitted
            r = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4},
                           timeout=60)
            assert r.status_code == 200
        assert wait_idle(srv.base_url) == (0.0, 0.0, 0.0)
    finally:
        srv.stop()


def test_sigterm_ends_streams_with_an_error_chunk_and_releases_the_port():
    srv = start()
    outs, started, threads = [[], []], [threading.Event(), threading.Event()], []
    try:
        for i in range(2):
            threads.append(threading.Thread(target=_read_stream, args=(srv.base_url, outs[i], started[i])))
            threads[-1].start()
        assert all(e.wait(60) for e in started)
        assert not port_is_free(srv.port)  # the check can fail: the server holds the port
        t = time.monotonic()
        srv.signal(signal.SIGTERM)
        for th in threads:
            th.join(60)
        srv.proc.wait(30)
        assert time.monotonic() - t < 30
    finally:
        srv.stop()
    for status, events in outs:
        assert status == 200 and events[-1] == "[DONE]"
        error = events[-2]["error"]
        assert error["code"] == 503 and "shutting down" in error["message"]
        assert len(events) < 1000  # ended early, not by running to max_tokens
    assert port_is_free(srv.port)
    assert "Traceback" not in srv.log(10**6)
