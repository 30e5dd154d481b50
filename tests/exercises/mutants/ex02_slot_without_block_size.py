"""Adds the offset to the block id instead of to the block's first slot."""
from solutions.ex02_paged_kv import *  # noqa: F401,F403


def slot_mapping(block_table, positions, block_size):
    positions = positions.long()
    return block_table.long()[positions // block_size] + positions % block_size
