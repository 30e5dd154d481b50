"""nanoserve.course.exercise_figures: the example step's metadata and its picture (not graded)."""

import matplotlib
import pytest

from nanoserve.course.exercise_figures import example_metadata, plot_flattened_batch

matplotlib.use("Agg")


def test_example_metadata_is_a_consistent_step():
    attn = example_metadata([(1, 5), (3, 4), (2, 0)], block_size=4, num_blocks=12)
    assert attn.query_start_loc.tolist() == attn.query_start_loc_cpu == [0, 1, 4, 6]
    assert attn.seq_lens.tolist() == attn.seq_lens_cpu == [6, 7, 2]
    used = [b for row, n in zip(attn.block_tables.tolist(), [6, 7, 2]) for b in row[:-(-n // 4)]]
    assert len(used) == len(set(used)) == 5 and all(0 <= b < 12 for b in used)  # distinct, in range
    with pytest.raises(ValueError, match="q_len >= 1"):
        example_metadata([(0, 3)])
    with pytest.raises(ValueError, match="num_blocks=2"):
        example_metadata([(1, 5), (3, 4)], num_blocks=2)


def test_picture_draws_every_token_three_times():
    """One cell per new token in the q panel, one per context token in the context and cache panels."""
    fig = plot_flattened_batch(example_metadata([(1, 5), (3, 4)], block_size=4), block_size=4, num_blocks=12)
    top, mid, low = fig.axes
    assert len(top.patches) == 4 and len(mid.patches) == 6 + 7
    assert len(low.patches) == 6 + 7 + 12  # plus the 12 blocks' outlines
    assert "query_start_loc = [0, 1, 4]" in top.get_title() and "seq_lens = [6, 7]" in mid.get_title()
    matplotlib.pyplot.close(fig)
