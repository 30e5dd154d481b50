"""Off by one inside the block."""
from solutions.ex02_paged_kv import *  # noqa: F401,F403


def slot_mapping(block_table, positions, block_size):
    positions = positions.long()
    return block_table.long()[positions // block_size] * block_size + (positions + 1) % block_size
