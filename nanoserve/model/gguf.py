"""GGUF checkpoints (llama.cpp's format, what vLLM also serves): read one, convert it to an HF folder.

A GGUF file holds the architecture as `llama.*` metadata, the tokenizer and chat template as
`tokenizer.*` metadata (model/gguf_tokenizer.py) and the tensors under llama.cpp's names, each
F32/F16/BF16 or quantized in blocks (model/gguf_quants.py). nanoserve loads it by converting it
once into the folder layout everything else reads (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json), which HF transformers loads too, so both run the very same weights.

llama.cpp's converter reorders the rows of the Q and K projections of each head from HF's
rotate-half layout (the two halves of a head) to interleaved pairs (convert_hf_to_gguf.py,
`LlamaModel.permute`); `_unpermute` puts them back, as transformers' GGUF loader does.
The converted folder holds every tensor dequantized. Q8_0 blocks can also be served as they are:
`read_q8_0` hands out their int8 codes and scales for the int8 weight path (LLM(path,
quantization="int8"), model/quantization.py). Deliberately left out: architectures other than
llama, and serving the 4-bit blocks as they are.
"""

from __future__ import annotations

import json
import os
import re

import torch
from safetensors.torch import save_file

from nanoserve.config import ModelConfig
from nanoserve.model.gguf_quants import dequantize, q8_0_codes
from nanoserve.model.gguf_tokenizer import build_tokenizer, tokenizer_config
from nanoserve.model.hf_config import hf_config_dict

_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def open_gguf(path: str):
    import gguf
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist")
    try:
        return gguf.GGUFReader(path)
    except ValueError as e:  # the reader's message for a file that is not GGUF ("bad magic")
        raise ValueError(f"{path!r} is not a GGUF file: {e}") from None


def read_metadata(reader) -> dict:
    """Every metadata key -> its value (strings, numbers, lists), llama.cpp's key names."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def model_config(meta: dict) -> ModelConfig:
    """The llama.* keys as the engine's ModelConfig (the mapping transformers' GGUF loader uses)."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture general.architecture={arch!r} is not supported; "
                         "supported: ['llama']")
    scaling = meta.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"GGUF llama.rope.scaling.type={scaling!r} is not supported; supported: none")
    heads = meta["llama.attention.head_count"]
    hidden = meta["llama.embedding_length"]
    vocab = meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", ())))
    return ModelConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"], num_attention_heads=heads,
        num_key_value_heads=meta.get("llama.attention.head_count_kv", heads),
        head_dim=meta.get("llama.rope.dimension_count", hidden // heads),
        rms_norm_eps=meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=meta.get("llama.rope.freq_base", 10000.0),
        max_position_embeddings=meta.get("llama.context_length", 2048),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"))


def hf_name(gguf_name: str) -> str:
    """llama.cpp's tensor name -> HF's (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`)."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if not m or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no counterpart in a llama model")
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head interleaving of rotary pairs: rows (h, d/2, 2) -> (h, 2, d/2)."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def read_tensors(reader, cfg: ModelConfig, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """HF name -> tensor, dequantized; in `dtype`, or (None) the file's float type, float32 for blocks."""
    out = {}
    for t in reader.tensors:
        name, kind = hf_name(t.name), t.tensor_type.name
        shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists dimensions fastest first
        to = dtype or {"F16": torch.float16, "BF16": torch.bfloat16}.get(kind, torch.float32)
        w = dequantize(t.data, kind, shape, to)
        if ".self_attn.q_proj." in name:
            w = _unpermute(w, cfg.num_attention_heads)
        elif ".self_attn.k_proj." in name:
            w = _unpermute(w, cfg.num_key_value_heads)
        out[name] = w.contiguous()
    return out


def read_q8_0(path: str, cfg: ModelConfig) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF name -> (int8 codes (out, in), fp32 scales (out, in / 32)) of every Q8_0 matrix in the
    file, Q and K rows put back in HF's order (a row's scales move with it)."""
    out = {}
    for t in open_gguf(path).tensors:
        if t.tensor_type.name != "Q8_0" or len(t.shape) != 2:
            continue
        name = hf_name(t.name)
        codes, scales = q8_0_codes(t.data, (int(t.shape[1]), int(t.shape[0])))
        heads = (cfg.num_attention_heads if ".self_attn.q_proj." in name else
                 cfg.num_key_value_heads if ".self_attn.k_proj." in name else None)
        if heads is not None:
            codes, scales = _unpermute(codes, heads), _unpermute(scales, heads)
        out[name] = (codes.contiguous(), scales.contiguous())
    return out


def convert_gguf(path: str, folder: str, dtype: torch.dtype | None = None) -> str:
    """Write `path`'s weights (in `dtype`, see read_tensors), config and tokenizer as an HF folder."""
    reader = open_gguf(path)
    meta = read_metadata(reader)
    cfg = model_config(meta)
    tokenizer = build_tokenizer(meta)  # first: a refused tokenizer stops before the slow part
    tensors = read_tensors(reader, cfg, dtype)
    cfg.tie_word_embeddings = "lm_head.weight" not in tensors
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config = hf_config_dict(cfg)
    config["torch_dtype"] = str(dtype or torch.float32).removeprefix("torch.")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(meta), f, indent=2)
    return folder
