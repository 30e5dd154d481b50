"""GGUF loading on tiny files this test writes (GGUFWriter): the dequantization against gguf's
reference, the tensors against the safetensors they came from (names, Q/K permutation), the model
against HF transformers on the same weights, the tokenizer against the one it was written from and
against transformers' GGUF conversion, and the refusals."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from gguf_files import CHAT_TEMPLATE, reference_weights, train_tokenizer, write_llama_gguf

from nanoserve import LLM, SamplingParams
from nanoserve.config import EngineConfig
from nanoserve.model import fetch
from nanoserve.model.gguf import convert_gguf, model_config, open_gguf, read_metadata, read_tensors
from nanoserve.model.gguf_quants import dequantize

QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]
PROMPTS = [[5, 17, 42, 99, 3], [300, 2, 7], list(range(40, 61))]
TEXTS = ["Enter the king, and all his train.", "  two  spaces\tand a tab\n\n", "In 1599 the 42nd act",
         "<|im_start|>user\nWhere art thou?<|im_end|>\n", "naïve café — 東京"]


@pytest.fixture(scope="module")
def tiny(hf_models):
    model, folder = hf_models("llama")
    tok = train_tokenizer(model.config.vocab_size)
    return model, folder, tok


@pytest.fixture(scope="module")
def files(tiny, tmp_path_factory):
    """qtype -> a GGUF of the tiny llama with its 2-D weights in that type."""
    model, _, tok = tiny
    d = tmp_path_factory.mktemp("gguf")
    state = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
    return {q: write_llama_gguf(str(d / f"tiny-{q}.gguf"), state, model.config, tok, q) for q in QTYPES}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_dequantize_equals_gguf_reference(qtype):
    q = getattr(GGMLQuantizationType, qtype)
    x = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32) * 3
    data = quants.quantize(x, q)
    ours = dequantize(data, qtype, (6, 96))
    ref = torch.from_numpy(quants.dequantize(data, q).reshape(6, 96))
    assert torch.equal(ours, ref)
    assert (ours - torch.from_numpy(x)).abs().max() < 1.0  # and it is near what was quantized
    assert dequantize(data, qtype, (6, 96), torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("qtype", QTYPES)
def test_tensors_equal_the_safetensors_they_came_from(tiny, files, qtype):
    model, _, _ = tiny
    reader = open_gguf(files[qtype])
    cfg = model_config(read_metadata(reader))
    got = read_tensors(reader, cfg, torch.float32)
    want = reference_weights({k: v for k, v in model.state_dict().items() if "rotary" not in k}, qtype)
    assert sorted(got) == sorted(want)
    for name in want:  # q_proj/k_proj equal only if llama.cpp's permutation is undone
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("qtype", ["F16", "Q4_1"])
def test_llm_on_a_gguf_equals_transformers_on_the_same_weights(tiny, files, qtype):
    model, _, _ = tiny
    ref = reference_weights(model.state_dict(), qtype)
    hf = type(model)(model.config).eval()
    hf.load_state_dict(ref, strict=False)
    llm = LLM(files[qtype], dtype="float32", config=EngineConfig(max_num_seqs=4, num_kv_blocks=64))
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    for p, o in zip(PROMPTS, outs):
        with torch.no_grad():
            g = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, min_new_tokens=12,
                            pad_token_id=0)
        assert o.token_ids == g[0, len(p):].tolist()


def test_tokenizer_equals_the_one_written_and_transformers_conversion(tiny, files, tmp_path):
    from transformers import AutoTokenizer
    _, _, tok = tiny
    folder = convert_gguf(files["Q8_0"], str(tmp_path / "conv"))
    ours = AutoTokenizer.from_pretrained(folder)
    hf_gguf = AutoTokenizer.from_pretrained(os.path.dirname(files["Q8_0"]),
                                            gguf_file=os.path.basename(files["Q8_0"]))
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == hf_gguf(text)["input_ids"], text
        assert ours.decode(ids) == text
        if not any(c.isdigit() for c in text):  # the written one was trained without splitting digits
            assert ids == tok.encode(text).ids, text
    assert ours.tokenize("1599") == ["1", "5", "9", "9"]  # "smollm" splits digits, as llama.cpp does
    cfg = json.load(open(os.path.join(folder, "tokenizer_config.json")))
    assert cfg["chat_template"] == CHAT_TEMPLATE and cfg["eos_token"] == "<|im_end|>"
    msgs = [{"role": "user", "content": "Good morrow"}]
    assert ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        hf_gguf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_a_gguf_converts_once_and_llm_reads_text(files):
    path = files["Q8_0"]
    folder = fetch.gguf_folder(path)
    stamp = os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns
    llm = LLM(path, config=EngineConfig(max_num_seqs=2, num_kv_blocks=16))
    assert fetch.gguf_folder(path) == folder
    assert os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns == stamp  # not converted again
    out = llm.generate("Enter the king", SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert isinstance(out.text, str) and len(out.token_ids) == 4
    assert llm.engine.model_config.eos_token_ids == {2}


def test_unknown_tensor_type_is_refused_by_name(tiny, tmp_path):
    model, _, tok = tiny
    state = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
    state_q4k = dict(state)
    del state_q4k["model.layers.0.mlp.down_proj.weight"]
    rows, cols = model.config.hidden_size, model.config.intermediate_size
    raw = ("blk.0.ffn_down.weight", np.zeros((rows, cols // 256 * 144), np.uint8), GGMLQuantizationType.Q4_K)
    path = write_llama_gguf(str(tmp_path / "q4k.gguf"), state_q4k, model.config, tok, "F16", raw_tensor=raw)
    with pytest.raises(ValueError, match="'Q4_K' is not supported"):
        convert_gguf(path, str(tmp_path / "out"))


@pytest.mark.parametrize("kw, match", [
    (dict(arch="qwen2"), "general.architecture='qwen2'"),
    (dict(tokenizer_model="llama"), "tokenizer.ggml.model='llama'"),
    (dict(pre="chameleon"), "tokenizer.ggml.pre='chameleon'"),
])
def test_unsupported_metadata_is_refused_by_name(tiny, tmp_path, kw, match):
    model, _, tok = tiny
    state = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
    path = write_llama_gguf(str(tmp_path / "x.gguf"), state, model.config, tok, "F16", **kw)
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        convert_gguf(path, str(tmp_path / "out"))


def test_missing_or_foreign_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        LLM(str(tmp_path / "nowhere.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="is not a GGUF file"):
        LLM(str(bad))


@pytest.mark.slow
def test_serve_a_gguf_uses_its_chat_template(files):
    import httpx
    from tokenizers import Tokenizer

    from nanoserve.engine.chat_template import ChatTemplate
    from nanoserve.serve.launch import ServerProcess
    path = files["Q8_0"]
    srv = ServerProcess(path, "--num-kv-blocks", "64", "--uvicorn-log-level", "warning",
                        env={"OMP_NUM_THREADS": "1"}).start()  # our NANOSERVE_CACHE_DIR: one conversion
    try:
        msgs = [{"role": "user", "content": "Good morrow"}]
        r = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60,
                       json={"model": path, "messages": msgs, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
    tok = Tokenizer.from_file(os.path.join(fetch.gguf_folder(path), "tokenizer.json"))
    rendered = ChatTemplate(CHAT_TEMPLATE).render(msgs, True)  # the template the GGUF carries
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(rendered).ids)


def test_q8_0_codes_go_to_the_int8_path_as_they_are(tiny, files):
    """With quantization="int8" a Q8_0 file's linears keep its codes and per-32 scales (never
    widened): dequantized they equal gguf's own dequantization exactly, so greedy output equals
    the dequantized model's."""
    from nanoserve.kernels.quantization import dequantize_weight
    model, _, _ = tiny
    config = EngineConfig(max_num_seqs=4, num_kv_blocks=64)
    quant = LLM(files["Q8_0"], dtype="float32", config=config, quantization="int8")
    want = reference_weights(model.state_dict(), "Q8_0")
    layers = quant.engine.model.layers
    for i, layer in enumerate(layers):
        qkv, gate_up = layer.self_attn.qkv_proj, layer.mlp.gate_up_proj
        assert qkv.qweight.dtype == torch.int8 and "weight" not in qkv._parameters
        assert qkv.weight_scale.shape == (qkv.out_features, qkv.in_features // 32)
        p = f"model.layers.{i}."
        fused = {qkv: ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                 layer.self_attn.o_proj: ["self_attn.o_proj"],
                 gate_up: ["mlp.gate_proj", "mlp.up_proj"], layer.mlp.down_proj: ["mlp.down_proj"]}
        for m, names in fused.items():
            ref = torch.cat([want[p + n + ".weight"] for n in names])
            assert torch.equal(dequantize_weight(m.qweight, m.weight_scale), ref), names
    dense = LLM(files["Q8_0"], dtype="float32", config=config)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    assert [o.token_ids for o in quant.generate(PROMPTS, params)] == \
        [o.token_ids for o in dense.generate(PROMPTS, params)]
