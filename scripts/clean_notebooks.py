"""Strip notebook outputs before committing, keeping the reference output of checked cells.

Notebooks are committed without outputs, except cells marked `# NBVAL_CHECK_OUTPUT`: their
output is deterministic (a formula, a seeded simulation) and nbval compares it on every CI run,
so it must stay in the file, with its execution count (nbval skips cells that never ran).
After editing a checked cell, regenerate its reference output in quick mode:

    NANOSERVE_QUICK=1 jupyter nbconvert --to notebook --execute --inplace notebooks/03_*.ipynb
    python scripts/clean_notebooks.py notebooks/03_*.ipynb

`--check` changes nothing and exits 1 when a notebook would change (tests/test_notebooks_meta.py
checks the same rule).
"""

from __future__ import annotations

import argparse
import sys

import nbformat

MARK = "# NBVAL_CHECK_OUTPUT"


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and MARK in cell.source


def clean(nb) -> bool:
    """Clear every unchecked code cell's outputs and count; drop transient widget state.
    -> whether anything changed."""
    changed = False
    for cell in nb.cells:
        if cell.cell_type != "code" or is_checked(cell):
            continue
        if cell.outputs or cell.execution_count is not None:
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
