"""AsyncEngine in-process: the engine is built and stepped on its own thread, and a build that
fails reaches the caller. (Two threads that both run torch ops would each get an OpenMP team; on
2 cores that made every step of the server about 10% slower: serve/async_engine.py.)"""

from __future__ import annotations

import asyncio
import threading

import pytest

from nanoserve.config import EngineConfig
from nanoserve.engine import LLMEngine
from nanoserve.sampling_params import SamplingParams
from nanoserve.serve.async_engine import AsyncEngine


def test_engine_is_built_and_stepped_on_the_engine_thread():
    threads = {"build": set(), "step": set()}

    def make_engine():
        threads["build"].add(threading.get_ident())
        engine = LLMEngine("preset:tiny", "cpu", config=EngineConfig(num_kv_blocks=32))
        step = engine.step

        def timed_step():
            threads["step"].add(threading.get_ident())
            return step()
        engine.step = timed_step
        return engine

    ae = AsyncEngine(make_engine)
    ae.start()
    try:
        async def one():
            stream = await ae.generate([1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0))
            try:
                return [o async for o in stream]
            finally:
                stream.close()
        outs = asyncio.run(asyncio.wait_for(one(), 60))
    finally:
        ae.stop()
    assert outs[-1].finished and len(outs[-1].token_ids) == 3
    assert threads["build"] == threads["step"] == {ae._thread.ident}
    assert ae._thread.ident != threading.main_thread().ident


def test_a_failed_build_is_raised_by_start():
    def make_engine():
        raise ValueError("unknown model 'nope'")

    ae = AsyncEngine(make_engine)
    with pytest.raises(ValueError, match="nope"):
        ae.start()
    assert not ae.alive and ae.engine is None
