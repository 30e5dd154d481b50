"""Exercise 6: prefix caching. Chained block hashes, the longest cached prefix, LRU eviction.

Many requests start with the same tokens (a system prompt, a few-shot preamble, the earlier
turns of a chat). Their K/V for that prefix is the same, so a request can reuse blocks another
request computed, if it can find them. vLLM does it like this:

- A *full* block is named by a hash of (its parent block's hash, its token ids): the hash of
  block i identifies all tokens 0 .. (i+1)*block_size - 1, not just the block's own tokens.
  A partial last block has no hash (its contents will still change).
- A cached block is shared: it has a reference count (requests using it). When a request
  ends, its blocks' counts drop; a block at 0 is *free* but keeps its hash and contents, so a
  later request with the same prefix can still find it and take it back.
- Free blocks wait in an LRU queue. New blocks are taken from the front (least recently
  freed first); only then is a cached block really evicted (its hash forgotten). A request
  frees its blocks last block first, so its prefix (the most shareable part) is evicted last.

Write `block_hashes` and `PrefixCachingBlockPool`: a pool of blocks that gives each new request
blocks for its whole prompt, reusing the longest cached prefix, and frees them as above. The
grader checks what it does (cached tokens, free blocks, which blocks are shared) on random
workloads against these rules; the block ids you choose may differ. Write it yourself: a module
that imports the engine's KV cache (its block pool, manager or block hash) scores 0.

Worked example, block_size 4, 8 blocks: allocate("a", 10 tokens) -> 0 cached, 3 blocks
(2 full, hashed); allocate("b", same first 8 tokens + 2 others) -> 8 cached: b's block table
is a's first 2 blocks (refcount 2 each) + 1 new one; 4 blocks in use, 4 free. free("a") frees
only a's third block (still cached); free("b") frees the rest, b's last block first.
"""

from __future__ import annotations

from collections import OrderedDict  # noqa: F401 (you will want it)


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of token_ids: one per full block, none for a partial one.

    hashes[i] = hash((hashes[i-1] or None for i=0, tuple(token_ids of block i))). Two sequences
    get equal hashes[i] exactly when their first (i+1)*block_size tokens are equal.
    Example: block_hashes([1, 2, 3, 4, 5], 2) has 2 entries; block [3, 4] after [1, 2] and
    block [3, 4] after [9, 9] hash differently.
    """
    raise NotImplementedError("ex06: write block_hashes")


class PrefixCachingBlockPool:
    """num_blocks KV blocks of block_size tokens, shared between requests by prefix.

    Blocks are numbered 0 .. num_blocks-1. A block is in use (refcount > 0) or free; a free
    block may still be cached (findable by hash) until it is handed out again.
    """

    def __init__(self, num_blocks: int, block_size: int):
        """All blocks start free, uncached, in the LRU queue in order 0 .. num_blocks-1."""
        raise NotImplementedError("ex06: write PrefixCachingBlockPool.__init__")

    @property
    def num_free_blocks(self) -> int:
        """Blocks with refcount 0 (cached or not): what allocations can still use."""
        raise NotImplementedError("ex06: write PrefixCachingBlockPool.num_free_blocks")

    def cached_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest cached prefix of token_ids, in order (no state change).

        Only full blocks count, and at least one token must be left to compute (its logits
        give the request's next token): at most (len(token_ids) - 1) // block_size blocks.
        Stop at the first block whose hash is not cached.
        Example (block_size 4): a cached 8-token prompt asked for again gives 1 block, not 2.
        """
        raise NotImplementedError("ex06: write PrefixCachingBlockPool.cached_prefix")

    def allocate(self, request_id: str, token_ids: list[int]) -> int | None:
        """Give a new request blocks for all of token_ids, reusing its cached prefix.

        Returns the number of tokens served from the cache (a multiple of block_size), or None,
        changing nothing, if there are not enough free blocks. Steps:
        1. hits = cached_prefix(token_ids); the request needs blocks_needed(len) - len(hits)
           new blocks, and hits with refcount 0 also leave the free queue: fail if new + those
           exceed num_free_blocks.
        2. Take a reference on each hit (a free one leaves the queue).
        3. Take the new blocks from the front of the LRU queue, refcount 1; a new block that
           was cached is evicted: its hash leaves the map (if the map points to that block).
        4. Register the hash of each full block of the request that has none yet, unless the
           hash is already cached (then the first copy stays the one found).
        The block table is hits + new blocks, in token order.
        """
        raise NotImplementedError("ex06: write PrefixCachingBlockPool.allocate")

    def free(self, request_id: str) -> None:
        """Drop the request's reference on each of its blocks, last block first; blocks that
        reach refcount 0 join the back of the LRU queue in that order (still cached)."""
        raise NotImplementedError("ex06: write PrefixCachingBlockPool.free")

    def block_table(self, request_id: str) -> list[int]:
        """The request's block ids in token order."""
        raise NotImplementedError("ex06: write PrefixCachingBlockPool.block_table")
