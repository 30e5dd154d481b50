"""A bounded soak of the serving layer in-process (issue 36): a few hundred requests through the
AsyncEngine over the demo model, each step of a different token count as a server's are, some
closed by their client after the first output, some refused. Afterwards nothing of a request may
be left: no sink, nothing in flight, no request in the engine, scheduler, KV manager or sampler,
no live stream or request object; and the memory malloc hands out must come back to its level
after warm-up. The leak found was oneDNN's primitive caches, one entry per token count, 1024 of
each by default (kernels/cpu_gemm.py caps them): that showed as tens of MB here."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import platform
import sys

import pytest

from nanoserve.config import EngineConfig
from nanoserve.engine import LLMEngine
from nanoserve.outputs import RequestOutput
from nanoserve.sampling_params import SamplingParams
from nanoserve.serve.async_engine import AsyncEngine, RequestStream

WARMUP, REQUESTS = 100, 196  # a warm-up past the capped caches' 64 shapes, then 96 new ones
MAX_GROWTH = 16e6  # bytes of malloc'd memory the soak may add after warm-up (the leak: several times that)


def malloc_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back, over all arenas (mallinfo2)."""
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                   "usmblks", "fsmblks", "uordblks", "fordblks",
                                                   "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def live(*types) -> int:
    gc.collect()
    return sum(type(o) in types for o in gc.get_objects())


async def one(ae: AsyncEngine, i: int) -> str:
    """Request i: a prompt of its own length (a new prefill shape), closed early every 5th,
    refused (a token outside the vocabulary) every 7th."""
    prompt = [1 + (j * 7 + i) % 4000 for j in range(3 + (5 * i) % 397)]  # 397 lengths before one repeats
    if i % 7 == 3:
        prompt[0] = 10**6
    try:
        stream = await ae.generate(prompt, SamplingParams(max_tokens=3, temperature=0.0,
                                                          ignore_eos=True))
    except ValueError:
        return "refused"
    try:
        async for o in stream:
            if i % 5 == 4:
                return "cut"
        return "done"
    finally:
        stream.close()


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallinfo2 is glibc's")
def test_a_soak_leaves_nothing_behind():
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, num_kv_blocks=256,
                          record_trace=False)
    ae = AsyncEngine(lambda: LLMEngine(None, "cpu", "float32", 0, config))
    ae.start()
    try:
        async def run(lo, hi):  # two at a time: the steps mix prefills and decodes
            answers = []
            for i in range(lo, hi, 2):
                answers += await asyncio.wait_for(asyncio.gather(one(ae, i), one(ae, i + 1)), 60)
            return answers

        first = asyncio.run(run(0, WARMUP))
        objects, in_use = live(RequestStream, RequestOutput), malloc_in_use()
        rest = asyncio.run(run(WARMUP, REQUESTS))
        gc.collect()
        grown = malloc_in_use() - in_use
        engine = ae.engine
        assert {"done", "cut", "refused"} <= set(first + rest)
        assert ae._sinks == {} and ae.num_in_flight == 0
        assert engine.requests == {} and not engine.has_unfinished()
        assert engine.kv_manager.req_to_blocks == {} and engine.kv_manager.usage == 0
        assert engine.executor.sampler.request_generators == {}
        assert live(RequestStream, RequestOutput) <= objects
        assert grown < MAX_GROWTH, f"malloc'd memory grew {grown / 1e6:.1f} MB over " \
                                   f"{REQUESTS - WARMUP} requests after warm-up"
    finally:
        ae.stop()
