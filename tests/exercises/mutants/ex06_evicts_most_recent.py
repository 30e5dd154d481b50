"""Takes new blocks from the back of the free queue: evicts the most recently freed first (MRU)."""
from solutions.ex06_prefix_cache import PrefixCachingBlockPool as Pool
from solutions.ex06_prefix_cache import block_hashes  # noqa: F401


class _MRUQueue(dict):
    def popitem(self, last=True):
        key = next(reversed(self))
        return key, self.pop(key)


class PrefixCachingBlockPool(Pool):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free_queue = _MRUQueue(self.free_queue)
