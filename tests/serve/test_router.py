"""A disaggregated deployment as a user starts it: `python -m nanoserve serve --disaggregated` (a
prefill instance, a decode instance and the router, three processes) with the embedded demo
model. Its answers, streamed or not, equal the model's colocated output; faults (a corrupted or
deleted transfer, a stalled decode instance, a killed one) end only that request with OpenAI's
error body or an error chunk, free its blocks on both sides, never hang the router, and leave no
segment in /dev/shm. Every wait is bounded; every process is stopped in a finally."""

from __future__ import annotations

import itertools
import os
import signal
import time

import httpx
import psutil
import pytest

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.engine import kv_transport
from nanoserve.serve.launch import ServerProcess
from tests.engine.disagg_engines import corrupt
from tests.serve.conftest import SERVER_ENV, scheduler_state, sse_events, wait_idle

MAX_TOKENS = 12
DECODE_TIMEOUT = 5


@pytest.fixture(scope="module")
def deployment():
    srv = ServerProcess(None, "--disaggregated", "--num-kv-blocks", "256", "--uvicorn-log-level",
                        "warning", "--decode-timeout", str(DECODE_TIMEOUT), env=SERVER_ENV)
    try:
        srv.start()
        children = psutil.Process(srv.proc.pid).children()
        role = {("kv_producer" in " ".join(c.cmdline())): c for c in children}
        prefill, decode = role[True], role[False]
        yield srv, _url(prefill), _url(decode), decode, prefill
    finally:
        srv.stop()
    assert srv.proc.returncode is not None
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"nskv{prefill.pid:x}_")]
    assert not left, f"segments left behind: {left}"


def _url(proc: psutil.Process) -> str:
    args = proc.cmdline()
    return f"http://127.0.0.1:{args[args.index('--port') + 1]}"


@pytest.fixture(scope="module")
def llm():
    return LLM(None, "cpu", "float32", config=EngineConfig(num_kv_blocks=256))


def completion(url: str, prompt, stream: bool = False, **kw):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": stream, **kw}
    if not stream:
        return httpx.post(url + "/v1/completions", json=body, timeout=60)
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.iter_lines())


def test_answers_equal_colocated_serving(deployment, llm):
    url = deployment[0].base_url
    ids = [[(7 * i + 3 * n) % 4000 + 10 for i in range(n)] for n in (15, 16, 17, 32)]
    for prompt in ["<|endoftext|>KING.\n", *ids]:
        want = llm.generate([llm.engine.encode(prompt)], SamplingParams(max_tokens=MAX_TOKENS,
                                                                       temperature=0, ignore_eos=True))[0]
        r = completion(url, prompt)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == want.text and body["kv_transfer_params"] is None
        assert body["usage"] == {"prompt_tokens": len(want.prompt_token_ids),
                                 "completion_tokens": MAX_TOKENS,
                                 "total_tokens": len(want.prompt_token_ids) + MAX_TOKENS}
        events = completion(url, prompt, stream=True, stream_options={"include_usage": True})
        chunks = [e for e in events[:-1] if e["choices"]]
        assert events[-1] == "[DONE]" and len(chunks) == MAX_TOKENS  # one chunk per token
        assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
        assert len({c["id"] for c in events[:-1]}) == 1, "chunks of one stream carry one id"
        assert events[-2]["usage"]["completion_tokens"] == MAX_TOKENS


def test_chat_and_one_token_requests(deployment, llm):
    srv, prefill_url = deployment[:2]
    messages = [{"role": "user", "content": "Who art thou?"}]
    ids = httpx.post(prefill_url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    want = llm.generate([ids], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))[0]
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    r = httpx.post(srv.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.json()["choices"][0]["message"]["content"] == want.text
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as resp:
        events = sse_events(resp.iter_lines())
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert sum("role" in e["choices"][0]["delta"] for e in events[:-1]) == 1
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == want.text
    one = completion(srv.base_url, "<|endoftext|>KING.\n", max_tokens=1)
    assert one.json()["usage"]["completion_tokens"] == 1
    assert completion(srv.base_url, "<|endoftext|>KING.\n", stream=True, max_tokens=1)[-1] == "[DONE]"


def test_bad_requests_are_the_instances_answers(deployment):
    url = deployment[0].base_url
    for body, param in (({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
                        ({"prompt": [11] * 1100}, "prompt"), ({"max_tokens": 3}, "prompt")):
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(url + path, content=b"{nope", timeout=30)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text


def _hand_off(prefill_url: str, prompt: str) -> dict:
    r = httpx.post(prefill_url + "/v1/completions", json={
        "prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True,
        "kv_transfer_params": {"do_remote_decode": True}}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["kv_transfer_params"]


def test_a_corrupted_or_deleted_transfer_fails_that_request(deployment):
    _, prefill_url, decode_url = deployment[:3]
    body = {"prompt": "<|endoftext|>KING.\n", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    handoff = _hand_off(prefill_url, body["prompt"])
    corrupt(handoff["kv_handle"])
    r = httpx.post(decode_url + "/v1/completions", json={**body, "kv_transfer_params": handoff}, timeout=60)
    assert r.status_code == 500 and "corrupted" in r.json()["error"]["message"], r.text
    handoff = _hand_off(prefill_url, body["prompt"])
    corrupt(handoff["kv_handle"])
    with httpx.stream("POST", decode_url + "/v1/completions", timeout=60,
                      json={**body, "stream": True, "kv_transfer_params": handoff}) as resp:
        events = sse_events(resp.iter_lines())
    assert "corrupted" in events[-2]["error"]["message"] and events[-1] == "[DONE]"
    handoff = _hand_off(prefill_url, body["prompt"])
    assert kv_transport.unlink(handoff["kv_handle"])
    r = httpx.post(decode_url + "/v1/completions", json={**body, "kv_transfer_params": handoff}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text
    assert "not found" in r.json()["error"]["message"]
    for url in (prefill_url, decode_url):
        assert wait_idle(url) == (0.0, 0.0, 0.0)
    assert not kv_transport.exists(handoff["kv_handle"])


def test_a_stalled_decode_instance_times_out(deployment):
    srv, prefill_url, decode_url, decode, _ = deployment
    decode.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        events = completion(srv.base_url, "<|endoftext|>KING.\n", stream=True, max_tokens=40)
        took = time.monotonic() - t0
    finally:
        decode.send_signal(signal.SIGCONT)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 504, events[-3:]
    assert len(events) == 3 and DECODE_TIMEOUT <= took < DECODE_TIMEOUT + 30  # first token, error
    assert wait_idle(decode_url, 30) == (0.0, 0.0, 0.0)  # it aborted the request the router left
    assert wait_idle(prefill_url) == (0.0, 0.0, 0.0)
    assert completion(srv.base_url, "<|endoftext|>KING.\n").status_code == 200


def test_a_killed_decode_instance_fails_its_requests_and_nothing_hangs(deployment):
    srv, prefill_url, _, decode, prefill = deployment
    body = {"prompt": "<|endoftext|>KING.\n", "max_tokens": 1000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", srv.base_url + "/v1/completions", json=body, timeout=60) as resp:
        lines = resp.iter_lines()
        got = list(itertools.islice((x for x in lines if x.startswith("data: {")), 5))
        decode.kill()
        t0 = time.monotonic()
        events = sse_events(lines)
    assert len(got) == 5 and time.monotonic() - t0 < 30
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 502, events[-3:]
    r = completion(srv.base_url, "<|endoftext|>KING.\n")
    assert r.status_code == 502 and "decode instance" in r.json()["error"]["message"]
    assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 503
    assert scheduler_state(prefill_url) == (0.0, 0.0, 0.0)  # its blocks were freed at the hand-off
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"nskv{prefill.pid:x}_")]
    assert not left, f"the router left hand-offs behind: {left}"
