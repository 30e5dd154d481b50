"""course.experiments.preemption (lesson 11): at a KV pool too small for the batch the scheduler
preempts, at the default pool it does not, and no request is lost either way (every one finishes
with all its tokens, greedy output identical to the default run's), on the tiny preset."""

import pytest

from nanoserve.course import setup
from nanoserve.course.experiments import preemption


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny")


@pytest.fixture(scope="module")
def study(llm):
    return preemption.preemption_study(llm, num_requests=6, prompt_len=24, max_tokens=24)


def test_the_small_pool_preempts_and_recomputes(study):
    assert study.small.preemptions > 0
    assert study.small.recomputed_tokens > 0
    assert study.small.num_kv_blocks < study.default.num_kv_blocks


def test_the_default_pool_does_not_preempt(study):
    assert study.default.preemptions == 0 and study.default.recomputed_tokens == 0


def test_no_request_is_lost(study):
    for run in (study.small, study.default):
        assert run.finished == run.requests == 6
        assert all(len(t) == 24 for t in run.token_ids)
    assert study.same_output and study.matching == 6
    assert "identical: yes" in study.table().title


def test_a_pool_larger_than_the_engine_is_refused(llm):
    with pytest.raises(ValueError, match="small_blocks=999999"):
        preemption.preemption_study(llm, small_blocks=999999)

