"""The lessons' form, for every notebooks/NN_*.ipynb: committed without outputs (the modelled
tables they print are pinned in tests/course/test_lesson_tables.py instead), slide metadata on every
cell, a title, a summary, a "check yourself" question and the exercise that goes with it,
thin code cells, and a reveal.js deck that builds. Running them is nbval's job
(`pytest --nbval-lax notebooks/`)."""

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ROOT = Path(__file__).resolve().parents[2]
SLIDE_TYPES = {"slide", "subslide", "fragment", "-", "skip", "notes"}
MAX_CODE_LINES = 15  # "a cell is a few lines": logic belongs in nanoserve/

pytestmark = pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks yet")


def load(path):
    return nbformat.read(path, as_version=4)


def markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def nb_path(request):
    return request.param


def test_valid_notebook(nb_path):
    nbformat.validate(load(nb_path))


def test_numbers_are_unique():
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert len(numbers) == len(set(numbers)), f"two notebooks share a number: {numbers}"


def test_committed_without_outputs(nb_path):
    """Clean with scripts/clean_notebooks.py."""
    for i, cell in enumerate(load(nb_path).cells):
        ran = "execution" in cell.metadata or (
            cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None))
        assert not ran, (f"{nb_path.name} cell {i} keeps outputs or run timestamps; "
                         f"run scripts/clean_notebooks.py {nb_path}")


def test_every_cell_has_slide_metadata(nb_path):
    for i, cell in enumerate(load(nb_path).cells):
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        assert kind in SLIDE_TYPES, f"{nb_path.name} cell {i}: slide_type {kind!r} not in {SLIDE_TYPES}"


def test_title_summary_check_yourself_exercise(nb_path):
    nb = load(nb_path)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {nb_path.name[:2]}"), (
        f"{nb_path.name}: the first cell should be a markdown title '# {nb_path.name[:2]} ...'")
    assert first.metadata["slideshow"]["slide_type"] == "slide"
    text = markdown(nb)
    assert re.search(r"^#+ Summary", text, re.M | re.I), f"{nb_path.name}: no '## Summary' heading"
    assert re.search(r"check yourself", text, re.I), f"{nb_path.name}: no 'check yourself' question"
    exercises = re.findall(r"exercises/(ex(\d\d)_\w+)\.py", text)
    assert exercises, f"{nb_path.name}: links no exercise (exercises/exNN_name.py)"
    graded = {n for cmd in re.findall(r"nanoserve grade((?:\s+ex\d\d)+)", text) for n in cmd.split()}
    for name, number in exercises:
        assert (ROOT / "exercises" / f"{name}.py").exists(), f"{nb_path.name}: exercises/{name}.py missing"
        assert f"ex{number}" in graded, (
            f"{nb_path.name}: say how exercises/{name}.py is graded: `python -m nanoserve grade ex{number}`")


def test_code_cells_are_thin(nb_path):
    """Notebooks narrate and call nanoserve; they define no functions or classes."""
    for i, cell in enumerate(load(nb_path).cells):
        if cell.cell_type != "code":
            continue
        lines = [line for line in cell.source.splitlines() if line.strip()]
        assert len(lines) <= MAX_CODE_LINES, (
            f"{nb_path.name} cell {i} has {len(lines)} lines; move the logic into nanoserve/")
        assert not re.search(r"^\s*(def|class)\s", cell.source, re.M), (
            f"{nb_path.name} cell {i} defines a function or class; put it in nanoserve/")


def test_a_deck_builds():
    """`make slides` runs `jupyter nbconvert --to slides`; one deck is enough to test."""
    from nbconvert import SlidesExporter
    nb = load(NOTEBOOKS[0])
    html, _ = SlidesExporter().from_notebook_node(nb)
    slides = sum(c.metadata["slideshow"]["slide_type"] == "slide" for c in nb.cells)
    assert "reveal" in html.lower()
    assert html.count("<section") >= slides


def test_every_slide_has_speaker_notes(nb_path):
    """Every slide and subslide of a workshop lesson ends with a "notes" cell (reveal.js speaker
    notes): what to say, what the audience should see on screen, and the minutes it takes."""
    from nanoserve.course.lessons import WORKSHOP_LESSONS
    if nb_path.name[:2] not in WORKSHOP_LESSONS:
        pytest.skip(f"{nb_path.name} is not in the workshop yet (course.lessons.WORKSHOP_LESSONS)")
    cells = load(nb_path).cells
    kinds = [c.metadata["slideshow"]["slide_type"] for c in cells]
    starts = [i for i, k in enumerate(kinds) if k in ("slide", "subslide")]
    for s, e in zip(starts, starts[1:] + [len(cells)]):
        notes = [cells[i].source for i in range(s, e) if kinds[i] == "notes"]
        assert notes, f"{nb_path.name}: the slide starting at cell {s} has no speaker notes"
        text = "\n".join(notes)
        assert re.search(r"\*\*Say\*\* \((\d+) min\)", text) and "**On screen:**" in text, (
            f"{nb_path.name} cell {s}: notes say what to say (**Say** (N min): ...) and what is "
            f"**On screen:**; got {text[:80]!r}")


def test_a_decks_title_slide_is_the_title_and_the_question(nb_path):
    """Every lesson opens with the question it answers, and build_decks splits its first cell: the
    title and the question on the title slide, the rest on a subslide beneath it, the setup cell
    on a subslide of its own, and the title's speaker notes on each."""
    from nanoserve.course.lessons import split_title_slide
    nb = load(nb_path)
    first, n = nb.cells[0].source, len(nb.cells)
    split_title_slide(nb)
    title, notes, rest = nb.cells[:3]
    assert title.source.startswith(f"# {nb_path.name[:2]}") and title.source.rstrip().count("\n\n") == 1
    assert title.source.split("\n\n")[1].startswith("**The question:**")
    assert title.source + "\n\n" + rest.source == first
    assert rest.metadata["slideshow"]["slide_type"] == "subslide"
    assert notes.metadata["slideshow"]["slide_type"] == "notes" and "**Say**" in notes.source
    assert nb.cells[3].metadata["slideshow"]["slide_type"] == "notes"
    assert nb.cells[4].cell_type == "code" and nb.cells[4].metadata["slideshow"]["slide_type"] == "subslide"
    assert len(nb.cells) == n + 3
