"""Every workshop lesson (00-12) executes headless with nbclient, as `jupyter nbconvert --execute`
and `make slides` do, within a per-cell timeout, widgets included (quick mode), and each widget
leaves the figure of its default state in the notebook.

nbval does not catch a stalled widget cell: it does not serve the Output widget's message capture,
and nbclient does (it mimics the front end, sending comm messages to the kernel on the shell
channel while it waits there for the cell's reply: nbclient issue 312). The widgets therefore
draw without that capture; test_widgets_draw_without_the_output_capture checks it directly,
since the stall itself comes and goes with timing.
"""

import time

import pytest

from nanoserve.course import lessons

# each cell runs under a time limit: the C++ ops are built before
pytestmark = pytest.mark.usefixtures("cpu_ops")

LESSONS = lessons.lesson_paths(lessons.WORKSHOP_LESSONS)
WIDGET_LESSONS = {"03", "05", "07", "08", "09", "12", "13"}
CELL_TIMEOUT = 240  # seconds; quick-mode cells take a few on 2 busy cores, the slowest ~20


@pytest.fixture
def output_widget_sends(monkeypatch):
    """Messages nbclient's Output-widget mimic sends to the kernel during the run."""
    from nbclient.output_widget import OutputWidget
    sent = []
    original = OutputWidget.send

    def send(self, *args, **kwargs):
        sent.append(self.comm_id)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(OutputWidget, "send", send)
    return sent


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem[:2] for p in LESSONS])
def test_lesson_executes_headless(path, output_widget_sends):
    start = time.perf_counter()
    nb = lessons.execute(path, quick=True, cell_timeout=CELL_TIMEOUT)
    took = time.perf_counter() - start
    assert not lessons.errors(nb), lessons.errors(nb)
    assert not output_widget_sends, (
        f"{path.name}: nbclient answered an Output widget's capture ({len(output_widget_sends)} "
        "messages): a widget draws with `with out:`; use widgets.common.show_figure")
    # progress bars are widgets too; the lesson's own widgets are those that drew a figure
    drawn = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs
             if lessons.WIDGET_VIEW in o.get("data", {})
             and lessons.widget_images(nb, o.data[lessons.WIDGET_VIEW]["model_id"])]
    assert bool(drawn) == (path.name[:2] in WIDGET_LESSONS), (
        f"{path.name}: widgets with a figure of their default state in cells {drawn}")
    assert lessons.static_widgets(nb) == len(drawn)
    assert "widgets" not in nb.metadata
    assert all(lessons.WIDGET_VIEW not in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.outputs)
    print(f"{path.name}: {took:.1f} s")


def test_widgets_draw_without_the_output_capture(tmp_path, output_widget_sends):
    """A widget's redraw puts its figure in the Output's state (one update from the kernel), so
    nbclient never sends on the shell channel; the old `with out: clear_output(); plt.show()`
    made it send (counted here)."""
    import nbformat
    code = ["%matplotlib inline\nimport ipywidgets as W, matplotlib.pyplot as plt\n"
            "from nanoserve.course.widgets.common import show_figure",
            "out = W.Output()\nslider = W.IntSlider(value=1, min=1, max=3)\n"
            "def fig(_=None):\n    f, ax = plt.subplots()\n    ax.plot([0, slider.value])\n    return f\n"
            "def draw(_=None):\n    show_figure(out, fig)\nslider.observe(draw, names='value')\ndraw()\n"
            "W.VBox([slider, out])",
            "slider.value = 3\nassert len(out.outputs) == 1 and 'image/png' in out.outputs[0]['data']"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in code])
    path = tmp_path / "widget.ipynb"
    nbformat.write(nb, path)
    ran = lessons.execute(path, quick=True, cell_timeout=60)
    assert not lessons.errors(ran)
    assert not output_widget_sends
    widget, = ran.cells[1].outputs  # the VBox; the figure did not also land below the cell
    model = widget.data[lessons.WIDGET_VIEW]["model_id"]
    assert len(lessons.widget_images(ran, model)) == 1
