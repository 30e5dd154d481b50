"""Table: rows of dicts shown as aligned text (print) or HTML (a notebook cell's value)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np


class Table:
    """Rows of dicts shown as an aligned text table (print) or HTML (a notebook cell's value)."""

    def __init__(self, rows: Sequence[dict], title: str = "", floatfmt: str = ".3g"):
        self.rows, self.title, self.floatfmt = list(rows), title, floatfmt
        self.columns = list(dict.fromkeys(k for r in self.rows for k in r))

    def _cell(self, v) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "–"  # no value here: not measured, or nothing to divide by
            text = format(v, self.floatfmt)
            return _plain(v, self.floatfmt) if "e" in text and math.isfinite(v) else text
        return str(v)

    def __repr__(self) -> str:
        cells = [[self._cell(r.get(c, "")) for c in self.columns] for r in self.rows]
        width = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(self.columns)]
        lines = [self.title] if self.title else []
        lines.append("  ".join(c.rjust(w) for c, w in zip(self.columns, width)))
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, width)) for row in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{esc(self._cell(r.get(c, '')))}</td>"
                                        for c in self.columns) + "</tr>" for r in self.rows)
        cap = f"<caption>{esc(self.title)}</caption>" if self.title else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plain(v: float, floatfmt: str) -> str:
    """v to floatfmt's significant digits (".3g": 3) without an exponent: 9280, not 9.28e+03, and
    0.0000335, not 3.35e-05 (a table is read by people comparing columns, not by a parser)."""
    digits = int(floatfmt.strip(".g") or 6) if floatfmt.endswith("g") else 6
    return np.format_float_positional(v, precision=digits, unique=False, fractional=False, trim="-")
