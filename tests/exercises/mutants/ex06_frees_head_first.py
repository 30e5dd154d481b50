"""Frees a request's blocks first block first: its prefix is evicted before its suffix."""
from solutions.ex06_prefix_cache import PrefixCachingBlockPool as Pool
from solutions.ex06_prefix_cache import block_hashes  # noqa: F401


class PrefixCachingBlockPool(Pool):
    def free(self, request_id):
        for b in self.tables.pop(request_id):  # should be reversed(...)
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_queue[b] = None
