"""Build the lesson decks: execute each lesson headless, turn its widgets into the figures they
drew, and export a reveal.js deck that loads everything from node_modules (no network).

    python scripts/build_decks.py                # quick mode (tiny model, ~1 min a lesson)
    python scripts/build_decks.py --full         # the sizes for this device (the presenter's)
    python scripts/build_decks.py --lessons 05 07 --out slides

`make slides` runs `npm ci` first (package.json: reveal.js, require.js, jQuery, MathJax 2, the
four things nbconvert's reveal template would otherwise fetch from CDNs) and then this script.
Each deck is slides/NN_name.slides.html; slides/timings.json records how long each lesson took
to execute, on which machine, in which mode (the instructor guide quotes these).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "node_modules"
TEMPLATE = Path(__file__).resolve().parent / "deck_template"
# what the reveal template loads, each from its npm package
ASSETS = {"reveal_url_prefix": "reveal.js", "require_js_url": "requirejs/require.js",
          "jquery_url": "jquery/dist/jquery.min.js",
          "mathjax_url": "mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe"}


def exporter(out_dir: Path):
    """nbconvert's SlidesExporter pointed at node_modules, relative to the deck's folder."""
    from nbconvert import SlidesExporter
    from traitlets.config import Config
    missing = [p for p in ASSETS.values() if not (NODE / p.split("?")[0]).exists()]
    if missing:
        sys.exit(f"node_modules lacks {missing}: run `npm ci` in {ROOT} (make slides does)")
    rel = os.path.relpath(NODE, out_dir)
    cfg = Config({"SlidesExporter": {k: f"{rel}/{v}" for k, v in ASSETS.items()}})
    cfg.SlidesExporter.extra_template_basedirs = [str(TEMPLATE.parent)]
    cfg.SlidesExporter.template_name = TEMPLATE.name
    return SlidesExporter(config=cfg)


def machine() -> str:
    from nanoserve.measure.ceilings import device_name
    return f"{device_name('cpu')}, {os.cpu_count()} CPUs, {platform.system()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="this device's sizes, not quick mode")
    ap.add_argument("--lessons", nargs="*", help="lesson numbers (default: lessons.WORKSHOP_LESSONS)")
    ap.add_argument("--out", default=str(ROOT / "slides"))
    ap.add_argument("--cell-timeout", type=int, default=900, help="seconds per cell")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from nanoserve.course import lessons
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    export = exporter(out_dir)
    mode = "full" if args.full else "quick"
    timings, failed = {}, []
    for path in lessons.lesson_paths(args.lessons or lessons.WORKSHOP_LESSONS):
        start = time.perf_counter()
        try:
            nb = lessons.execute(path, quick=not args.full, cell_timeout=args.cell_timeout)
        except Exception as e:  # nbclient names the cell and the error; keep building the rest
            failed.append(path.name)
            print(f"{path.name}: FAILED after {time.perf_counter() - start:.0f} s\n{e}", file=sys.stderr)
            continue
        took = time.perf_counter() - start
        widgets = lessons.static_widgets(nb)
        lessons.split_title_slide(nb)
        html, _ = export.from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
        deck = out_dir / f"{path.stem}.slides.html"
        deck.write_text(html, encoding="utf-8")
        timings[path.stem] = round(took, 1)
        print(f"{deck.relative_to(out_dir.parent)}: executed in {took:.0f} s ({mode}), "
              f"{html.count('<img')} images, {widgets} widget(s) as static figures", flush=True)
    record = out_dir / "timings.json"
    old = json.loads(record.read_text()) if record.exists() else {}
    old[mode] = {"machine": machine(), "date": datetime.date.today().isoformat(),
                 "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                 "seconds": {**old.get(mode, {}).get("seconds", {}), **timings}}
    record.write_text(json.dumps(old, indent=1) + "\n")
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
