"""The default KV cache on a CPU leaves room for another engine, and when memory is short the
error says what the process holds and what to pass, never a negative byte count."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from nanoserve import LLM
from nanoserve.config import EngineConfig
from nanoserve.engine import model_runner

GIB = 2**30


def fake_memory(monkeypatch, total, available, held):
    import psutil
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=total, available=available))
    monkeypatch.setattr(psutil, "Process", lambda *a: SimpleNamespace(
        memory_info=lambda: SimpleNamespace(rss=held)))


def test_cpu_budget_is_capped_and_leaves_room_for_the_next_engine(monkeypatch):
    fake_memory(monkeypatch, total=24 * GIB, available=20 * GIB, held=1 * GIB)
    assert model_runner.cpu_kv_cache_budget(0.9) == 4 * GIB  # the fixed cap
    fake_memory(monkeypatch, total=24 * GIB, available=6 * GIB, held=15 * GIB)  # others hold the rest
    assert model_runner.cpu_kv_cache_budget(0.9) == 3 * GIB  # half of what is available


def test_short_memory_is_a_clear_error_without_negative_bytes(monkeypatch):
    fake_memory(monkeypatch, total=24 * GIB, available=2 * GIB, held=22 * GIB)
    with pytest.raises(ValueError) as e:
        LLM("preset:tiny", config=EngineConfig(max_num_seqs=2))
    msg = str(e.value)
    assert "already holds 22.0 GiB" in msg and "num_kv_blocks=N" in msg and "kv_cache_memory=BYTES" in msg
    assert not re.search(r"-\d", msg), msg
