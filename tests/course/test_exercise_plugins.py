"""A learner's exercise pieces in their lessons (course.exercise_plugins): lesson 05's interference
runs scheduled by an ex05 ChunkedScheduler, lesson 06's shared-prefix workload served by an ex06
PrefixCachingBlockPool through the engine's kv_manager_cls; the untouched skeletons fall back to
the engine's pieces with a note. The "student" here is solutions/ (what a finished exercise is)."""

import importlib.util

import pytest

from nanoserve import LLM, EngineConfig
from nanoserve.course import exercise_plugins as plugins
from nanoserve.course.grade import load_piece
from nanoserve.course.scenarios import interference, prefix


@pytest.fixture(scope="module")
def llm():
    return LLM("preset:tiny", device="cpu", dtype="float32", seed=0,
               config=EngineConfig(num_kv_blocks=256, max_num_seqs=16))


def test_untouched_skeletons_fall_back_with_a_note(capsys):
    assert plugins.learner_scheduler() is None
    assert plugins.learner_pool() is None
    out = capsys.readouterr().out
    assert "ChunkedScheduler is not written yet, so the engine's scheduler runs here" in out
    assert "PrefixCachingBlockPool is not written yet, so the engine's prefix cache runs here" in out


def test_a_written_piece_is_used_and_a_broken_one_is_not(monkeypatch, capsys):
    monkeypatch.setattr(plugins, "load_piece", lambda path: load_piece(path, "solutions"))
    assert plugins.learner_scheduler() is load_piece("ex05_chunked_prefill.ChunkedScheduler", "solutions")
    assert issubclass(plugins.learner_pool(), plugins.PoolKVManager)
    assert "Your ChunkedScheduler (exercises/ex05_chunked_prefill.py) runs here" in capsys.readouterr().out
    whole = load_piece("ex04_scheduler.ContinuousScheduler", "solutions")  # doesn't chunk
    monkeypatch.setattr(plugins, "load_piece", lambda path: whole)
    assert plugins.learner_scheduler() is None
    assert "failed a first check (ValueError: a 40-token prompt at budget 16 got chunks []" \
        in capsys.readouterr().out


def test_lesson_05_runs_with_the_learners_chunked_scheduler(llm):
    calls = []

    class Learners(load_piece("ex05_chunked_prefill.ChunkedScheduler", "solutions")):
        def schedule(self, now):
            calls.append(self.config.max_num_batched_tokens)
            return super().schedule(now)

    setup = interference.interference_setup(llm, num_decoders=2, long_prompt_len=64, num_long=2,
                                            min_budget=32)
    mine = interference.interference_grid(llm, setup, [32], progress=False, scheduler=Learners)
    assert set(calls) == {32}, f"the learner's scheduler ran at budgets {set(calls)}: only chunked runs"
    ref = interference.interference_grid(llm, setup, [32], progress=False)
    for a, b in zip(mine, ref):
        assert [o.token_ids for o in a.result.outputs] == [o.token_ids for o in b.result.outputs]
    assert max(r.num_tokens for r in mine[1].result.trace) <= 32
    assert interference.interference_table(mine).rows[1]["run"] == "chunked, 32 tok/step"


def test_lesson_06_serves_its_requests_from_the_learners_pool(llm):
    pool = plugins.pool_kv_manager(load_piece("ex06_prefix_cache.PrefixCachingBlockPool", "solutions"))
    wl, _ = prefix.shared_prefix_workload(llm, num_requests=5, prefix_len=64, suffix_len=8, output_len=8)
    runs = prefix.prefix_cache_compare(llm, wl, progress=False, kv_manager_cls=pool)
    assert list(runs) == ["off", "on", "yours"]
    tokens = {k: [o.token_ids for o in r.outputs] for k, r in runs.items()}
    assert tokens["yours"] == tokens["off"] == tokens["on"], "greedy output must not depend on the cache"
    cached = [o.num_cached_tokens for o in runs["yours"].outputs]
    assert cached[0] == 0 and all(c == 64 for c in cached[1:]), f"cached tokens per request: {cached}"
    rows = prefix.prefix_table(runs).rows
    assert [r["prefix caching"] for r in rows] == ["off", "on", "on, your ex06 pool"]
    assert rows[2]["prefill tokens computed"] < rows[0]["prefill tokens computed"]
    from nanoserve.course.widgets import plot_prefix_compare  # lesson 06's figure, three runs
    fig = plot_prefix_compare(runs)
    ticks = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert ticks == ["caching off", "caching on", "caching yours"]


def test_pool_manager_grows_requests_and_frees_every_block():
    pool_cls = load_piece("ex06_prefix_cache.PrefixCachingBlockPool", "solutions")
    llm = LLM("preset:tiny", device="cpu", dtype="float32", seed=0,
              config=EngineConfig(block_size=4, num_kv_blocks=12, max_num_seqs=3,
                                  enable_chunked_prefill=False),
              kv_manager_cls=plugins.pool_kv_manager(pool_cls))
    prompts = [list(range(10, 19)), list(range(10, 17)) + [5, 6], list(range(30, 41))]
    from nanoserve import SamplingParams
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    ref = LLM("preset:tiny", device="cpu", dtype="float32", seed=0,
              config=EngineConfig(block_size=4, num_kv_blocks=64)).generate(
        prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]  # grown past the prompts, preempted
    kv = llm.engine.kv_manager
    assert kv.num_free_blocks == 12 and not kv.covered and not kv.req_to_blocks


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="ex08 needs triton")
def test_an_unwritten_ex08_says_so_and_no_engine_step_fails(capsys, caplog):
    """Lesson 03's ex08 cell with the skeleton: the learner's rms_norm is tried on its own first, so
    the note says it is not written yet, and no engine step fails with a logged traceback (which
    the lesson would show as an error, with a misleading "changed its greedy tokens ([])")."""
    with caplog.at_level("ERROR", logger="nanoserve"):
        assert plugins.learner_kernels() == []
    assert "not written yet" in capsys.readouterr().out
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
