"""CUDA-graph capture sizes: every decode batch an engine (and every lesson at its GPU size) runs
pads to a captured graph, so no lesson's sweep steps eagerly. Pure host logic: runs on a CPU."""

import pytest

from nanoserve.config import EngineConfig
from nanoserve.course import setup
from nanoserve.engine.cuda_graphs import capture_sizes, padded_size
from nanoserve.engine.model_runner import ModelRunner

# keys of a lesson's sizes that are a decode batch, or cap one (an engine's max_num_seqs)
BATCH_KEYS = ("batches", "max_num_seqs", "frag_max_num_seqs", "caps", "num_decoders")
# keys that are request counts: the running batch is at most the engine's max_num_seqs
REQUEST_KEYS = ("num_requests", "frag_requests", "sweep_requests", "streams")


def vllm_default(max_size: int) -> list[int]:
    """vLLM's list (VllmConfig._set_cudagraph_sizes): 1, 2, 4, steps of 8 below 256, then 16."""
    return [b for b in [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)] if b <= max_size]


@pytest.mark.parametrize("max_num_seqs", [1, 2, 3, 5, 8, 9, 64, 100, 255, 256, 257, 512, 1000])
def test_default_sizes_are_vllms_list_cut_at_max_num_seqs(max_num_seqs):
    sizes = capture_sizes(max_num_seqs)
    assert sizes == sorted(set(sizes)) and sizes[-1] >= max_num_seqs
    assert sizes[:-1] == vllm_default(sizes[-2]) if len(sizes) > 1 else sizes == [1]
    assert len(sizes) < 2 or sizes[-2] < max_num_seqs  # no size beyond the one that covers it
    if max_num_seqs <= 512:
        assert set(sizes) <= set(vllm_default(512 + 16))


@pytest.mark.parametrize("max_num_seqs", [1, 7, 64, 300])
def test_padding_picks_the_next_captured_size(max_num_seqs):
    sizes = capture_sizes(max_num_seqs)
    for batch in range(1, max_num_seqs + 1):
        b = padded_size(sizes, batch)
        assert b is not None and b >= batch
        assert not [s for s in sizes if batch <= s < b]  # the smallest that fits
    assert padded_size(sizes, sizes[-1] + 1) is None


def test_an_explicit_list_is_kept():
    assert capture_sizes(64, [8, 1, 2, 8]) == [1, 2, 8]
    assert capture_sizes(4, [1, 2, 8, 16]) == [1, 2, 8]  # 16 would never run
    assert capture_sizes(4, [16]) == [16]
    assert padded_size([1, 2, 8], 3) == 8 and padded_size([1, 2, 8], 9) is None  # eager past 8
    assert EngineConfig(cuda_graph_batch_sizes=[4, 1]).cuda_graph_batch_sizes == [4, 1]
    assert EngineConfig().cuda_graph_batch_sizes is None


def lesson_batches(lesson: str) -> list[tuple[str, int, int]]:
    """(key, batch, max_num_seqs of the engine that runs it) for the lesson's GPU sizes."""
    cuda = setup.SIZES[lesson]["cuda"]
    default = EngineConfig().max_num_seqs
    out = []
    for key, value in cuda.items():
        values = value if isinstance(value, (tuple, list)) else [value]
        if key in BATCH_KEYS:
            out += [(key, int(v), int(max(values))) for v in values]
        elif key in REQUEST_KEYS:
            out += [(key, min(int(v), default), default) for v in values]
    return out


@pytest.mark.parametrize("lesson", sorted(setup.SIZES))
def test_every_batch_a_lesson_runs_on_a_gpu_replays_a_graph(lesson):
    for key, batch, max_num_seqs in lesson_batches(lesson):
        config = EngineConfig(max_num_seqs=max_num_seqs)  # what the runner captures for it
        sizes = capture_sizes(config.max_num_seqs, config.cuda_graph_batch_sizes)
        assert padded_size(sizes, batch) is not None, (lesson, key, batch, sizes)


def test_the_lessons_sweeps_are_found():
    # the keys above still name the lessons' sweeps: lesson 03 sweeps decode batches to its largest
    found = {key for lesson in setup.SIZES for key, _, _ in lesson_batches(lesson)}
    assert {"batches", "caps", "num_decoders", "max_num_seqs"} <= found
    batches = setup.SIZES["03"]["cuda"]["batches"]
    assert capture_sizes(max(batches))[-1] >= max(batches) > EngineConfig().max_num_seqs


def test_an_engine_over_a_loaded_runner_gets_its_max_num_seqs(monkeypatch):
    """fresh_engine (every lesson's sweep) builds an engine of a larger max_num_seqs over the runner
    loaded once: the runner hears of it before the first step (and captures the missing sizes)."""
    seen = []
    monkeypatch.setattr(ModelRunner, "compile_or_warm_up_model",
                        lambda self, config: seen.append(config.max_num_seqs))
    llm = setup.load_llm("preset:tiny", device="cpu", num_kv_blocks=64)
    engine = setup.fresh_engine(llm, max_num_seqs=512)
    assert seen[-1] == 512 and engine.config.max_num_seqs == 512
