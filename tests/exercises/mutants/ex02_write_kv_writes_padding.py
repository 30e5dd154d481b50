"""Writes padding tokens too: slot -1 silently lands in the cache's last slot."""
from solutions.ex02_paged_kv import *  # noqa: F401,F403


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    num_blocks, block_size = k_cache.shape[:2]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slot_mapping.long()] = k.to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slot_mapping.long()] = v.to(v_cache.dtype)
