"""course.experiments.host_time (lesson 11): a decode step split into host phases and the
forward, on the tiny preset; the timers leave the engine as they found it."""

import pytest

from nanoserve.course import setup
from nanoserve.course.experiments import host_time


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny")


def test_host_split_phases_add_up_to_the_step(llm):
    s = host_time.host_split(llm, batch=4, context=16, steps=3)
    assert set(s.phases_ms) == set(host_time.PHASES)
    assert sum(s.phases_ms.values()) == pytest.approx(s.step_ms)
    assert s.phases_ms["forward"] > 0 and s.phases_ms["input preparation"] > 0
    assert 0 < s.host_share < 1 and not s.graphs  # a CPU has no CUDA graphs
    assert not setup.engine_of(llm).has_unfinished()
    assert "prepare" not in vars(setup.engine_of(llm).executor)  # the timers are gone


def test_graphs_on_off_refuses_a_cpu():
    with pytest.raises(ValueError, match="CUDA only"):
        host_time.graphs_on_off("preset:tiny", [1], 16, device="cpu")
