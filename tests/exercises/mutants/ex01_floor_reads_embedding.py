"""The old answer: every parameter read once per step, the input embedding included (a step gathers
one row of it per token), plus each sequence's KV cache."""
from solutions.ex01_roofline import *  # noqa: F401,F403
from solutions.ex01_roofline import kv_bytes_per_token


def decode_step_floor(cfg, batch_size, context_len, dtype_bytes, bandwidth, peak_flops):
    params = cfg.num_params()
    kv = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype_bytes)
    nbytes = params * dtype_bytes + batch_size * context_len * kv
    return max(nbytes / bandwidth, 2 * params * batch_size / peak_flops)
