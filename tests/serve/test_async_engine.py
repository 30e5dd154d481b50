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


def test_a_stuck_engine_thread_is_a_503_with_retry_after_and_leaves_nothing_behind(monkeypatch):
    """A submission the engine thread does not take within ACCEPT_TIMEOUT (a step that will not end,
    as on a machine overloaded many times over) is refused as overload, OpenAI's 503 with a
    Retry-After, not a 500 or a 429 (a client's rate limit); once the thread moves again the refused
    request is aborted and the accepted one finishes."""
    from nanoserve.serve import async_engine
    from nanoserve.serve import protocol as p
    from nanoserve.serve.serving import OpenAIServing

    monkeypatch.setattr(async_engine, "ACCEPT_TIMEOUT", 0.3)
    release, stepping = threading.Event(), threading.Event()

    def make_engine():
        engine = LLMEngine("preset:tiny", "cpu", config=EngineConfig(num_kv_blocks=32))
        step = engine.step

        def stuck_step():
            stepping.set()
            release.wait(30)
            return step()
        engine.step = stuck_step
        return engine

    ae = AsyncEngine(make_engine)
    ae.start()
    serving = OpenAIServing(ae, "tiny", "preset:tiny")
    params = SamplingParams(max_tokens=3, temperature=0.0)
    try:
        async def scenario():
            first = await serving.submit([1, 2, 3], params)  # taken; its first step then hangs
            await asyncio.to_thread(stepping.wait, 30)
            with pytest.raises(p.APIError) as refused:
                await serving.submit([4, 5, 6], params)
            release.set()
            try:
                outs = [o async for o in first]
            finally:
                first.close()
            return refused.value, outs
        err, outs = asyncio.run(asyncio.wait_for(scenario(), 60))
        assert err.status == 503 and err.headers == {"Retry-After": "1"}, (err.status, err.headers)
        assert "retry later" in str(err)
        assert outs[-1].finished and len(outs[-1].token_ids) == 3
        for _ in range(100):  # the refused add, then its abort, reach the engine thread in order
            if not ae.engine.has_unfinished() and ae.num_in_flight == 0:
                break
            release.wait(0.05)
        assert not ae.engine.has_unfinished() and ae.num_in_flight == 0
    finally:
        release.set()
        ae.stop()
