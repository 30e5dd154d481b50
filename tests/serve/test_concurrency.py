"""Many clients at once, some of them leaving: the server stays up, the others get every token,
and a client that leaves frees its request's KV blocks (the abort reaches the engine)."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.serve.conftest import metric, scheduler_state, wait_idle

N_STREAMS, N_CLOSED, MAX_TOKENS = 64, 16, 40
CLOSER_MAX_TOKENS = 1000  # far more than a fast CPU decodes before the server sees the close
PROMPT = "<|endoftext|>KING.\n"


async def _stream(client, base_url: str, i: int, close_after: int | None) -> dict:
    """One streamed completion; closes the connection after `close_after` token chunks."""
    max_tokens = MAX_TOKENS if close_after is None else CLOSER_MAX_TOKENS
    body = {"prompt": PROMPT + f"Speech {i}.", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    got = {"tokens": 0, "done": False, "usage": None}
    async with client.stream("POST", base_url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                got["done"] = True
                break
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                got["tokens"] += 1
            else:
                got["usage"] = chunk["usage"]
            if close_after is not None and got["tokens"] >= close_after:
                break  # leaving the `async with` closes the connection mid-stream
    return got


async def _many(base_url: str) -> list[dict]:
    limits = httpx.Limits(max_connections=N_STREAMS + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        closers = set(range(0, N_STREAMS, N_STREAMS // N_CLOSED))  # every 4th stream leaves
        tasks = [_stream(client, base_url, i, 3 if i in closers else None) for i in range(N_STREAMS)]
        return await asyncio.wait_for(asyncio.gather(*tasks), 300)


def test_64_streams_16_closed_mid_stream(server):
    before = httpx.get(server.base_url + "/metrics", timeout=10).text
    results = asyncio.run(_many(server.base_url))
    closers = set(range(0, N_STREAMS, N_STREAMS // N_CLOSED))
    assert len(closers) == N_CLOSED
    for i, got in enumerate(results):
        if i in closers:
            assert got["tokens"] == 3 and not got["done"]
        else:  # every other stream complete, to the last token, with usage and [DONE]
            assert got["done"] and got["tokens"] == MAX_TOKENS, (i, got)
            assert got["usage"]["completion_tokens"] == MAX_TOKENS
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    assert wait_idle(server.base_url) == (0.0, 0.0, 0.0)  # nothing running or waiting, no block held
    after = httpx.get(server.base_url + "/metrics", timeout=10).text

    def delta(reason):
        return (metric(after, "vllm:request_success_total", finished_reason=reason)
                - metric(before, "vllm:request_success_total", finished_reason=reason))
    assert delta("abort") == N_CLOSED and delta("length") == N_STREAMS - N_CLOSED


def _generated(base_url) -> float:
    return metric(httpx.get(base_url + "/metrics", timeout=10).text, "vllm:generation_tokens_total")


def test_a_client_that_leaves_frees_its_blocks(server):
    """Mid-stream and before the first token of a non-streaming request: both end in the engine
    long before max_tokens (they would run ~1000 steps), and every block comes back."""
    body = {"prompt": PROMPT, "max_tokens": 1000, "temperature": 0, "ignore_eos": True}
    start = _generated(server.base_url)
    with httpx.stream("POST", server.base_url + "/v1/completions", json=dict(body, stream=True),
                      timeout=60) as resp:
        for n, _ in enumerate(resp.iter_lines()):
            if n >= 8:
                running, _, kv = scheduler_state(server.base_url)
                assert running == 1 and kv > 0  # it holds blocks while it runs
                break
    assert wait_idle(server.base_url) == (0.0, 0.0, 0.0)
    assert _generated(server.base_url) - start < 500
    start = _generated(server.base_url)
    try:
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=0.3)  # leaves at once
    except httpx.TimeoutException:
        pass
    assert wait_idle(server.base_url) == (0.0, 0.0, 0.0)
    assert _generated(server.base_url) - start < 900
