"""config.json for HF transformers describing a ModelConfig's shape (what save_hf_checkpoint and
the GGUF converter write)."""

from __future__ import annotations

from nanoserve.config import ModelConfig


def hf_config_dict(cfg: ModelConfig) -> dict:
    """config.json for HF transformers describing the same shape."""
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    d = {k: getattr(cfg, k) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
        "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id")}
    d.update(architectures=[arch[cfg.architecture]], model_type=cfg.architecture,
             hidden_act="silu", torch_dtype="float32")
    if cfg.architecture == "llama":
        d["attention_bias"] = cfg.attention_bias
    return d
