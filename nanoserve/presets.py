"""Preset model shapes (ModelConfigs of real models), for `LLM("preset:NAME")` and the simulator.

Timing depends on shapes, not weight values, so these let the course measure a real
model's step times without downloading it (the model layer gives a preset random weights) and
let the simulator cost it without importing the model layer. Shapes are copied from each model's public
config.json; `tiny` is ours, small enough for tests.
"""

from nanoserve.config import ModelConfig

PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
    "llama-120m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                       max_position_embeddings=4096),
    "qwen2.5-0.5b": dict(architecture="qwen2", vocab_size=151936, hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                         max_position_embeddings=32768, tie_word_embeddings=True,
                         attention_bias=True),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         rope_theta=500000.0, max_position_embeddings=131072,
                         tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
    "llama-3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       rope_theta=500000.0, max_position_embeddings=8192),
}


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {sorted(PRESETS)}")
    return ModelConfig(**PRESETS[name])
