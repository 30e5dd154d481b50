"""course.trace_view: the step-by-step view lessons 02-04 print, checked against the engine's own
bookkeeping (blocks a request holds, prefix hits, preemptions), on the tiny preset."""

import pytest

from nanoserve.course import setup, trace_view


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny", num_kv_blocks=64, max_num_seqs=8)


def test_blocks_follow_the_tokens_and_go_back_at_the_end(llm):
    t = trace_view.trace_requests(llm, [40, 20], [3, 20], max_num_batched_tokens=32, max_num_seqs=2)
    first = t.steps[0]
    assert first.record.num_prefill_tokens == 32 and first.allocated == 2  # 32 tokens, 16 a block
    assert first.free_before - first.free_after == 2
    assert all(v.record.num_tokens <= v.budget == 32 for v in t.steps)
    assert sum(v.allocated for v in t.steps) == sum(v.freed for v in t.steps)  # all given back
    assert t.steps[-1].free_after == t.num_kv_blocks
    done = [rid for v in t.steps for rid in v.finished]
    assert sorted(done) == ["0", "1"]
    # r1 decodes from position 20 to 39: crossing position 32 takes its third block
    grew = [v for v in t.steps if v.blocks.get("1", (0, 0))[1] - v.blocks.get("1", (0, 0))[0] == 1
            and any(e.request_id == "1" and e.kind == "decode" for e in v.record.entries)]
    assert [e.start for v in grew for e in v.record.entries if e.request_id == "1"] == [32]
    table = t.table()
    # no-break spaces inside an entry: a narrow column wraps between requests only
    assert table.rows[0]["ran (request kind tokens@position)"] == "r0\u00a0prefill\u00a032@0"
    assert "r0 prefills 32 tokens, positions 0-31" in t.describe(0)


def test_prefix_hits_and_preemptions_are_shown(llm):
    prompt = list(range(10, 50))
    t = trace_view.trace_requests(llm, None, 2, prompts=[prompt, prompt + [7, 8]], max_num_seqs=1)
    assert [sum(v.prefix_hits.values()) for v in t.steps].count(32) == 1  # two full blocks reused
    assert "reused 32 prompt tokens" in "\n".join(v.describe() for v in t.steps)
    small = trace_view.trace_requests(llm, [30] * 4, 30, num_kv_blocks=8, max_num_batched_tokens=64)
    preempted = [p for v in small.steps for p in v.record.preempted]
    assert preempted, "8 blocks cannot hold four 60-token requests: the scheduler must preempt"
    assert sorted(r for v in small.steps for r in v.finished) == ["0", "1", "2", "3"]  # none lost
    assert small.table().rows[[bool(v.record.preempted) for v in small.steps].index(True)]["preempted"] != "-"


def test_mismatched_max_tokens_is_refused(llm):
    with pytest.raises(ValueError, match="max_tokens has 1 entries for 2 prompts"):
        trace_view.trace_requests(llm, [8, 8], [4])


def test_a_shared_prefix_arriving_later_starts_past_the_cached_blocks(llm):
    """Lesson 06's trace: the second request arrives at step 2, after the first one's prefill
    cached its four full prefix blocks: its prefill starts at position 64, and only its own
    block comes from the free pool."""
    t = trace_view.trace_requests(llm, [80, 72], 4, shared_prefix=64, arrival_steps=[0, 2])
    hit = next(v for v in t.steps if v.prefix_hits)
    assert hit.record.step == 2 and hit.prefix_hits == {"1": 64}
    first = next(e for e in hit.record.entries if e.request_id == "1")
    assert (first.kind, first.start, first.num_tokens) == ("prefill", 64, 8)
    assert hit.allocated == 1 == hit.free_before - hit.free_after  # 4 blocks shared, 1 new
    assert "num_computed_tokens starts at 64" in hit.describe()
    assert "4 of them shared from the prefix cache" in hit.describe()
    alone = trace_view.trace_requests(llm, [80, 72], 4, shared_prefix=0, arrival_steps=[0, 2])
    assert not any(v.prefix_hits for v in alone.steps)  # random prompts share nothing


def test_a_chunk_shares_the_budget_with_decodes(llm):
    """Lesson 05's trace: three decoders take one token each, the long prompt the rest."""
    t = trace_view.trace_requests(llm, [16, 16, 16, 200], [12, 12, 12, 2], max_num_batched_tokens=64)
    mixed = t.steps[1].record
    assert (mixed.num_decode_tokens, mixed.num_prefill_tokens) == (3, 61)


def test_bad_arrivals_and_prefixes_are_refused(llm):
    with pytest.raises(ValueError, match="arrival_steps"):
        trace_view.trace_requests(llm, [8, 8], 2, arrival_steps=[0])
    with pytest.raises(ValueError, match="shared_prefix=20"):
        trace_view.trace_requests(llm, [8, 30], 2, shared_prefix=20)


def test_drafts_checked_accepted_and_rolled_back_are_shown(llm):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    t = trace_view.trace_requests(llm, None, 24, prompts=[[7, 8, 9, 10] * 6], speculative_config=spec)
    checked = [(i, e) for i, v in enumerate(t.steps) for e in v.record.entries if e.num_draft_tokens]
    assert checked, "a prompt that repeats itself gives prompt lookup something to draft"
    for i, e in checked:
        assert len(t.steps[i].drafts[e.request_id]) == e.num_draft_tokens
        rejected = e.num_draft_tokens - e.num_accepted_tokens
        noun = "draft" if e.num_draft_tokens == 1 else "drafts"  # near max_tokens only one may fit
        assert f"checks {e.num_draft_tokens} {noun} " in t.describe(i)
        assert f"{e.num_accepted_tokens} accepted, {rejected} rolled back" in t.describe(i)
    assert t.rollbacks() == sorted({i for i, e in checked if e.num_accepted_tokens < e.num_draft_tokens})
    assert t.steps[-1].free_after == t.num_kv_blocks  # rejected positions' blocks came back too
