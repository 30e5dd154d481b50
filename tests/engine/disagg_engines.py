"""Helpers for the disaggregation tests: a prefill and a decode engine in one process (the
connector's real code, real segments) and the /dev/shm check that nothing was left behind."""

from __future__ import annotations

import os

from nanoserve import EngineConfig, LLMEngine, SamplingParams
from nanoserve.engine import kv_transport

GREEDY = dict(temperature=0.0, ignore_eos=True)


def engine(folder: str, role: str | None, num_kv_blocks: int = 96, **kv) -> LLMEngine:
    """An engine of `folder` (fp32, CPU, block_size 16) with a connector of `role` (None: none)."""
    config = EngineConfig(block_size=16, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=64)
    return LLMEngine(folder, "cpu", "float32", 0, config,
                     kv_transfer_config=None if role is None else {"kv_role": role, **kv})


def run(eng: LLMEngine, max_steps: int = 2000) -> tuple[dict, dict]:
    """Step until nothing is left (bounded). -> ({request_id: final output}, {request_id:
    kv_transfer_params of a hand-off})."""
    final, handoffs = {}, {}
    for _ in range(max_steps):
        if not eng.has_unfinished():
            return final, handoffs
        for o in eng.step():
            if o.finished:
                final[o.request_id] = o
                if o.request_id in eng.finished_kv_transfer_params:
                    handoffs[o.request_id] = eng.finished_kv_transfer_params[o.request_id]
    raise AssertionError(f"still unfinished after {max_steps} steps")


def prefill(eng: LLMEngine, prompts: list[list[int]]) -> list[dict]:
    """Each prompt through the prefill engine (max_tokens=1, do_remote_decode). -> hand-offs."""
    ids = [eng.add_request(p, SamplingParams(max_tokens=1, **GREEDY),
                           kv_transfer_params={"do_remote_decode": True}) for p in prompts]
    outs, handoffs = run(eng)
    assert all(outs[i].finish_reason == "length" for i in ids), [outs[i] for i in ids]
    return [handoffs[i] for i in ids]


def decode(eng: LLMEngine, prompts, handoffs, max_tokens: int) -> list:
    """Each prompt with its hand-off through the decode engine. -> final outputs, in order."""
    ids = [eng.add_request(p, SamplingParams(max_tokens=max_tokens, **GREEDY), kv_transfer_params=h)
           for p, h in zip(prompts, handoffs)]
    outs, _ = run(eng)
    return [outs[i] for i in ids]


def segments() -> set[str]:
    """This process's KV segments in /dev/shm (none must be left once a test is done)."""
    mine = f"nskv{os.getpid():x}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)} if os.path.isdir("/dev/shm") \
        else set()


def corrupt(handle: str, at: int = -1) -> None:
    """Flip one byte of a segment's payload (default: its last byte)."""
    shm = kv_transport._open(handle)
    try:
        shm.buf[at] ^= 0xFF
    finally:
        shm.close()
