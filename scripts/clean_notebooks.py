"""Strip notebook outputs (and transient widget state) before committing.

Every number a lesson shows is measured on the reader's device or modelled; none is stored in
the notebook. The modelled tables are pinned in tests/course/test_lesson_tables.py instead.

    python scripts/clean_notebooks.py notebooks/*.ipynb

`--check` changes nothing and exits 1 when a notebook would change (tests/course/test_notebooks_meta.py
checks the same rule).
"""

from __future__ import annotations

import argparse
import sys

import nbformat


def clean(nb) -> bool:
    """Clear every code cell's outputs, count and execution timestamps; drop transient widget
    state. -> whether anything changed."""
    changed = False
    for cell in nb.cells:
        if "execution" in cell.metadata:
            del cell.metadata["execution"]
            changed = True
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
            cell.outputs, cell.execution_count = [], None
            changed = True
    if "widgets" in nb.metadata:
        del nb.metadata["widgets"]
        changed = True
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--check", action="store_true", help="report, don't write; exit 1 if unclean")
    args = ap.parse_args(argv)
    dirty = []
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        if clean(nb):
            dirty.append(path)
            if not args.check:
                nbformat.write(nb, path)
    for path in dirty:
        print(f"{'has outputs' if args.check else 'cleaned'}: {path}")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
