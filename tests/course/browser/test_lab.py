"""Lessons in JupyterLab in a real browser, quick mode: every lesson's cells run with no error
output and its figures load; (05, 07, 12, 13) moving a widget's slider changes its figure. nbval runs
the kernel only; this runs the front end too, and keeps screenshots of each lesson's figures,
widgets and whole page at JupyterLab's width in test-artifacts/ to look at. Also: RISE loads.
"""

import contextlib
import re
import time

import pytest

from nanoserve.course import lessons

RUN_TIMEOUT = 420  # seconds for all cells of a quick-mode lesson on 2 busy cores


def open_notebook(page, lab, path: str):
    base, token = lab
    # ?reset: a fresh workspace, so an earlier test's restored tab (and its kernel's status) is gone
    page.goto(f"{base}/lab/tree/{path}?reset&token={token}", timeout=90_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    deadline, quiet = time.monotonic() + 90, 0
    while time.monotonic() < deadline:  # ready: kernel idle, and no dialog for 3 s in a row
        accept = page.locator(".jp-Dialog button.jp-mod-accept")
        if accept.count():  # "Select Kernel": take the notebook's own, Python 3
            accept.first.click()
            quiet = 0
        elif page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count():
            quiet += 1
            if quiet >= 3:
                return
        time.sleep(1)
    pytest.fail("the notebook's kernel did not start within 90 s")


def click_run_all(page):
    page.click("li.lm-MenuBar-item:has-text('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")


def run_all(page):
    click_run_all(page)
    deadline, idle, retried = time.monotonic() + RUN_TIMEOUT, 0, False
    while time.monotonic() < deadline:
        time.sleep(2)
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        ran = [bool(re.search(r"\[\d+\]", p)) for p in prompts]
        idle = idle + 1 if page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count() else 0
        if prompts and all(ran) and idle:
            return
        if idle >= 10 and not any("*" in p for p in prompts):
            if not any(ran) and not retried:  # the click met a kernel still connecting: once more
                click_run_all(page)
                idle, retried = 0, True
                continue
            # Run All halts at an error
            pytest.fail(f"execution stopped at code cell {ran.index(False)}: {errors(page)}")
    pytest.fail(f"cells still running after {RUN_TIMEOUT} s: {errors(page)}")


def errors(page) -> list[str]:
    stderr = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    outs = page.locator(stderr).all_inner_texts()
    return [o[:300] for o in outs if "Traceback" in o or "Error" in o.split("\n")[0]]


def widget_figure(page, output_index: int = -1):
    """The PNG (its data URL) that the lesson's last widget shows."""
    imgs = page.locator(".jupyter-widgets .widget-output img, .jupyter-widgets.widget-output img")
    assert imgs.count() > 0, "no widget shows a figure"
    return imgs.nth(output_index)


def move_slider(scope, handle_index: int = 0, key: str = "ArrowRight"):
    """Move a slider of `scope` (a page, or the dashboard whose figure is watched)."""
    handle = scope.locator(".noUi-handle").nth(handle_index)
    handle.scroll_into_view_if_needed()
    handle.focus()
    handle.press(key)


def screenshot_figures(page, artifacts, number: str) -> int:
    """Each figure of the lesson as the learner sees it, into test-artifacts/ to look at. -> how many."""
    figures = page.locator(".jp-OutputArea-output img")
    for i in range(figures.count()):
        figures.nth(i).scroll_into_view_if_needed()
        assert figures.nth(i).evaluate("i => i.naturalWidth") > 200, f"figure {i} did not load"
        figures.nth(i).screenshot(path=str(artifacts / f"lab_{number}_figure_{i}.png"))
    return figures.count()


def wait_changed(img, before: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = img.get_attribute("src")
        if now and now != before:
            return now
        time.sleep(1)
    pytest.fail(f"the figure did not change within {timeout:.0f} s of moving the slider")


WIDGET_LESSONS = ("05", "07", "12", "13")  # a slider moved, the figure watched


@contextlib.contextmanager
def lesson_run(browser, lab, artifacts, number: str):
    """A page with lesson `number` open and all its cells run without error; the whole page is
    kept as a screenshot however the test ends."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    try:
        open_notebook(page, lab, lessons.lesson_path(number).name)
        run_all(page)
        assert not errors(page), errors(page)
        yield page
    finally:
        page.screenshot(path=str(artifacts / f"lab_{number}_page.png"))
        page.close()


@pytest.mark.parametrize("number", WIDGET_LESSONS)
def test_lesson_runs_and_its_widget_responds(browser, lab, artifacts, number):
    with lesson_run(browser, lab, artifacts, number) as page:
        img = widget_figure(page)
        img.scroll_into_view_if_needed()
        before = img.get_attribute("src")
        assert before.startswith("data:image/png"), before[:40]
        box = page.locator(".jupyter-widgets.widget-vbox, .jupyter-widgets .widget-vbox").last
        box.screenshot(path=str(artifacts / f"lab_{number}_before.png"))
        move_slider(box)  # one of this dashboard's own: a lesson may show more than one
        after = wait_changed(img, before)
        assert after != before
        box.screenshot(path=str(artifacts / f"lab_{number}_after.png"))
        screenshot_figures(page, artifacts, number)


@pytest.mark.parametrize("number", [n for n in lessons.WORKSHOP_LESSONS if n not in WIDGET_LESSONS])
def test_lesson_runs_and_its_figures_show(browser, lab, artifacts, number):
    with lesson_run(browser, lab, artifacts, number) as page:
        assert screenshot_figures(page, artifacts, number) > 0, "no figure in the outputs"


def test_rise_loads(browser, lab, artifacts):
    """jupyterlab-rise serves a notebook as reveal.js slides at /rise/<path>."""
    base, token = lab
    path = lessons.lesson_path("00").name
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(f"{base}/rise/{path}?token={token}", timeout=90_000)
        page.wait_for_selector(".reveal .slides section", timeout=90_000)
        assert page.locator(".reveal .slides section").count() >= 5
        page.wait_for_selector(".reveal .slides section.present", timeout=30_000)
        page.screenshot(path=str(artifacts / "rise_00.png"))
    finally:
        page.close()
