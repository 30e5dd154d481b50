"""Reads the KV cache once per step, like a weight, instead of once per sequence."""
from solutions.ex01_roofline import *  # noqa: F401,F403
from solutions.ex01_roofline import attention_bytes, attention_flops, linear_bytes, linear_flops


def decode_step_floor(cfg, batch_size, context_len, dtype_bytes, bandwidth, peak_flops):
    q_dim, kv_dim = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    h, inter = cfg.hidden_size, cfg.intermediate_size
    projections = [(h, q_dim + 2 * kv_dim), (q_dim, h), (h, 2 * inter), (inter, h)]
    flops = cfg.num_hidden_layers * (sum(linear_flops(batch_size, i, o) for i, o in projections)
                                     + batch_size * attention_flops(1, context_len, cfg.num_attention_heads,
                                                                    cfg.head_dim))
    nbytes = cfg.num_hidden_layers * (sum(linear_bytes(batch_size, i, o, dtype_bytes) for i, o in projections)
                                      + attention_bytes(1, context_len, cfg.num_attention_heads,
                                                        cfg.num_key_value_heads, cfg.head_dim, dtype_bytes))
    flops += linear_flops(batch_size, h, cfg.vocab_size)
    nbytes += linear_bytes(batch_size, h, cfg.vocab_size, dtype_bytes)
    return max(nbytes / bandwidth, flops / peak_flops)
