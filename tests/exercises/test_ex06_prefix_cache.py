"""Exercise 6 (prefix caching), checked against nanoserve.engine.kv_cache.KVCacheManager's behaviour."""

import random

import pytest
from exercise_checks import graded
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def ex(load):
    return load("ex06_prefix_cache")


class Oracle:
    """nanoserve's KV manager allocating whole prompts, as the exercise's pool does."""

    def __init__(self, num_blocks, block_size):
        self.kv = KVCacheManager(num_blocks, block_size, enable_caching=True)
        self.reqs = {}

    def allocate(self, rid, tokens):
        req = Request(rid, tokens, SamplingParams(max_tokens=1), 0.0, max_len=10**9)
        blocks, cached = self.kv.get_computed_blocks(req)
        if not self.kv.allocate_slots(req, len(tokens) - cached, blocks):
            return None
        self.reqs[rid] = req
        return cached

    def free(self, rid):
        self.kv.free(self.reqs.pop(rid))

    def shared(self, a, b):
        return sum(x == y for x, y in zip(self.kv.block_ids(a), self.kv.block_ids(b)))


def test_block_hashes_are_chained(ex):
    h = ex.block_hashes([1, 2, 3, 4, 5], 2)
    assert len(h) == 2, f"[1, 2, 3, 4, 5] in blocks of 2 has 2 full blocks, got {len(h)} hashes"
    assert ex.block_hashes([1, 2, 3, 4], 2) == h, "equal prefixes must give equal hashes"
    other = ex.block_hashes([9, 9, 3, 4], 2)
    assert other[1] != h[1], ("block [3, 4] after [9, 9] hashed like block [3, 4] after [1, 2]: a "
                              "block's hash must include its parent's")
    assert ex.block_hashes([1, 2, 3, 5], 2)[0] == h[0], "the first block's hash depends only on it"


@graded(60)
@given(a=st.lists(st.integers(0, 3), max_size=12), b=st.lists(st.integers(0, 3), max_size=12),
       bs=st.integers(1, 4))
def test_equal_hash_means_equal_prefix(ex, a, b, bs):
    ha, hb = ex.block_hashes(a, bs), ex.block_hashes(b, bs)
    assert len(ha) == len(a) // bs, \
        f"{len(a)} tokens in blocks of {bs}: {len(a) // bs} full blocks, got {len(ha)} hashes"
    for i in range(min(len(ha), len(hb))):
        same = a[:(i + 1) * bs] == b[:(i + 1) * bs]
        assert (ha[i] == hb[i]) == same, (f"block {i} of {a} and {b} (block_size {bs}): hashes "
                                          f"{'differ' if same else 'are equal'} though the prefixes "
                                          f"{'are equal' if same else 'differ'}")


def test_second_request_reuses_the_prefix(ex):
    pool = ex.PrefixCachingBlockPool(8, 4)
    a = list(range(1, 11))
    assert pool.allocate("a", a) == 0, "the first request can't hit the cache"
    assert pool.num_free_blocks == 5, f"10 tokens take 3 blocks of 4, {8 - pool.num_free_blocks} in use"
    assert pool.allocate("b", a[:8] + [50, 51]) == 8, "b shares a's first 2 full blocks"
    assert pool.block_table("b")[:2] == pool.block_table("a")[:2], "b's table must start with a's blocks"
    assert pool.num_free_blocks == 4, f"shared blocks count once: expected 4 free, got {pool.num_free_blocks}"
    pool.free("a")
    assert pool.num_free_blocks == 5, "after freeing a, only its third block is free (b holds the others)"
    pool.free("b")
    assert pool.num_free_blocks == 8, "all blocks free after both requests"


def test_leaves_the_last_token_to_compute(ex):
    pool = ex.PrefixCachingBlockPool(8, 4)
    prompt = list(range(1, 9))  # exactly 2 full blocks
    pool.allocate("a", prompt)
    got = pool.allocate("b", prompt)
    assert got == 4, (f"an identical 8-token prompt got {got} cached tokens, expected 4: at least one "
                      f"token must be computed, for its logits")
    assert len(pool.cached_prefix(prompt + [9])) == 2, "9 tokens may reuse both full blocks"


def test_partial_block_is_not_shared(ex):
    pool = ex.PrefixCachingBlockPool(8, 4)
    pool.allocate("a", list(range(1, 11)))  # 2 full blocks + 2 tokens
    got = pool.allocate("b", list(range(1, 16)))
    assert got == 8, f"only full blocks are cached: expected 8 cached tokens, got {got}"


def test_freed_blocks_stay_cached_until_reused(ex):
    pool = ex.PrefixCachingBlockPool(4, 2)
    pool.allocate("a", [1, 2, 3, 4, 5])
    pool.free("a")
    assert pool.num_free_blocks == 4
    assert pool.allocate("b", [1, 2, 3, 4, 6]) == 4, "a freed block keeps its hash until it is evicted"


def test_lru_evicts_least_recently_freed_suffix_first(ex):
    # 6 blocks of 2: a and b take 3 each; free a then b; c needs 2 new blocks -> evicts a's last two
    pool = ex.PrefixCachingBlockPool(6, 2)
    a, b = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]
    pool.allocate("a", a)
    pool.allocate("b", b)
    pool.free("a")
    pool.free("b")
    pool.allocate("c", [20, 21, 22])
    assert len(pool.cached_prefix(b + [0])) == 3, "b was freed last: all its blocks must still be cached"
    hit = len(pool.cached_prefix(a + [0]))
    assert hit == 1, (f"a was freed first, last block first: its two tail blocks are evicted and its "
                      f"first block survives, so 1 block hits; got {hit}")


def test_allocation_fails_without_change(ex):
    pool = ex.PrefixCachingBlockPool(4, 2)
    pool.allocate("a", [1, 2, 3, 4, 5])  # 3 blocks
    assert pool.allocate("b", [9, 9, 9]) is None, "b needs 2 blocks, 1 is free: allocate must return None"
    assert pool.num_free_blocks == 1, "a failed allocation must not take blocks"
    pool.free("a")
    assert pool.allocate("c", [1, 2, 3, 4, 7, 7, 7, 7]) == 4, \
        "a failed allocation must not evict cached blocks"


@graded(60)
@given(seed=st.integers(0, 10**6), num_blocks=st.integers(3, 12), bs=st.integers(1, 4))
def test_random_operations_match_nanoserve(ex, seed, num_blocks, bs):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(5) for _ in range(rng.randint(1, 3 * bs))] for _ in range(3)]
    pool, oracle = ex.PrefixCachingBlockPool(num_blocks, bs), Oracle(num_blocks, bs)
    live, log = [], []
    for step in range(25):
        if live and rng.random() < 0.4:
            rid = live.pop(rng.randrange(len(live)))
            pool.free(rid)
            oracle.free(rid)
            log.append(f"free({rid})")
        else:
            rid = f"r{step}"
            tokens = rng.choice(prefixes) + [rng.randrange(5) for _ in range(rng.randint(0, 2 * bs))]
            tokens = tokens or [0]
            got, want = pool.allocate(rid, tokens), oracle.allocate(rid, tokens)
            log.append(f"allocate({rid}, {tokens})")
            assert got == want, (f"after {'; '.join(log[-4:])} (pool of {num_blocks} blocks of {bs}): "
                                 f"allocate returned {got}, nanoserve's KV manager {want}")
            if want is not None:
                live.append(rid)
        assert pool.num_free_blocks == oracle.kv.num_free_blocks, (
            f"after {'; '.join(log[-4:])}: {pool.num_free_blocks} free blocks, nanoserve has "
            f"{oracle.kv.num_free_blocks}")
        for x in live:
            for y in live:
                shared = sum(p == q for p, q in zip(pool.block_table(x), pool.block_table(y)))
                assert shared == oracle.shared(x, y), (
                    f"after {'; '.join(log[-4:])}: {x} and {y} share {shared} blocks, expected "
                    f"{oracle.shared(x, y)}")
