"""Build a model from a name: a local HF checkpoint folder, a hub id, `preset:NAME`, a named real
model (`smollm2-135m`) or a `.gguf` file (both converted once to a folder: model/fetch.py).

HF checkpoints keep q/k/v and gate/up as separate tensors; our model fuses them, so
loading concatenates (and saving splits, so random presets can be handed to HF
transformers or vLLM with identical weights). Sharded checkpoints work: every
*.safetensors file in the folder is read. With `quantization` the decoder layers' linears get
8-bit codes once loaded (model/quantization.py); a GGUF's Q8_0 codes go to the int8 path as they are.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nanoserve.config import ModelConfig
from nanoserve.model import fetch
from nanoserve.model.gguf import read_q8_0
from nanoserve.model.hf_config import hf_config_dict
from nanoserve.model.llama import LlamaForCausalLM
from nanoserve.model.quantization import (
    QuantizationConfig,
    QuantizedLinear,
    check_quantization,
    quantize_after_loading,
)
from nanoserve.presets import preset_config

log = logging.getLogger("nanoserve.model")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEMO_MODEL_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "demo-model")
DEMO_MODEL_NAME = "demo-model"  # what the demo, the server and the lessons call it

# HF name (inside a layer) -> (our name, position in the fused tensor, parts in it)
_FUSED = {"self_attn.q_proj": ("self_attn.qkv_proj", 0, 3), "self_attn.k_proj": ("self_attn.qkv_proj", 1, 3),
          "self_attn.v_proj": ("self_attn.qkv_proj", 2, 3), "mlp.gate_proj": ("mlp.gate_up_proj", 0, 2),
          "mlp.up_proj": ("mlp.gate_up_proj", 1, 2)}
_RENAMED = {"input_layernorm.weight": "input_layernorm",
            "post_attention_layernorm.weight": "post_attention_layernorm",
            "self_attn.q_norm.weight": "self_attn.q_norm", "self_attn.k_norm.weight": "self_attn.k_norm"}


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def resolve_model_path(model: str) -> str:
    """A local folder as is; a named model or .gguf file as its converted folder; otherwise a hub
    id downloaded with huggingface_hub (online only)."""
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise FileNotFoundError(f"model folder {model!r} has no config.json")
        return model
    if fetch.is_fetchable(model):
        return fetch.resolve(model)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not os.path.exists(os.path.dirname(model) or "."):
        try:
            from huggingface_hub import snapshot_download
        except ImportError as e:
            raise FileNotFoundError(f"model {model!r} is not a local folder and huggingface_hub "
                                    "is not installed to download it") from e
        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "tokenizer*"])
    raise FileNotFoundError(f"model {model!r}: no such checkpoint folder (expected config.json + "
                            "*.safetensors), and not a preset ('preset:NAME'), a named model "
                            f"({sorted(fetch.NAMED_MODELS)}), a .gguf file or a hub id ('org/name')")


def _hf_to_ours(name: str):
    """Map an HF tensor name to (our name, fused index, parts) or None to skip."""
    if name == "model.embed_tokens.weight":
        return "embed_tokens.weight", 0, 1
    if name == "model.norm.weight":
        return "norm", 0, 1
    if name == "lm_head.weight":
        return "lm_head", 0, 1
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if not m:
        return None
    i, mod, kind = m.groups()
    if mod in _FUSED:
        ours, idx, parts = _FUSED[mod]
        return f"layers.{i}.{ours}.{kind}", idx, parts
    key = f"{mod}.{kind}"
    return f"layers.{i}.{_RENAMED.get(key, key)}", 0, 1


def load_weights(model: LlamaForCausalLM, folder: str) -> None:
    if model.weights_frozen:
        raise ValueError("load_weights needs the model before process_weights_after_loading: "
                         "its weights are in the kernel backend's layout (frozen) now")
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder!r}")
    params = dict(model.named_parameters())
    pending: dict[str, list] = {}
    loaded = set()
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                target = _hf_to_ours(name)
                if target is None or target[0] not in params:
                    continue  # e.g. lm_head.weight of a tied model, rotary inv_freq buffers
                ours, idx, parts = target
                pending.setdefault(ours, [None] * parts)[idx] = f.get_tensor(name)
    with torch.no_grad():
        for ours, pieces in pending.items():
            if any(p is None for p in pieces):
                raise ValueError(f"checkpoint {folder!r} is missing part of {ours}")
            t = torch.cat(pieces, 0) if len(pieces) > 1 else pieces[0]
            if t.shape != params[ours].shape:
                raise ValueError(f"{ours}: checkpoint shape {tuple(t.shape)} != model "
                                 f"{tuple(params[ours].shape)}")
            params[ours].copy_(t)
            loaded.add(ours)
    missing = set(params) - loaded
    if missing:
        raise ValueError(f"checkpoint {folder!r} lacks weights for {sorted(missing)[:5]}")


def load_quantized_weights(model: LlamaForCausalLM, tensors: dict[str, tuple[torch.Tensor, torch.Tensor]]
                           ) -> None:
    """HF name -> (codes, scales) into the model's quantized linears as they are (fused ones
    concatenated), where every part of a layer has them; load_weights then skips those layers."""
    pending: dict[str, list] = {}
    for name, pair in tensors.items():
        target = _hf_to_ours(name)
        if target is not None and target[0].endswith(".weight"):
            ours, idx, parts = target
            pending.setdefault(ours.removesuffix(".weight"), [None] * parts)[idx] = pair
    modules = dict(model.named_modules())
    for name, pieces in pending.items():
        layer = modules.get(name)
        if not isinstance(layer, QuantizedLinear) or any(p is None for p in pieces) or \
                len({p[1].shape[1] for p in pieces}) > 1:
            continue  # not a quantized linear here, or a part stored otherwise: quantized at load
        layer.quant_method.load_quantized(layer, torch.cat([p[0] for p in pieces]),
                                          torch.cat([p[1] for p in pieces]))


def load_model(model: str | ModelConfig, device="cpu", dtype="float32", seed: int = 0,
               quantization: str | None = None, quantization_group_size: int | None = None,
               quantization_lm_head: bool = False):
    """-> (LlamaForCausalLM in eval mode on device, ModelConfig, checkpoint folder or None).

    model: a checkpoint folder, a hub id, "preset:NAME", or a ModelConfig (random weights of
    that shape, like a preset). quantization: None, "int8" or "fp8" (model/quantization.py), with
    a scale per output channel, or per quantization_group_size input values (a GGUF's Q8_0
    tensors keep their groups of 32); quantization_lm_head: the lm_head gets codes too."""
    torch_dtype = resolve_dtype(dtype)
    method = check_quantization(quantization)
    if quantization_lm_head and method is None:
        raise ValueError("quantization_lm_head=True needs a quantization method (int8 or fp8)")
    quant_config = (None if method is None else
                    QuantizationConfig(method, quantization_group_size, quantization_lm_head))
    start = time.perf_counter()
    if isinstance(model, ModelConfig):
        cfg, folder = model, None
    elif model.startswith("preset:"):
        cfg, folder = preset_config(model.split(":", 1)[1]), None
    else:
        folder = resolve_model_path(model)
        cfg = ModelConfig.from_json(os.path.join(folder, "config.json"))
    with torch.device(device):  # parameters born on the device: an 8B preset built on a CPU takes minutes
        net = LlamaForCausalLM(cfg, device, quant_config)
    if folder is None:
        net.init_random_weights(seed)
    else:
        if method == "int8" and isinstance(model, str) and model.lower().endswith(".gguf"):
            load_quantized_weights(net, read_q8_0(model, cfg))
        load_weights(net, folder)
    quantize_after_loading(net)  # from the weights as loaded, before a cast to a 16-bit dtype
    net = net.to(device=device, dtype=torch_dtype).eval()
    net.cos_sin_cache = net.cos_sin_cache.float()  # rotary tables stay fp32 whatever the dtype
    if folder is not None and folder != model:  # converted or downloaded: say from where, how fast
        log.info("loaded %s from %s in %.1f s", model, folder, time.perf_counter() - start)
    return net, cfg, folder


def save_hf_checkpoint(model: LlamaForCausalLM, folder: str) -> None:
    """Write config.json + model.safetensors in HF layout (fused tensors split back)."""
    os.makedirs(folder, exist_ok=True)
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        if name == "cos_sin_cache":
            continue
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if name == "embed_tokens.weight":
            out["model.embed_tokens.weight"] = t
        elif name == "norm":
            out["model.norm.weight"] = t
        elif name == "lm_head":
            out["lm_head.weight"] = t
        elif m:
            i, rest = m.groups()
            fused = [(hf, idx, parts) for hf, (ours, idx, parts) in _FUSED.items()
                     if rest.startswith(ours + ".")]
            if fused:
                kind = rest.rsplit(".", 1)[1]
                sizes = _fused_sizes(model.cfg, fused[0][2])
                for hf, idx, _ in fused:
                    out[f"model.layers.{i}.{hf}.{kind}"] = t.split(sizes, 0)[idx].contiguous()
            else:
                inv = {v: k for k, v in _RENAMED.items()}
                out[f"model.layers.{i}.{inv.get(rest, rest)}"] = t
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config_dict(model.cfg), f, indent=2)


def _fused_sizes(cfg: ModelConfig, parts: int) -> list[int]:
    if parts == 3:
        kv = cfg.num_key_value_heads * cfg.head_dim
        return [cfg.num_attention_heads * cfg.head_dim, kv, kv]
    return [cfg.intermediate_size, cfg.intermediate_size]
