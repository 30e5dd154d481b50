"""course.experiments.host_time (lesson 11): a decode step split into host phases and the
forward, on the tiny preset; the timers leave the engine as they found it."""

import pytest

from nanoserve.course import setup
from nanoserve.course.experiments import host_time


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny")


def test_host_split_phases_add_up_to_the_step(llm):
    runner = setup.engine_of(llm).executor
    forward = runner.forward
    s = host_time.host_split(llm, batch=4, context=16, steps=3)
    assert set(s.phases_ms) == set(host_time.PHASES)
    assert sum(s.phases_ms.values()) == pytest.approx(s.step_ms)
    assert s.phases_ms["forward"] > 0 and s.phases_ms["input preparation"] > 0
    assert 0 < s.host_share < 1 and not s.graphs  # a CPU has no CUDA graphs
    # the profiler found the forward's ops (a separate run: noise may put them above the forward)
    assert 0 < s.forward_ops_ms < 3 * s.phases_ms["forward"]
    assert s.forward_python_ms == pytest.approx(s.phases_ms["forward"] - s.forward_ops_ms)
    assert not setup.engine_of(llm).has_unfinished()
    assert "prepare" not in vars(runner) and runner.forward is forward  # the timers and ranges are gone
    assert "compute_logits" not in vars(runner.model)


def test_eager_on_off_on_a_cpu_runs_the_fused_layers_then_every_kernel_alone():
    default_1, default_16, eager_1, eager_16 = host_time.eager_on_off("preset:tiny", [1, 16], 16,
                                                                      steps=2, device="cpu")
    assert default_1.fused and not default_1.eager  # the layers in one call at batch 1
    assert not default_16.fused  # more rows than the fused layers take: op by op
    assert eager_1.eager and eager_16.eager and not (eager_1.fused or eager_16.fused)
    assert all(s.forward_python_ms is not None and not s.graphs for s in (default_1, eager_1))


class ReplayingGraphs:
    """Stands in for CudaGraphRunner on a CPU: 'replays' decode-only steps by running the model."""

    def __init__(self, runner):
        self.runner = runner

    def ensure(self, max_num_seqs):  # nothing to capture
        pass

    def can_run(self, seqs):
        return all(s.is_decode for s in seqs)

    def run(self, input_ids, positions, attn):
        return self.runner.model(input_ids, positions, self.runner.kv_caches, attn)


def test_host_split_counts_graph_replays_as_the_forward(llm):
    runner = setup.engine_of(llm).executor
    runner.graphs = ReplayingGraphs(runner)
    try:
        s = host_time.host_split(llm, batch=2, context=16, steps=3)
    finally:
        runner.graphs = None
    assert s.graphs and s.phases_ms["forward"] > 0
    assert sum(s.phases_ms.values()) == pytest.approx(s.step_ms)
    assert s.forward_ops_ms is None  # a replayed graph has no Python between its ops


def test_lesson_11_runs_only_batches_the_default_graphs_capture():
    """On CUDA every decode batch lesson 11 times replays a captured graph (none runs eagerly by
    accident and passes for 'graphs on')."""
    from nanoserve.config import EngineConfig
    from nanoserve.engine.cuda_graphs import capture_sizes
    config = EngineConfig()
    captured = max(capture_sizes(config.max_num_seqs, config.cuda_graph_batch_sizes))
    for quick in (True, False):
        s = setup.sizes("11", quick, "cuda")
        assert max(*s["batches"], *s["graph_batches"]) <= captured
