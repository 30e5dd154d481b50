"""The decks of `make slides`, opened from disk with the network off (every request that is not
file:// aborted): reveal.js starts from node_modules, every deck has its slides and speaker
notes, its title slide fits the screen, every taller slide scrolls and says so under its text, no
line or table runs off a slide's right edge, each formula shows once after paging through the deck,
a fragment shown below a tall slide's fold scrolls into view, and the slide of lesson 05's
interference figure shows the image."""

from pathlib import Path

import pytest

from nanoserve.course import lessons

ROOT = Path(__file__).resolve().parents[3]
DECKS = ROOT / "slides"


def deck_paths():
    return [DECKS / f"{p.stem}.slides.html" for p in lessons.lesson_paths(lessons.WORKSHOP_LESSONS)]


def open_offline(browser, require, deck: Path):
    """A page showing `deck` from file://, with every non-file request aborted. -> (page, blocked)."""
    require(deck.exists(), f"{deck.name} missing: run `make slides` first")
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    blocked = []

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()
    page.route("**/*", route)
    page.goto(deck.as_uri(), timeout=60_000)
    page.wait_for_selector(".reveal.ready", timeout=60_000)  # reveal.js marks itself ready
    return page, blocked


LEAVES = "[...document.querySelectorAll('.reveal .slides section')].filter(s => !s.querySelector('section'))"


@pytest.mark.parametrize("deck", deck_paths(), ids=lambda p: p.name[:2])
def test_deck_opens_offline_with_slides_and_notes(browser, require, artifacts, deck):
    page, blocked = open_offline(browser, require, deck)
    try:
        slides = page.evaluate(f"{LEAVES}.length")
        headings = page.locator(".reveal .slides section h1, .reveal .slides section h2").count()
        assert slides >= 5 and slides >= headings // 2, (slides, headings)
        notes = page.locator(".reveal aside.notes").count()
        assert notes >= slides, f"{notes} speaker notes for {slides} slides"
        assert page.locator(".reveal img").count() > 0 or deck.name.startswith("04"), "no figure in the deck"
        page.screenshot(path=str(artifacts / f"deck_{deck.name[:2]}_title.png"))
        # only the theme's web fonts are fetched from outside, and the deck works without them
        assert all(u.startswith("https://fonts.googleapis.com/") for u in blocked), blocked
    finally:
        page.close()


PRESENT = "document.querySelector('.reveal .slides section.present:not(.stack)')"


@pytest.mark.parametrize("deck", deck_paths(), ids=lambda p: p.name[:2])
def test_title_fits_and_every_taller_slide_scrolls(browser, require, artifacts, deck):
    page, _ = open_offline(browser, require, deck)
    try:
        places = page.evaluate(f"""() => {LEAVES}.map(s => {{
            const top = s.parentElement.matches('.slides') ? s : s.parentElement;
            const v = top === s ? 0 : [...top.children].indexOf(s);
            return [[...top.parentElement.children].indexOf(top), v];
        }})""")
        cut = []
        for k, (h, v) in enumerate(places):
            page.evaluate(f"location.hash = '#/{h}/{v}'")  # reveal.js follows the URL
            page.wait_for_function(f"() => {PRESENT} === {LEAVES}[{k}]", timeout=30_000)
            tall, height, scrolls, wide, text = page.evaluate(f"""() => {{ const s = {PRESENT};
                const h = parseFloat(document.querySelector('.reveal .slides').style.height);
                // the tab shows, under the scrolling box rather than over its last visible line
                const tab = document.querySelector('.reveal .slides > .ns-more');
                const top = s.parentElement.matches('.slides') ? 0 : s.parentElement.offsetTop;
                const scrolls = getComputedStyle(s).overflowY === 'scroll' && s.clientHeight <= h
                                && tab !== null && getComputedStyle(tab).visibility === 'visible'
                                && tab.offsetTop >= top + s.offsetTop + s.offsetHeight;
                const wide = [...s.querySelectorAll('pre')].filter(e => e.scrollWidth > e.clientWidth + 1)
                    .concat([...s.querySelectorAll('table')].filter(
                        t => t.offsetWidth > t.parentElement.clientWidth + 1))
                    .map(e => e.textContent.trim().slice(0, 40));
                return [s.scrollHeight, h, scrolls, wide, s.textContent.trim().slice(0, 40)]; }}""")
            if k == 0:
                assert tall <= height, f"the title slide is {tall} px tall, the slide {height} px: {text!r}"
            elif tall > height and not scrolls:
                cut.append((h, v, tall, text))
            cut += [(h, v, "a line cut at the right edge", line) for line in wide]
        assert not cut, f"slides taller than the screen with no 'more below' tab under them, or cut: {cut}"
        page.evaluate("location.hash = '#/0/1'")
        page.wait_for_timeout(1000)  # the slide transition
        # paged through as a presenter would, each formula shows once: one output per TeX source
        page.wait_for_function("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))",
                               timeout=30_000)
        shown, sources, previews = page.evaluate("""() => [document.querySelectorAll('.MathJax_CHTML').length,
            document.querySelectorAll('script[type^="math/tex"]').length,
            [...document.querySelectorAll('.MathJax_Preview')].filter(e => e.textContent.trim()).length]""")
        assert shown == sources and previews == 0, \
            f"{shown} typeset formulas for {sources} in the deck, and {previews} previews left beside them"
        page.screenshot(path=str(artifacts / f"deck_{deck.name[:2]}_intro.png"))
    finally:
        page.close()


def test_lesson_05_interference_slide_shows_its_figure(browser, require, artifacts):
    deck = DECKS / f"{lessons.lesson_path('05').stem}.slides.html"
    page, blocked = open_offline(browser, require, deck)
    try:
        # the slide whose heading says the decoders stall: the ITL timeline without chunking
        index = page.evaluate(f"""() => {{
            const s = {LEAVES}.find(x => /every decoder stalls/i.test(x.textContent));
            if (!s) return null;
            const top = s.parentElement.matches('.slides') ? s : s.parentElement;
            const h = [...top.parentElement.children].indexOf(top);
            return [h, top === s ? 0 : [...top.children].indexOf(s)];
        }}""")
        assert index is not None, "no slide titled '... every decoder stalls'"
        page.evaluate(f"location.hash = '#/{index[0]}/{index[1]}'")  # reveal.js follows the URL
        page.wait_for_function(f"() => /every decoder stalls/i.test({PRESENT}.textContent)", timeout=30_000)
        page.wait_for_timeout(1000)  # the slide transition
        img = page.locator(".reveal .slides section.present img").first
        assert img.count() == 1, "the interference slide has no image"
        assert img.is_visible()
        w = img.evaluate("i => i.naturalWidth")
        assert w > 200, f"the image did not load ({w} px wide)"
        page.screenshot(path=str(artifacts / "deck_05_interference.png"))
        # the widget's slide: its default state as a static figure, and the note that it is live
        assert "Interactive in JupyterLab" in page.content()
    finally:
        page.close()


def test_a_fragment_shown_below_the_fold_scrolls_into_view(browser, require, artifacts):
    deck = DECKS / f"{lessons.lesson_path('03').stem}.slides.html"
    page, _ = open_offline(browser, require, deck)
    try:
        # the first slide whose box scrolls and whose last fragment starts below the box's foot
        found = None
        places = page.evaluate(f"""() => {LEAVES}.map(s => {{
            const top = s.parentElement.matches('.slides') ? s : s.parentElement;
            return [[...top.parentElement.children].indexOf(top),
                    top === s ? 0 : [...top.children].indexOf(s), s.querySelector('.fragment') !== null];
        }})""")
        for k, (h, v, fragments) in enumerate(places):
            if not fragments:
                continue
            page.evaluate(f"location.hash = '#/{h}/{v}'")
            page.wait_for_function(f"() => {PRESENT} === {LEAVES}[{k}]", timeout=30_000)
            page.wait_for_timeout(1000)  # the slide transition
            below = page.evaluate(f"""() => {{ const s = {PRESENT};
                const f = [...s.querySelectorAll('.fragment')].pop();
                return getComputedStyle(s).overflowY === 'scroll'
                       && f.getBoundingClientRect().top > s.getBoundingClientRect().bottom; }}""")
            if below:
                found = (h, v)
                break
        assert found, "no slide of lesson 03's deck has a fragment below its fold"
        count = page.evaluate(f"{PRESENT}.querySelectorAll('.fragment').length")
        for _ in range(count):
            page.keyboard.press("Space")  # reveal.js: the next fragment
            page.wait_for_timeout(200)
        page.wait_for_timeout(500)
        top, bottom, box_top, box_bottom = page.evaluate(f"""() => {{ const s = {PRESENT};
            const f = [...s.querySelectorAll('.fragment')].pop().getBoundingClientRect();
            const b = s.getBoundingClientRect(); return [f.top, f.bottom, b.top, b.bottom]; }}""")
        assert top < box_bottom and (bottom <= box_bottom + 1 or top <= box_top + 1), \
            (found, top, bottom, box_top, box_bottom)
        page.screenshot(path=str(artifacts / "deck_03_fragment.png"))
    finally:
        page.close()
