"""The real server, as a user starts it: `python -m nanoserve serve` in a subprocess on a free
loopback port (nanoserve.serve.launch.ServerProcess), with the embedded demo model (text in and
out, a tokenizer, 4M parameters: quick on 2 cores). Every fixture stops its server; every loop in
these tests is bounded in count and time."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from nanoserve.serve.launch import ServerProcess

# one OpenMP thread: CI runs two test workers on two cores
SERVER_ENV = {"OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
SMALL = ("--num-kv-blocks", "512", "--uvicorn-log-level", "warning")


@pytest.fixture(autouse=True, scope="session")
def _cpu_ops_before_servers(cpu_ops):
    """Every test here starts servers under a start-up time limit: build the C++ ops first."""


def start(*args: str) -> ServerProcess:
    return ServerProcess(None, *SMALL, *args, env=SERVER_ENV).start()


@pytest.fixture(scope="module")
def server():
    srv = start()
    yield srv
    srv.stop()


def sse_events(lines) -> list:
    """The JSON objects of an SSE stream, then the string "[DONE]" if it came."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metric(text: str, name: str, **labels) -> float:
    """One sample of a Prometheus text page (labels must match those given)."""
    for line in text.splitlines():
        m = re.match(r"^([\w:]+)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(m.group(3))
    raise KeyError(f"{name} {labels} not in /metrics")


def scheduler_state(base_url: str) -> tuple[float, float, float]:
    """(running, waiting, KV usage) from /metrics."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return (metric(text, "vllm:num_requests_running"), metric(text, "vllm:num_requests_waiting"),
            metric(text, "vllm:kv_cache_usage_perc"))


def wait_idle(base_url: str, timeout: float = 15.0) -> tuple[float, float, float]:
    """Poll /metrics until nothing runs or waits (at most `timeout` s); -> the last state."""
    import time
    deadline = time.monotonic() + timeout
    state = scheduler_state(base_url)
    while state[:2] != (0.0, 0.0) and time.monotonic() < deadline:
        time.sleep(0.05)
        state = scheduler_state(base_url)
    return state
