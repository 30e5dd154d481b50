"""The paged KV cache: block pool, per-request block tables, prefix-cache hash chain.

Memory is cut into blocks of `block_size` tokens; a request owns a list of block ids (its
block table) and token i of it lives at slot block_table[i // block_size] * block_size +
i % block_size. Blocks are refcounted so requests that share a prompt prefix can share
its blocks (prefix caching, as in vLLM v1):

- a *full* block is named by a chained hash of (parent block's hash, its token ids), so a
  hash identifies the whole prefix up to and including that block. The hash is sha256 over the
  pickled (parent hash, token ids), vLLM v1's default (`hash_block_tokens` with `sha256` in
  vllm/v1/core/kv_cache_utils.py and vllm/utils/hashing.py, vLLM 0.32): a collision would serve
  another prompt's KV without a sign, so Python's 64-bit `hash()` is not enough. A hit also
  compares the block's (parent hash, token ids) with the request's, as nano-vllm compares token
  ids: a collision in the hash -> block map is a miss, never a wrong hit;
- freed blocks keep their hash and go to the tail of an LRU free queue; a later request
  with the same prefix takes them back (refcount 0 -> 1) instead of recomputing;
- a block is only really evicted (hash dropped) when the pool hands it out as new.

The tensors themselves (per layer K and V of shape (num_blocks, block_size,
num_kv_heads, head_dim)) are allocated by `allocate_kv_cache`; the manager only does
bookkeeping, so the simulator reuses it unchanged.

Their dtype is EngineConfig.kv_cache_dtype (`kv_cache_torch_dtype`): "auto" the model's, "fp8"
float8 e4m3, one byte a value, so the same memory holds twice the blocks of bf16 and four times
those of fp32; every size below is in the cache's dtype. The fp8 cache stores K / k_scale and
V / v_scale with one scale per layer for each (vLLM's default), fixed at 1.0 as vLLM does when
the checkpoint has none: e4m3 keeps 3 mantissa bits at any magnitude from 2^-6 to 448, and a
Llama's K and V after RoPE sit well inside that range (benchmarks/kv_cache_dtype.py prints
their largest magnitude), so a scale would only move values that are already representable;
beyond 448 the write saturates instead of overflowing.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from dataclasses import dataclass

import torch

from nanoserve.config import ModelConfig
from nanoserve.engine.request import Request

BlockKey = tuple  # (parent block's hash or None, the block's token ids): what a hash stands for


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set once the block is full and cached
    key: BlockKey | None = None  # (parent hash, token ids) behind block_hash, compared on a hit


# the first block's parent: fixed, so hashes are the same in every process (vLLM derives its
# NONE_HASH from a fixed seed for sha256 unless PYTHONHASHSEED is set)
NONE_HASH = hashlib.sha256(b"nanoserve-none-hash").digest()


def hash_block(parent_hash: bytes | None, token_ids) -> bytes:
    """Chained block hash: equal hashes mean equal *prefixes*, not just equal blocks.
    sha256 of the pickled (parent hash, token ids) as vLLM's `sha256` hashes its block tuple;
    token ids are Python ints (add_request converts them), so the bytes are stable."""
    data = pickle.dumps((parent_hash or NONE_HASH, tuple(token_ids)), pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(data).digest()


def request_block_hashes(request: Request, num_blocks: int, block_size: int) -> list[bytes]:
    """Hashes of the request's first `num_blocks` full blocks (extends request.block_hashes)."""
    hashes, tokens = request.block_hashes, None
    for i in range(len(hashes), num_blocks):
        tokens = tokens or request.all_token_ids
        parent = hashes[i - 1] if i else None
        hashes.append(hash_block(parent, tokens[i * block_size:(i + 1) * block_size]))
    return hashes[:num_blocks]


def block_key(request: Request, i: int, block_size: int) -> BlockKey:
    """(parent hash, token ids) of the request's full block i (its hash must exist already)."""
    return (request.block_hashes[i - 1] if i else None,
            tuple(request.token_slice(i * block_size, block_size)))


class BlockPool:
    """Every block, the LRU queue of free ones, and the hash -> cached block map."""

    def __init__(self, num_blocks: int):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[int, KVCacheBlock] = {}  # block_hash -> block

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        assert n <= len(self.free_queue), "caller must check num_free_blocks"
        out = []
        for _ in range(n):
            _, block = self.free_queue.popitem(last=False)  # least recently freed first
            self.uncache(block)  # lazy eviction of a cached block
            block.ref_cnt = 1
            out.append(block)
        return out

    def uncache(self, block: KVCacheBlock) -> None:
        """Drop a block's hash: no later request can hit it."""
        if block.block_hash is not None and self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = block.key = None

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits (reviving them from the free queue)."""
        for b in blocks:
            if b.ref_cnt == 0:
                del self.free_queue[b.block_id]
            b.ref_cnt += 1

    def free_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 join the queue tail in the given order."""
        for b in blocks:
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_queue[b.block_id] = b

    def lookup(self, block_hash: bytes, key: BlockKey) -> KVCacheBlock | None:
        """The cached block of this hash if it holds this (parent hash, tokens): on a hash
        collision the tokens differ and it is a miss."""
        block = self.cached.get(block_hash)
        return block if block is not None and block.key == key else None

    def cache_block(self, block: KVCacheBlock, block_hash: bytes, key: BlockKey) -> None:
        block.block_hash, block.key = block_hash, key
        self.cached.setdefault(block_hash, block)  # a duplicate keeps the first copy


class KVCacheManager:
    """Allocates blocks to requests; the scheduler's view of KV memory."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}  # each request's blocks, in order
        self.num_cached_blocks: dict[str, int] = {}  # blocks of a request already hashed

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a request about to be admitted: (blocks, tokens covered).

        At least one token is always left to compute: its logits give the next token.
        """
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for i, h in enumerate(request_block_hashes(request, max_blocks, self.block_size)):
            block = self.pool.lookup(h, block_key(request, i, self.block_size))
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] = ()) -> bool:
        """Give `request` room for `num_new_tokens` more tokens; False (and no change) if full."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        need = self.blocks_needed(num_computed + num_new_tokens) - len(blocks) - len(new_computed_blocks)
        revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)  # leave the free queue
        if need + revived > self.pool.num_free_blocks:
            if not blocks:
                del self.req_to_blocks[request.request_id]
            return False
        self.pool.touch(list(new_computed_blocks))
        blocks.extend(new_computed_blocks)
        if need > 0:
            blocks.extend(self.pool.get_new_blocks(need))
        if self.enable_caching:
            self._cache_full_blocks(request, blocks, num_computed + num_new_tokens)
        return True

    def _cache_full_blocks(self, request: Request, blocks, num_tokens_after_step: int) -> None:
        """Hash the blocks this step fills (their tokens are known, their KV is being written)."""
        done = self.num_cached_blocks.get(request.request_id, 0)
        full = min(num_tokens_after_step, request.num_tokens) // self.block_size
        if full <= done:
            return
        hashes = request_block_hashes(request, full, self.block_size)
        for i in range(done, full):
            if blocks[i].block_hash is None:
                self.pool.cache_block(blocks[i], hashes[i], block_key(request, i, self.block_size))
        self.num_cached_blocks[request.request_id] = full

    def uncache_uncomputed(self, request: Request) -> list[int]:
        """A step that did not finish was writing the request's blocks past its computed tokens:
        they leave the prefix cache (hashed again once computed). -> their block ids."""
        first = request.num_computed_tokens // self.block_size
        blocks = self.req_to_blocks.get(request.request_id, [])[first:]
        for b in blocks:
            self.pool.uncache(b)
        if self.num_cached_blocks.get(request.request_id, 0) > first:
            self.num_cached_blocks[request.request_id] = first
        return [b.block_id for b in blocks]

    def uncache_blocks(self, block_ids) -> list[int]:
        """Blocks whose KV never arrived (a failed KV transfer) leave the prefix cache. -> the ids."""
        for i in block_ids:
            self.pool.uncache(self.pool.blocks[i])
        return list(block_ids)

    def free_beyond(self, request: Request, num_tokens: int) -> None:
        """Return the request's blocks past the first blocks_needed(num_tokens): they held only
        rejected drafts (speculative decoding), never hashed, tail first."""
        keep = self.blocks_needed(num_tokens)
        blocks = self.req_to_blocks.get(request.request_id, [])
        if len(blocks) > keep:
            self.pool.free_blocks(list(reversed(blocks[keep:])))
            del blocks[keep:]

    def free(self, request: Request) -> None:
        """Return a request's blocks, tail first, so its prefix outlives its suffix in the LRU."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(list(reversed(blocks)))

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table: its blocks' ids in order (a new list)."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free_blocks / self.num_blocks

    def check_invariants(self) -> None:
        """Refcounts equal owners; the free queue holds exactly the unreferenced blocks."""
        owners = [0] * self.num_blocks
        for blocks in self.req_to_blocks.values():
            for b in blocks:
                owners[b.block_id] += 1
        for b in self.pool.blocks:
            assert b.ref_cnt == owners[b.block_id], \
                f"block {b.block_id}: ref_cnt {b.ref_cnt} != {owners[b.block_id]} owners"
            assert (b.ref_cnt == 0) == (b.block_id in self.pool.free_queue), \
                f"block {b.block_id} free-queue mismatch"
        for h, b in self.pool.cached.items():
            assert b.block_hash == h and b.key is not None, \
                f"cached map entry {h.hex()[:8]} points at block {b.block_id} with another hash"


# EngineConfig.kv_cache_dtype's names (vLLM's) other than "auto", and the torch dtype each stores
KV_CACHE_TORCH_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype | str) -> torch.dtype:
    """The dtype the KV cache is stored in: the model's for "auto", float8_e4m3fn for "fp8"."""
    if kv_cache_dtype == "auto":
        return getattr(torch, model_dtype) if isinstance(model_dtype, str) else model_dtype
    if kv_cache_dtype not in KV_CACHE_TORCH_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is invalid; allowed: 'auto', "
                         + ", ".join(map(repr, KV_CACHE_TORCH_DTYPES)))
    return KV_CACHE_TORCH_DTYPES[kv_cache_dtype]


def _element_size(dtype: torch.dtype | str) -> int:
    """Bytes per element of a torch dtype or its name ('bfloat16')."""
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype name (e.g. 'float32', 'bfloat16', "
                             "'float8_e4m3fn')")
        dtype = getattr(torch, dtype)
    return dtype.itemsize


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype | str) -> int:
    """K and V, all layers: 2 * layers * block_size * kv_heads * head_dim * dtype bytes."""
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim \
        * _element_size(dtype)


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype | str) -> int:
    """K and V of one token across all layers: what a KV transfer moves per prompt token."""
    return kv_bytes_per_block(cfg, 1, dtype)


def num_blocks_in(memory_bytes: float, cfg: ModelConfig, dtype: torch.dtype | str,
                  block_size: int) -> int:
    """How many KV blocks fit in memory_bytes: the one formula that sizes every cache (the
    engine's from its memory budget, the simulator's from a device's memory minus weights)."""
    return max(0, int(memory_bytes // kv_bytes_per_block(cfg, block_size, dtype)))


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype, device):
    """Per layer (k_cache, v_cache), each (num_blocks, block_size, num_kv_heads, head_dim)."""
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device),
             torch.zeros(shape, dtype=dtype, device=device)) for _ in range(cfg.num_hidden_layers)]
