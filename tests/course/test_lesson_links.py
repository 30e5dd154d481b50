"""Every lesson from 02 on opens the engine: at least one relative link into nanoserve/ that
resolves to a file, and a prediction the learner writes down (a `my_prediction = ...` cell)
before the measurement that answers it; lessons 02-06 and 12 also trace one step (course.trace_view)."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LESSONS = ("02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13")
TRACED = ("02", "03", "04", "05", "06", "12")
LINK = re.compile(r"\]\((\.\./nanoserve/[^)#\s]+)(?:#[^)]*)?\)")


def lesson(number: str):
    path, = NOTEBOOKS.glob(f"{number}_*.ipynb")
    return path, nbformat.read(path, as_version=4)


@pytest.mark.parametrize("number", LESSONS)
def test_links_into_the_engine_resolve(number):
    path, nb = lesson(number)
    links = [m for c in nb.cells if c.cell_type == "markdown" for m in LINK.findall(c.source)]
    assert links, f"{path.name}: no relative link into nanoserve/ ([file.py](../nanoserve/...))"
    for link in links:
        assert (path.parent / link).resolve().is_file(), f"{path.name}: {link} is no file"


@pytest.mark.parametrize("number", LESSONS)
def test_opens_with_a_question_and_asks_for_a_prediction_first(number):
    path, nb = lesson(number)
    assert "**The question:**" in nb.cells[0].source, f"{path.name}: open with the question it answers"
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    asks = [i for i, s in enumerate(code) if re.search(r"^my_\w*prediction\w* = ", s, re.M)]
    assert asks, f"{path.name}: no `my_prediction = ...` cell"
    answered = [i for i, s in enumerate(code) if "predict.compare(" in s]
    assert answered and min(answered) > min(asks), (
        f"{path.name}: the prediction comes before the measurement that answers it (predict.compare)")


@pytest.mark.parametrize("number", TRACED)
def test_traces_one_step(number):
    path, nb = lesson(number)
    assert any("trace_view.trace_requests(" in c.source for c in nb.cells if c.cell_type == "code"), (
        f"{path.name}: no step-trace cell (course.trace_view.trace_requests)")
