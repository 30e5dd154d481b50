"""Bad input over HTTP: each case gets its status and OpenAI's error body naming the field, never a
500, while a good stream running at the same time is unaffected (same text as when run alone)."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.serve.conftest import sse_events

GOOD = {"prompt": "<|endoftext|>KING.\n", "max_tokens": 48, "temperature": 0, "ignore_eos": True}

# (name, method, path, JSON body or raw bytes, status, param)
CASES = [
    ("malformed JSON", "POST", "/v1/completions", b'{"prompt": "hi", ', 400, None),
    ("missing prompt", "POST", "/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("prompt of the wrong type", "POST", "/v1/completions", {"prompt": {"a": 1}}, 400, "prompt"),
    ("max_tokens a string", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400,
     "max_tokens"),
    ("max_tokens 0", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400,
     "max_tokens"),
    ("temperature < 0", "POST", "/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400,
     "temperature"),
    ("temperature NaN", "POST", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', 400,
     "temperature"),
    ("top_p 0", "POST", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("top_p above 1", "POST", "/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("top_k below -1", "POST", "/v1/completions", {"prompt": "hi", "top_k": -3}, 400, "top_k"),
    ("n > 1", "POST", "/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("unknown model", "POST", "/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
    ("empty prompt", "POST", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("empty token list", "POST", "/v1/completions", {"prompt": []}, 400, "prompt"),
    ("prompt past max_model_len", "POST", "/v1/completions", {"prompt": [11] * 1100}, 400, "prompt"),
    ("token id outside the vocabulary", "POST", "/v1/completions", {"prompt": [1, 2, 4096]}, 400,
     "prompt"),
    ("negative token id", "POST", "/v1/completions", {"prompt": [1, -2]}, 400, "prompt"),
    ("stop of the wrong type", "POST", "/v1/completions", {"prompt": "hi", "stop": 5}, 400, "stop"),
    ("stop_token_ids not ids", "POST", "/v1/completions", {"prompt": "hi", "stop_token_ids": ["x"]},
     400, "stop_token_ids"),
    ("seed a float", "POST", "/v1/completions", {"prompt": "hi", "seed": 1.5}, 400, "seed"),
    ("stream_options without stream", "POST", "/v1/completions",
     {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("two prompts", "POST", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("no body", "POST", "/v1/completions", None, 400, "prompt"),
    ("a body that is not an object", "POST", "/v1/completions", [1, 2], 400, "prompt"),
    ("max_tokens past max_model_len", "POST", "/v1/completions", {"prompt": [11] * 24, "max_tokens": 1001},
     400, "max_tokens"),
    ("a prompt that fills max_model_len", "POST", "/v1/completions", {"prompt": [11] * 1024}, 400,
     "prompt"),
    ("chat without a body", "POST", "/v1/chat/completions", None, 400, "messages"),
    ("chat's max_completion_tokens past max_model_len", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5000}, 400,
     "max_completion_tokens"),
    ("chat without messages", "POST", "/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("chat with an unknown role", "POST", "/v1/chat/completions",
     {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ("chat with an image part", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages"),
    ("detokenize outside the vocabulary", "POST", "/detokenize", {"tokens": [99999]}, 400, "tokens"),
    ("unknown endpoint", "POST", "/v1/embeddings", {"input": "hi"}, 404, None),
    ("wrong method", "GET", "/v1/completions", None, 405, None),
]
# messages in vLLM's own words, which do not name the field (`param` does)
VLLM_WORDED = {"prompt past max_model_len", "a prompt that fills max_model_len",
               "stream_options without stream"}


def _call(base_url: str, method: str, path: str, body) -> httpx.Response:
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
        else ({"json": body} if body is not None else {})
    return httpx.request(method, base_url + path, timeout=60, **kw)


def _good_stream(base_url: str, out: dict) -> None:
    with httpx.stream("POST", base_url + "/v1/completions", json=dict(GOOD, stream=True),
                      timeout=120) as resp:
        out["status"] = resp.status_code
        out["events"] = sse_events(resp.iter_lines())


def test_bad_inputs_get_openai_errors_naming_the_field_and_spare_a_running_stream(server):
    assert len(CASES) >= 15
    alone = httpx.post(server.base_url + "/v1/completions", json=GOOD, timeout=120).json()
    good: dict = {}
    runner = threading.Thread(target=_good_stream, args=(server.base_url, good))
    runner.start()
    failures = []
    for name, method, path, body, status, param in CASES:
        r = _call(server.base_url, method, path, body)
        err = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") \
            else None
        if r.status_code != status or not err or err.get("param") != param or err.get("code") != status \
                or not err.get("message") or not err.get("type") or param is not None and (
                    param not in err["message"] and name not in VLLM_WORDED):  # it names the field
            failures.append((name, r.status_code, r.text[:300]))
    runner.join(120)
    assert not failures, "\n".join(map(str, failures))
    assert good["status"] == 200 and good["events"][-1] == "[DONE]"
    text = "".join(e["choices"][0]["text"] for e in good["events"][:-1])
    assert text == alone["choices"][0]["text"]  # greedy: the same tokens as when it ran alone
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200


def test_max_tokens_past_the_context_gets_vllms_400(server):
    """vLLM refuses what does not fit (it never cuts max_tokens short), in these words."""
    ok = httpx.post(server.base_url + "/v1/completions", timeout=60,
                    json={"prompt": [11] * 24, "max_tokens": 1000, "temperature": 0, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1000  # 24 + 1000 fit
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": [11] * 24, "max_tokens": 5000},
                   timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "'max_tokens' or 'max_completion_tokens' is too large: 5000. This model's maximum context "
        "length is 1024 tokens and your request has 24 input tokens (5000 > 1024 - 24).")


def test_a_post_without_a_body_names_the_missing_field(server):
    r = httpx.post(server.base_url + "/v1/completions", timeout=30)
    assert r.status_code == 400 and "`prompt`" in r.json()["error"]["message"]
    assert not r.json()["error"]["message"].startswith(":")


@pytest.mark.parametrize("body, field", [({"prompt": "hi", "temperature": -1}, "temperature"),
                                          ({"prompt": [5000]}, "prompt")])
def test_a_refused_stream_gets_a_json_error_not_an_event_stream(server, body, field):
    r = httpx.post(server.base_url + "/v1/completions", json=dict(body, stream=True), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == field
