"""A wrapper around the engine's KVCacheManager and hash_block: the answer key, nothing written."""
from nanoserve import SamplingParams
from nanoserve.engine import KVCacheManager
from nanoserve.engine.kv_cache import hash_block
from nanoserve.engine.request import Request


def block_hashes(token_ids, block_size):
    hashes, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        hashes.append(parent)
    return hashes


class PrefixCachingBlockPool:
    def __init__(self, num_blocks, block_size):
        self.kv = KVCacheManager(num_blocks, block_size, enable_caching=True)
        self.reqs, self.block_size = {}, block_size

    @property
    def num_free_blocks(self):
        return self.kv.num_free_blocks

    def cached_prefix(self, token_ids):
        req = Request("?", list(token_ids), SamplingParams(max_tokens=1), 0.0, max_len=len(token_ids) + 1)
        blocks, _ = self.kv.get_computed_blocks(req)
        return [b.block_id for b in blocks]

    def allocate(self, request_id, token_ids):
        req = Request(request_id, list(token_ids), SamplingParams(max_tokens=1), 0.0,
                      max_len=len(token_ids) + 1)
        blocks, num_cached = self.kv.get_computed_blocks(req)
        if not self.kv.allocate_slots(req, len(token_ids) - num_cached, blocks):
            return None
        self.reqs[request_id] = req
        return num_cached

    def free(self, request_id):
        self.kv.free(self.reqs.pop(request_id))

    def block_table(self, request_id):
        return self.kv.block_ids(request_id)
