"""The shipped demo checkpoint (nanoserve/assets/demo-model/) loads with HF and matches its card.

Recomputes the held-out loss on the shipped `heldout.txt` the way scripts/train_demo_model.py
does (non-overlapping windows of eval_seq_len tokens, each predicting its own tokens 1..L-1),
and checks that sampled text is made of real words laid out like a play.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

MODEL_DIR = Path(__file__).resolve().parents[2] / "nanoserve" / "assets" / "demo-model"
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def eval_info() -> dict:
    return json.loads((MODEL_DIR / "eval.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    m = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True)
    return m.eval()


@pytest.fixture(scope="module")
def heldout_text(eval_info) -> str:
    return (MODEL_DIR / eval_info["heldout_file"]).read_text()


def test_files_and_size():
    for name in ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "README.md", "eval.json", "heldout.txt"]:
        assert (MODEL_DIR / name).is_file(), name
    assert (MODEL_DIR / "model.safetensors").stat().st_size <= 16 * 2**20
    assert (MODEL_DIR / "heldout.txt").stat().st_size < 300 * 1024
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA


def test_tokenizer_loads_both_ways(tokenizer, heldout_text):
    raw = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    text = heldout_text[:5000]
    assert tokenizer(text)["input_ids"] == raw.encode(text).ids
    assert tokenizer.bos_token == tokenizer.eos_token == EOT
    assert raw.token_to_id(EOT) == tokenizer.eos_token_id
    assert tokenizer.decode(raw.encode(text).ids) == text  # byte-level BPE round-trips


def test_heldout_loss_matches_card(model, tokenizer, heldout_text, eval_info):
    ids = tokenizer(heldout_text)["input_ids"]
    assert ids[0] == tokenizer.eos_token_id  # each held-out play starts with EOT, as in training
    assert len(ids) == eval_info["heldout_stream_tokens"]
    seq_len = eval_info["eval_seq_len"]
    n_win = len(ids) // seq_len
    windows = torch.tensor(ids[:n_win * seq_len]).view(n_win, seq_len)  # (n_win, seq_len)
    total = 0.0
    with torch.no_grad():
        for x in windows.split(32):
            total += model(input_ids=x, labels=x).loss.item() * x.shape[0] * (seq_len - 1)
    n_pred = n_win * (seq_len - 1)
    loss = total / n_pred
    assert n_pred == eval_info["heldout_tokens"]
    assert loss == pytest.approx(eval_info["heldout_loss"], rel=0.10)
    assert loss < math.log(tokenizer.vocab_size) - 2.0  # far better than uniform guessing
    card = (MODEL_DIR / "README.md").read_text()
    assert f"{eval_info['heldout_loss']:.4f}" in card


def test_sampled_text_is_play_like_english(model, tokenizer, heldout_text):
    vocab = set(re.findall(r"[a-z]+", heldout_text.lower()))
    prompt = EOT + "ACT I.\n\nSCENE I. A room in the palace.\n\n[Enter the KING and QUEEN.]\n\nKING.\n"
    x = tokenizer(prompt, return_tensors="pt").input_ids
    torch.manual_seed(0)
    sampled = model.generate(x, do_sample=True, temperature=0.8, top_k=50, max_new_tokens=100,
                             pad_token_id=tokenizer.eos_token_id)
    greedy = model.generate(x, do_sample=False, max_new_tokens=40, pad_token_id=tokenizer.eos_token_id)
    for out in (sampled, greedy):
        text = tokenizer.decode(out[0, x.shape[1]:], skip_special_tokens=True)
        words = re.findall(r"[a-z]+", text.lower())
        assert len(words) >= 15, text
        known = sum(w in vocab for w in words) / len(words)
        assert known >= 0.7, (known, text)
    text = tokenizer.decode(sampled[0, x.shape[1]:], skip_special_tokens=True)
    assert "\n" in text
    assert {"the", "and", "i", "to", "of", "you", "my", "a"} & set(re.findall(r"[a-z]+", text.lower()))


def load_training_script():
    """scripts/train_demo_model.py as a module: the quality check is defined once, there."""
    import importlib.util
    path = MODEL_DIR.parent.parent.parent / "scripts" / "train_demo_model.py"
    spec = importlib.util.spec_from_file_location("train_demo_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_text_quality_meets_the_targets_and_the_card(model, tokenizer, eval_info):
    """Issue 14's targets on the card's figures (means over three sampling seeds): at least 90%
    real words and 75% real word pairs. Then the shipped model sampled again at the first seed
    reproduces that seed's figures within 3 points: a CPU that rounds differently can change one
    draw and everything after it, so not exactly."""
    train = load_training_script()
    card = eval_info["quality"]
    assert card["real_words"] >= 0.90 and card["real_pairs"] >= 0.75, card
    first = card["per_seed"][0]
    got = train.text_quality(model, tokenizer, eval_info["quality_prompts"],
                             train.load_pairs(MODEL_DIR / "word_pairs.txt.gz"), seed=first["seed"],
                             max_new_tokens=first["max_new_tokens"])
    assert got["words"] >= 1000
    assert abs(got["real_words"] - first["real_words"]) <= 0.03, (got, first)
    assert abs(got["real_pairs"] - first["real_pairs"]) <= 0.03, (got, first)


def test_quality_counts_words_and_pairs_of_the_corpus():
    """The counter itself, on text whose answer is known: a garbled word and a pair never seen."""
    train = load_training_script()
    pairs = train.word_pairs(["To be, or not to be:", "that is the question."])
    assert ("be", "or") in pairs and ("be", "that") not in pairs  # within a text, not across

    class Echo:  # a "model" whose continuation is fixed text, through a real tokenizer's decode
        def __init__(self, text):
            self.ids = torch.tensor([[1] + list(text.encode())])

        def generate(self, x, **kw):
            return torch.cat([x, self.ids[:, 1:]], 1)

    class Bytes:
        eos_token_id = 0

        def __call__(self, text, return_tensors):
            return type("Enc", (), {"input_ids": torch.tensor([[1]])})()

        def decode(self, ids, skip_special_tokens):
            return bytes(ids.tolist()).decode()

    q = train.text_quality(Echo("to be or xyzzy is"), Bytes(), ["p"], pairs)
    assert q["words"] == 5 and q["real_words"] == 0.8  # xyzzy
    assert q["real_pairs"] == 0.5  # to-be and be-or are in the corpus; or-xyzzy and xyzzy-is are not
