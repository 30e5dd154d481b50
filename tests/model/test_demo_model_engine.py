"""The embedded demo model in nanoserve: identical logits to HF transformers, text out of LLM()."""

import torch
import transformers

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.model import DEMO_MODEL_DIR
from tests.model.test_model import engine_logits


def test_demo_model_logits_equal_hf():
    llm = LLM(config=EngineConfig(block_size=16, num_kv_blocks=64))  # no model: the demo model
    assert llm.engine.model_config.hidden_size == 256 and llm.tokenizer is not None
    hf = transformers.AutoModelForCausalLM.from_pretrained(DEMO_MODEL_DIR, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    text = "<|endoftext|>HAMLET:\nTo be, or not to be, that is the question:\n"
    ids = tok(text)["input_ids"]
    assert ids == llm.tokenizer.encode(text), "nanoserve and transformers tokenize differently"
    ours = engine_logits(llm.engine, ids, prefill_len=len(ids) - 8)  # prefill, then 8 decode steps
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"max relative logit error {rel:.2e}"


def test_default_llm_writes_text():
    llm = LLM(config=EngineConfig(num_kv_blocks=64))
    out = llm.generate(["<|endoftext|>ROMEO:\n"], SamplingParams(max_tokens=40, temperature=0))[0]
    assert out.text and out.text == llm.tokenizer.decode(out.token_ids)
    words = [w for w in out.text.split() if w.isalpha()]
    assert len(words) >= 5, f"expected words, got {out.text!r}"
