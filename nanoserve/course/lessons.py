"""The lessons as files: find them, execute one headless the way `jupyter nbconvert --execute`
does (nbclient, a timeout per cell), and turn its widgets into the static figures they drew.

Used by `make preflight` (course.preflight), the deck build (scripts/build_decks.py) and the
tests that execute every lesson. nbclient and nbformat come with the dev extras (JupyterLab
brings them); they are imported inside functions, so importing nanoserve needs neither.

A widget is live only in a running notebook. In an executed file its output is a reference to
a widget model, and the model's state holds what its Output widgets drew last (the default
state: nothing moved a slider). `static_widgets` replaces each such reference by those figures
and a line saying the widget is live in the lab, so an exported deck needs no widget runtime.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# the lessons with speaker notes: the decks, the headless-execution test and the instructor guide
# cover these (a new lesson joins once it has its notes; 11 to 13 are second-day lessons)
WORKSHOP_LESSONS = tuple(f"{n:02d}" for n in range(14))
# The course's thirteen claims, each measured by one lesson section: claim id -> (lesson, the
# section's heading, what the measurement shows). workshop/agenda.md's core path shows every one
# (tests/course/test_workshop.py checks the headings exist and the agenda covers all thirteen).
CLAIMS = {
    "roofline": ("00", "The roofline",
                 "a step is bounded by bytes / bandwidth or FLOPs / peak, whichever is longer"),
    "prefill-compute-bound": ("01", "Prefill time against prompt length",
                              "prefill time grows with the prompt; its tokens share each weight read"),
    "decode-memory-bound": ("01", "Decode against its floor",
                            "a decode step costs about the time to read every weight once"),
    "kv-cache": ("02", "How big is the cache?",
                 "KV bytes per token = 2 x layers x KV heads x head dim x element size; it caps the batch"),
    "batching-decode": ("03", "Throughput and latency against batch size",
                        "decode throughput climbs almost linearly with the batch while ITL barely moves"),
    "batching-prefill": ("03", "Prefill gains far less from batching",
                         "a prompt is already a batch: more prompts per step add little throughput"),
    "continuous-batching": ("04", "The same arrivals, measured",
                            "re-forming the batch every step beats static batching on latency, throughput"),
    "chunked-prefill": ("05", "The trade-off: TTFT against ITL",
                        "a long prefill stalls every decoder; chunks trade its TTFT for their ITL"),
    "prefix-caching": ("06", "Measured: one system prompt, many users",
                       "a shared prompt is prefilled once: hit rate up, prefill tokens and TTFT down"),
    "stratified-latency": ("07", "Trap 1: a workload change is not a regression",
                           "TTFT, ITL and E2E depend on input and output lengths: compare them stratified"),
    "goodput": ("07", "Trap 2: throughput hides failure; goodput doesn't",
                "past capacity throughput holds while the requests meeting the SLO fall"),
    "token-cost": ("08", "Why an output token costs more",
                   "an output token needs a memory-bound step; an input token shares a compute-bound one"),
    "disaggregation": ("09", "Part 1 · On this machine",
                       "prefill and decode on separate instances: the ITL tail goes, TTFT pays"),
}
LIVE_NOTE = ("<p><em>Interactive in JupyterLab: run this lesson there to move the controls. "
             "Shown here: the widget's default view, as drawn when the deck was built.</em></p>")


def lesson_paths(numbers=None, folder: Path = NOTEBOOKS) -> list[Path]:
    """The lesson notebooks NN_*.ipynb in order; `numbers` ("00", "05", ...) picks some."""
    paths = sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))
    if numbers is not None:
        wanted = {f"{int(n):02d}" for n in numbers}
        missing = wanted - {p.name[:2] for p in paths}
        if missing:
            raise ValueError(f"no lesson numbered {sorted(missing)} in {folder}")
        paths = [p for p in paths if p.name[:2] in wanted]
    return paths


def lesson_path(number) -> Path:
    """The notebook of lesson `number` (5 or "05")."""
    return lesson_paths([number])[0]


NOTE_MINUTES = re.compile(r"\((\d+(?:\.\d+)?) min\)")
WORDS_PER_MINUTE = 100  # technical text with formulas, read with care


def minutes(path) -> tuple[float, float]:
    """(reading, presenting) minutes of a lesson: its markdown and code words, speaker notes
    excluded, at WORDS_PER_MINUTE (an estimate); and the sum of the "(N min)" its notes plan."""
    import nbformat
    nb = nbformat.read(Path(path), as_version=4)
    words, planned = 0, 0.0
    for cell in nb.cells:
        if cell.metadata.get("slideshow", {}).get("slide_type") == "notes":
            planned += sum(float(m) for m in NOTE_MINUTES.findall(cell.source))
        else:
            words += len(cell.source.split())
    return words / WORDS_PER_MINUTE, planned


def section_minutes(path) -> dict[str, float]:
    """Presenting minutes per section of a lesson: each slide or subslide's heading (its first
    line, without the #s) -> the "(N min)" its notes plan; the title slide's heading comes first."""
    import nbformat
    nb = nbformat.read(Path(path), as_version=4)
    out: dict[str, float] = {}
    heading = None
    for cell in nb.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        if cell.cell_type == "markdown" and kind in ("slide", "subslide"):
            heading = cell.source.splitlines()[0].lstrip("#").strip()
            out.setdefault(heading, 0.0)
        elif kind == "notes" and heading is not None:
            out[heading] += sum(float(m) for m in NOTE_MINUTES.findall(cell.source))
    return out


def execute(path, quick: bool = True, cell_timeout: int = 300, env: dict | None = None):
    """Run every cell of a notebook in a fresh kernel with nbclient, in the notebook's folder,
    and return the executed notebook (outputs and widget state included).

    quick sets NANOSERVE_QUICK for the kernel. Raises nbclient's CellExecutionError naming the
    cell when a cell fails, and CellTimeoutError when one runs past `cell_timeout` seconds."""
    import nbformat
    from nbclient import NotebookClient
    if cell_timeout <= 0:
        raise ValueError(f"cell_timeout must be a positive number of seconds, got {cell_timeout}")
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    kernel_env = {**os.environ, **(env or {}), "NANOSERVE_QUICK": "1" if quick else "0"}
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=kernel_env)
    return nb


def errors(nb) -> list[str]:
    """'cell N: Ename: evalue' for every error output of an executed notebook."""
    return [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
            if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]


def _widget_models(nb) -> dict:
    return nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def widget_images(nb, model_id: str) -> list[str]:
    """Base64 PNGs that the Output widgets inside widget `model_id` show, depth first."""
    models, found, seen = _widget_models(nb), [], set()

    def walk(mid):
        if mid in seen or mid not in models:
            return
        seen.add(mid)
        state = models[mid].get("state", {})
        for out in state.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png:
                found.append(png)
        for child in state.get("children", []):
            walk(re.sub(r"^IPY_MODEL_", "", child))
    walk(model_id)
    return found


def static_widgets(nb) -> int:
    """Replace every widget output of an executed notebook by the figures its Output widgets
    drew, followed by LIVE_NOTE; a widget that drew none (a progress bar) is dropped. The widget
    state goes too. -> how many widgets were replaced by figures."""
    import nbformat
    replaced = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.outputs:
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                outputs.append(out)
                continue
            pngs = widget_images(nb, view["model_id"])
            if pngs:
                replaced += 1
                outputs += [nbformat.v4.new_output("display_data", {"image/png": png}) for png in pngs]
                outputs.append(nbformat.v4.new_output("display_data", {"text/html": LIVE_NOTE}))
        cell.outputs = outputs
    nb.metadata.pop("widgets", None)
    return replaced


def split_title_slide(nb) -> None:
    """A deck's title slide shows the lesson's title and its question; the rest of the first
    cell (what the lesson does, in a notebook read above the first measurement) goes on a slide
    of its own beneath it, with the title's speaker notes on both. The setup cell that follows
    starts a slide of its own too: its code and printed table under that text ran off the screen."""
    first = nb.cells[0]
    paragraphs = first.source.split("\n\n")
    ask = next((i for i, p in enumerate(paragraphs) if p.startswith("**The question:**")), None)
    if ask is None or ask + 1 == len(paragraphs):
        return
    rest = _copy(first, "intro")
    first.source, rest.source = "\n\n".join(paragraphs[:ask + 1]), "\n\n".join(paragraphs[ask + 1:])
    rest.metadata["slideshow"] = {"slide_type": "subslide"}
    notes = next((c for c in nb.cells[1:] if _slide_type(c) == "notes"), None)
    setup = nb.cells[1] if len(nb.cells) > 1 else None
    if notes is None:
        nb.cells[1:1] = [rest]
        return
    nb.cells[1:1] = [_copy(notes, "title"), rest]
    if setup is not None and setup.cell_type == "code" and _slide_type(setup) in ("", "-"):
        setup.metadata["slideshow"] = {"slide_type": "subslide"}
        nb.cells[3:3] = [_copy(notes, "intro")]  # the intro text's slide keeps the notes too


def _copy(cell, suffix: str):
    """A copy of `cell` under an id of its own (nbformat wants every cell id unique)."""
    import copy
    new = copy.deepcopy(cell)
    if "id" in new:
        new["id"] = f"{cell['id'][:56]}-{suffix}"
    return new


def _slide_type(cell) -> str:
    return cell.metadata.get("slideshow", {}).get("slide_type", "")
