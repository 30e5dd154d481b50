"""Small GGUF files written with the gguf package's GGUFWriter, as llama.cpp's converter lays them out:
llama.cpp's tensor names, Q and K rows permuted for its rotary layout, the tokenizer as metadata."""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants

from nanoserve.model import DEMO_MODEL_DIR

CHAT_TEMPLATE = ("{% for m in messages %}"
                 "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}


def train_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the demo model's held-out plays, specials first (ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    with open(os.path.join(DEMO_MODEL_DIR, "heldout.txt")) as f:
        text = f.read()[:200_000]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return tok


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    mod, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{_NAMES[mod]}.{kind}"


def permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's reordering of a head's rows: rotate-half (2, d/2) to interleaved pairs (d/2, 2)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def reference_weights(state: dict[str, torch.Tensor], qtype: str) -> dict[str, torch.Tensor]:
    """The weights a `qtype` file holds, dequantized by gguf's own reference code (float32)."""
    out = {}
    for name, t in state.items():
        a = t.float().numpy()
        if a.ndim == 2 and qtype in ("Q8_0", "Q4_0", "Q4_1"):
            q = getattr(GGMLQuantizationType, qtype)
            a = quants.dequantize(quants.quantize(a, q), q).reshape(a.shape)
        elif a.ndim == 2 and qtype in ("F16", "BF16"):
            a = t.to(torch.float16 if qtype == "F16" else torch.bfloat16).float().numpy()
        out[name] = torch.from_numpy(np.ascontiguousarray(a))
    return out


def write_llama_gguf(path: str, state: dict[str, torch.Tensor], cfg, tokenizer, qtype: str = "F32",
                     arch: str = "llama", tokenizer_model: str = "gpt2", pre: str = "smollm",
                     raw_tensor=None) -> str:
    """state: HF names -> tensors (a LlamaForCausalLM's state dict); cfg: its HF config.
    2-D weights are stored as `qtype`, norms as F32. raw_tensor: (name, bytes array, type) added as is."""
    w = GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
                         or getattr(cfg, "rope_theta", 10000.0))  # transformers 5 moved it
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    merges = [" ".join(m) for m in json.loads(tokenizer.to_str())["model"]["merges"]]
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in SPECIALS else 1 for t, _ in vocab])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, t in state.items():
        a = t.float().numpy()
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            a = permute(a, cfg.num_attention_heads)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            a = permute(a, cfg.num_key_value_heads)
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(gguf_name(name), np.ascontiguousarray(a, dtype=np.float32))
        elif qtype == "F16":
            w.add_tensor(gguf_name(name), a.astype(np.float16))
        else:
            q = getattr(GGMLQuantizationType, qtype)
            w.add_tensor(gguf_name(name), quants.quantize(a, q), raw_dtype=q)
    if raw_tensor is not None:
        name, data, kind = raw_tensor
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
