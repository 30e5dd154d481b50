"""A learner's exercise pieces inside the lessons: ex05's chunked-prefill scheduler drives lesson 05's
interference runs, ex06's prefix-caching block pool serves lesson 06's requests, ex08's Triton
RMSNorm runs a model in lesson 03 (`learner_kernels`).

Each lesson asks for the learner's piece (`learner_scheduler`, `learner_pool`); while the exercise
is not written yet (its skeleton raises NotImplementedError) or fails a first quick probe, the
lesson falls back to the engine's own and prints a note saying so.

The engine plugs a scheduler class in with `scheduler_cls` and a KV cache manager with
`kv_manager_cls`. Exercise 6's pool allocates whole prompts (`allocate(request_id, token_ids)`)
and has no call to grow a request, so `pool_kv_manager` wraps it in the manager's interface:
admission allocates the request's known tokens in the pool, and every further block a request
needs (its decode tokens) is one more pool allocation of a single placeholder token, which
takes a fresh block and hashes nothing. The pool hashes a prompt's full blocks when it is
admitted, before their KV is written, so prompts must run whole (no chunked prefill): computed
in the step that admits them, their blocks hold KV before any later step can hit them.
"""

from __future__ import annotations

import importlib.util
import os

from nanoserve.course.grade import load_piece
from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.sampling_params import SamplingParams

PLACEHOLDER = -1  # the token of a grow-by-one-block allocation: never a real id, never hashed


def learner_piece(path: str, probe, engine_has: str):
    """The class `path` of exercises/ (e.g. "ex05_chunked_prefill.ChunkedScheduler") if `probe(cls)`
    runs, else None; prints which one the lesson uses (`engine_has`: what runs instead)."""
    module, _, name = path.rpartition(".")
    try:
        cls = load_piece(path)
        probe(cls)
    except NotImplementedError:
        print(f"exercises/{module}.py: {name} is not written yet, so {engine_has} runs here. "
              f"Write it (python -m nanoserve grade {module[:4]}) and rerun this cell to see yours.")
        return None
    except Exception as e:  # noqa: BLE001 (any failure of the learner's code means: fall back)
        print(f"exercises/{module}.py: {name} failed a first check ({type(e).__name__}: {e}), so "
              f"{engine_has} runs here; python -m nanoserve grade {module[:4]} says what is wrong.")
        return None
    print(f"Your {name} (exercises/{module}.py) runs here.")
    return cls


def _probe_scheduler(cls) -> None:
    """One step of a 40-token prompt at a 16-token budget, with chunking: the first chunk."""
    from nanoserve.config import EngineConfig
    cfg = EngineConfig(block_size=4, num_kv_blocks=16, max_num_batched_tokens=16, enable_chunked_prefill=True)
    sched = cls(cfg, KVCacheManager(16, 4))
    sched.add_request(Request("probe", list(range(1, 41)), SamplingParams(max_tokens=2), 0.0, max_len=64))
    out = sched.schedule(0.0)
    if [len(s.token_ids) for s in out.seqs] != [16]:
        raise ValueError(f"a 40-token prompt at budget 16 got chunks {[len(s.token_ids) for s in out.seqs]}, "
                         f"expected [16]")


def learner_scheduler():
    """Exercise 5's ChunkedScheduler for lesson 05's chunked runs, or None (the engine's)."""
    return learner_piece("ex05_chunked_prefill.ChunkedScheduler", _probe_scheduler, "the engine's scheduler")


def _probe_pool(cls) -> None:
    """Exercise 6's worked example: 10 tokens, then 8 of them again plus 2 others (block_size 4)."""
    pool = cls(8, 4)
    first = pool.allocate("a", list(range(10)))
    again = pool.allocate("b", list(range(8)) + [50, 51])
    if (first, again, pool.num_free_blocks) != (0, 8, 4):
        raise ValueError(f"the docstring's worked example gave {first}, {again} cached and "
                         f"{pool.num_free_blocks} free blocks, expected 0, 8 and 4")


def learner_pool():
    """Exercise 6's PrefixCachingBlockPool as a KV cache manager class for lesson 06, or None."""
    cls = learner_piece("ex06_prefix_cache.PrefixCachingBlockPool", _probe_pool, "the engine's prefix cache")
    return None if cls is None else pool_kv_manager(cls)


def pool_kv_manager(pool_cls) -> type:
    """A KV cache manager class (the engine's `kv_manager_cls`) over exercise 6's pool class."""
    return type(f"PoolKVManager[{pool_cls.__name__}]", (PoolKVManager,), {"pool_cls": pool_cls})


class PoolKVManager:
    """KVCacheManager's interface over a whole-prompt block pool (see the module docstring)."""

    pool_cls = None  # set by pool_kv_manager

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        if not enable_caching:
            raise ValueError("exercise 6's pool always caches prefixes: run it with "
                             "enable_prefix_caching=True")
        self.num_blocks, self.block_size, self.enable_caching = num_blocks, block_size, True
        self.pool = self.pool_cls(num_blocks, block_size)
        self.req_to_blocks: dict[str, int] = {}  # request -> blocks grown past its admission
        self.covered: dict[str, int] = {}  # request -> tokens its blocks hold room for

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request):
        ids = self.pool.cached_prefix(request.all_token_ids)
        return ids, len(ids) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int, new_computed_blocks=()) -> bool:
        rid = request.request_id
        if rid not in self.covered:  # admission: the tokens known so far, whole
            tokens = request.all_token_ids
            if request.num_computed_tokens + len(new_computed_blocks) * self.block_size + num_new_tokens \
                    < len(tokens):
                raise ValueError("exercise 6's pool admits whole prompts: run it without chunked prefill")
            if self.pool.allocate(rid, tokens) is None:
                return False
            self.covered[rid], self.req_to_blocks[rid] = self.blocks_needed(len(tokens)) * self.block_size, 0
        need = request.num_computed_tokens + num_new_tokens - self.covered[rid]
        grown = []
        while need > 0:  # each further block: one pool allocation of a placeholder token
            key = f"{rid}/{self.req_to_blocks[rid] + len(grown)}"
            if self.pool.allocate(key, [PLACEHOLDER]) is None:
                for k in reversed(grown):
                    self.pool.free(k)
                return False
            grown.append(key)
            need -= self.block_size
        self.req_to_blocks[rid] += len(grown)
        self.covered[rid] += len(grown) * self.block_size
        return True

    def free(self, request: Request) -> None:
        rid = request.request_id
        if rid not in self.covered:
            return
        for k in reversed(range(self.req_to_blocks.pop(rid))):  # the tail first, as the pool frees
            self.pool.free(f"{rid}/{k}")
        self.pool.free(rid)
        del self.covered[rid]

    def block_ids(self, request_id: str) -> list[int]:
        if request_id not in self.covered:
            return []
        grown = [self.pool.block_table(f"{request_id}/{k}")[0] for k in range(self.req_to_blocks[request_id])]
        return list(self.pool.block_table(request_id)) + grown

    def uncache_uncomputed(self, request: Request) -> list[int]:
        """A failed step: the pool has no call to forget a hash, so its blocks stay cached."""
        return self.block_ids(request.request_id)[request.num_computed_tokens // self.block_size:]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free_blocks / self.num_blocks


def learner_kernels(prompt_len: int = 8, max_tokens: int = 4) -> list[str]:
    """Exercise 8's Triton RMSNorm plugged into a small model (preset:tiny, on the GPU if there is
    one, else under the Triton interpreter), its greedy tokens compared with the model's own
    kernels'. -> the kernel names that ran yours ([] with a note: no triton, not written, wrong)."""
    import torch

    from nanoserve import LLM, EngineConfig, SamplingParams
    from nanoserve.kernels import use_kernels
    if importlib.util.find_spec("triton") is None:
        print("ex08 needs triton (pip has it for Linux): the lesson's kernels stay the engine's here.")
        return []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before exercises.ex08_triton imports triton
    try:
        rms_norm = load_piece("ex08_triton.rms_norm")
        rms_norm(torch.ones(1, 32, device=device), torch.ones(32, device=device), 1e-6)  # written?
        llm = LLM("preset:tiny", device=device, dtype="float32", seed=0,
                  config=EngineConfig(enforce_eager=True))  # no CUDA graphs: the swap takes effect
        prompt = [list(range(11, 11 + prompt_len))]
        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        want = llm.generate(prompt, params)[0].token_ids
        use_kernels(llm, rms_norm=rms_norm)
        got = llm.generate(prompt, params)[0].token_ids
    except NotImplementedError:
        print("exercises/ex08_triton.py: rms_norm is not written yet, so the engine's kernels run here.")
        return []
    if got != want:
        print(f"your rms_norm ran the model but changed its greedy tokens ({got} instead of {want}): "
              f"python -m nanoserve grade ex08 says where it differs.")
        return []
    print(f"Your Triton rms_norm ran every RMSNorm of preset:tiny on {device}: the same {len(got)} "
          f"greedy tokens.")
    return ["rms_norm"]
