"""The OpenAI API as clients use it: the openai package streams completions and chat completions
from `nanoserve serve`, and greedy text over HTTP is exactly `LLM.generate`'s."""

from __future__ import annotations

import httpx
import openai
import pytest

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.engine.chat_template import load_chat_template
from nanoserve.model import DEMO_MODEL_DIR
from tests.serve.conftest import sse_events

PROMPTS = ["<|endoftext|>ACT I.\n\nSCENE I. A room in the palace.\n\nKING.\n",
           "<|endoftext|>HAMLET.\nTo be, or not to be,",
           "<|endoftext|>"]
MESSAGES = [{"role": "system", "content": "A street."},
            {"role": "user", "name": "Romeo", "content": "What light through yonder window breaks?"}]


@pytest.fixture(scope="module")
def llm():
    return LLM(None, device="cpu", config=EngineConfig(num_kv_blocks=128))


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["demo-model"]
    assert models[0].max_model_len == 1024


def test_the_start_up_log_names_the_model_its_served_name_and_the_url(server):
    assert (f"serving {DEMO_MODEL_DIR} as model 'demo-model' at {server.base_url} "
            f"(OpenAI API at {server.base_url}/v1)") in server.log(tail=20000)


def test_openai_package_streams_a_completion_equal_to_llm_generate(client, llm):
    for prompt in PROMPTS:
        want = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0))[0]
        chunks = list(client.completions.create(model="demo-model", prompt=prompt, max_tokens=24,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == want.text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
            ("length" if want.finish_reason == "length" else "stop")
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)
        assert chunks[-1].usage.prompt_tokens == len(want.prompt_token_ids)
        whole = client.completions.create(model="demo-model", prompt=prompt, max_tokens=24, temperature=0)
        assert whole.choices[0].text == want.text and whole.usage.completion_tokens == len(want.token_ids)


def test_token_id_prompts_equal_llm_generate(server, llm):
    ids = llm.tokenizer.encode(PROMPTS[0])
    want = llm.generate([ids], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    r = httpx.post(server.base_url + "/v1/completions", timeout=60, json={
        "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.text


def test_openai_package_streams_a_chat_completion_through_the_template(client, llm):
    template = load_chat_template(DEMO_MODEL_DIR)
    prompt = template.render(MESSAGES)
    assert prompt == ("<|endoftext|>[A street.]\n\nROMEO.\nWhat light through yonder window breaks?"
                      "\n\nASSISTANT.\n")
    ids = llm.tokenizer.tok.encode(prompt, add_special_tokens=False).ids
    want = llm.generate([ids], SamplingParams(max_tokens=20, temperature=0))[0]
    chunks = list(client.chat.completions.create(model="demo-model", messages=MESSAGES, max_tokens=20,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    whole = client.chat.completions.create(model="demo-model", messages=MESSAGES, max_tokens=20,
                                           temperature=0)
    assert whole.choices[0].message.content == want.text
    assert whole.usage.prompt_tokens == len(ids)


def test_stop_string_cuts_the_text_and_ends_the_request(server, llm):
    full = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]  # three characters from the middle
    cut = full[:full.index(stop)]
    body = {"prompt": PROMPTS[1], "max_tokens": 32, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    r = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60).json()
    assert r["choices"][0]["text"] == cut
    assert (r["choices"][0]["finish_reason"], r["choices"][0]["stop_reason"]) == ("stop", stop)
    assert r["usage"]["completion_tokens"] < 32  # the engine stopped too
    with httpx.stream("POST", server.base_url + "/v1/completions", json=dict(body, stream=True),
                      timeout=60) as resp:
        events = sse_events(resp.iter_lines())
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == cut
    assert events[-2]["choices"][0]["stop_reason"] == stop


def test_seeded_sampling_is_reproducible(server):
    body = {"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0.9, "seed": 1234}
    texts = [httpx.post(server.base_url + "/v1/completions", json=body, timeout=60).json()
             ["choices"][0]["text"] for _ in range(2)]
    assert texts[0] == texts[1]


def test_tokenize_and_detokenize_round_trip(server, llm):
    r = httpx.post(server.base_url + "/tokenize", json={"prompt": PROMPTS[1]}, timeout=30).json()
    assert r["tokens"] == llm.tokenizer.encode(PROMPTS[1]) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 1024
    back = httpx.post(server.base_url + "/detokenize", json={"tokens": r["tokens"]}, timeout=30).json()
    assert back["prompt"] == llm.tokenizer.decode(r["tokens"])
    chat = httpx.post(server.base_url + "/tokenize", json={"messages": MESSAGES}, timeout=30).json()
    assert chat["count"] > r["count"]


def test_health_is_open_and_empty(server):
    r = httpx.get(server.base_url + "/health", timeout=10)
    assert r.status_code == 200 and r.content == b""
