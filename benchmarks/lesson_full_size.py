"""A lesson at full size on this machine, headless: its figures, widget figures and printed text.

    python benchmarks/lesson_full_size.py 12      # notebooks/12_*.ipynb with NANOSERVE_QUICK=0

Executes the lesson with nbclient (course.lessons.execute) and writes
benchmarks/results/lesson<NN>-full-<date>/: a PNG per figure and per widget figure, and README.md
with the lesson's printed outputs in order, the time it took and the load average before and after.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import time
from pathlib import Path

from nanoserve.course import lessons

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lesson", help="its number, e.g. 12")
    ap.add_argument("--cell-timeout", type=int, default=900)
    args = ap.parse_args(argv)
    path = lessons.lesson_path(args.lesson)
    load, t = os.getloadavg(), time.perf_counter()
    nb = lessons.execute(path, quick=False, cell_timeout=args.cell_timeout)
    took, errs = time.perf_counter() - t, lessons.errors(nb)
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M")
    out = RESULTS / f"lesson{args.lesson}-full-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Lesson {args.lesson} at full size ({path.name}), {stamp}", "",
             f"Executed headless with nbclient (`python benchmarks/lesson_full_size.py {args.lesson}`), "
             f"NANOSERVE_QUICK=0, in {took:.0f} s; load average before {load[0]:.2f}, after "
             f"{os.getloadavg()[0]:.2f}. Errors: {errs or 'none'}.", ""]
    n = 0

    def image(b64: str, kind: str, cell: int) -> None:
        nonlocal n
        n += 1
        name = f"{kind}-{n}-cell-{cell}.png"
        (out / name).write_bytes(base64.b64decode(b64))
        lines.append(f"![cell {cell}{', widget' if kind == 'widget' else ''}]({name})")

    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        for o in c.outputs:
            data = o.get("data", {})
            if "image/png" in data:
                image(data["image/png"], "figure", i)
            text = o.get("text") or data.get("text/plain")
            if text and "image/png" not in data and o.get("name") != "stderr":
                lines += [f"cell {i}:", "```", str(text).strip()[:3000], "```"]
            model = data.get(lessons.WIDGET_VIEW, {}).get("model_id")
            for png in lessons.widget_images(nb, model) if model else []:
                image(png, "widget", i)
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"{out}: {took:.0f} s, errors: {errs or 'none'}")


if __name__ == "__main__":
    main()
