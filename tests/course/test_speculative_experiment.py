"""course.experiments.speculative on the tiny preset: the verify-cost grid has the shapes asked for
(every decode checked exactly k drafts), the comparison runs the same greedy tokens with and
without ngram and counts what the engine counted, the simple model's arithmetic, and the sampling
check's distributions."""

import numpy as np
import pytest

from nanoserve.course import setup
from nanoserve.course.experiments import speculative as spec


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny", num_kv_blocks=128)


def test_verify_cost_times_steps_of_exactly_those_positions(llm):
    points = spec.verify_cost(llm, (1, 2), (1, 3), context=16, steps=2)
    assert [(p.batch, p.positions) for p in points] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert all(p.step_seconds > 0 and p.floor_seconds > 0 for p in points)
    floors = {(p.batch, p.positions): p.floor_seconds for p in points}
    assert floors[(1, 3)] >= floors[(1, 1)]  # more positions never cost less, modelled
    assert spec.verify_ratio(points, 2, 3) == pytest.approx(points[3].step_seconds / points[2].step_seconds)
    assert len(spec.verify_table(points).rows) == 4


def test_compare_keeps_greedy_tokens_and_the_engines_counts(llm):
    prompts = [[7, 8, 9, 10] * 6, list(range(20, 44))]
    c = spec.compare(llm, prompts, "repeats", 16, spec.ngram(3) | {"prompt_lookup_min": 1})
    on, off = c.on[0], c.off[0]
    assert c.identical and on.token_ids == off.token_ids
    assert off.drafts == off.draft_tokens == off.verify_steps == 0 and on.drafts > 0
    assert 0 <= on.accepted <= on.draft_tokens and 0 < on.verify_steps <= min(on.drafts, on.decode_steps)
    assert on.decode_steps <= off.decode_steps and on.tokens == off.tokens == 32
    assert sum(on.accepted_per_pos) == on.accepted
    assert on.acceptance_length == pytest.approx(1 + on.accepted / on.drafts)
    # a verify step that cost nothing more than a plain one: the model's speedup is the steps saved
    assert c.predicted_speedup(1.0) == pytest.approx(off.decode_steps / on.decode_steps)
    assert c.speedup > 0 and "predicted (model)" in spec.comparison_table([c], {2: 1.0}).rows[0]


def test_expected_length():
    assert spec.expected_length(0.0, 4) == 1.0 and spec.expected_length(1.0, 4) == 5.0
    assert spec.expected_length(0.5, 2) == pytest.approx(1.75)


def test_sampling_check_matches_the_target_and_the_mistake_does_not():
    c = spec.sampling_check([1.0, 0.0, 0.5, -1.0], draft=2, samples=2000)
    assert c.samples == 2000 and c.chi_square < c.critical
    assert c.mistake.sum() == pytest.approx(1.0) and c.mistake[2] > c.target[2]
    wrong = spec.SamplingCheck(c.target, 2, np.round(c.mistake * 2000).astype(np.int64), c.mistake)
    assert wrong.chi_square > wrong.critical  # the test can tell the mistake from the target


def test_the_grid_shares_its_plain_runs_and_the_explorer_shows_every_cell(llm):
    """speculation_grid: a Comparison per (task, batch, k), the plain runs shared by every k of a
    (task, batch); the explorer's view is the grid's numbers, and its controls redraw."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nanoserve.course import widgets
    prompts = {"repeats": [[7, 8, 9, 10] * 6, [3, 4, 5] * 8], "plain": [list(range(20, 44))] * 2}
    grid = spec.speculation_grid(llm, prompts, (1, 3), (1, 2), 12)
    assert sorted(grid) == sorted((t, b, k) for t in prompts for b in (1, 2) for k in (1, 3))
    for (t, b, k), c in grid.items():
        assert c.off is grid[(t, b, 1)].off and c.on[0].batch == b and c.on[0].label == f"k={k}"
        assert c.identical and len(c.on[0].accepted_per_pos) == k
    view = widgets.compute_speculation_view(grid, "repeats", 2, 3)
    assert view["speedup"] == {b: [grid[("repeats", b, k)].speedup for k in (1, 3)] for b in (1, 2)}
    assert view["per_position"] == grid[("repeats", 2, 3)].on[0].per_position()
    with pytest.raises(ValueError, match="batch=5"):
        widgets.compute_speculation_view(grid, "repeats", 5, 3)
    fig, axes = plt.subplots(1, 2)
    widgets.plot_speculation_view(view, "tiny", axes)
    assert "k = 3" in axes[1].get_title()
    plt.close(fig)
    box = widgets.speculation_explorer(grid, "tiny")
    out = box.children[-1]
    before = out.outputs[0]["data"]["image/png"]
    box.children[1].value = 3  # the k slider, from its default of 1
    assert out.outputs[0]["data"]["image/png"] != before
