"""The modelled tables the lessons print, pinned to the text a reader sees.

Notebooks are committed without outputs, so nbval only checks that their cells run; these
tables come from formulas, datasheets and seeded simulations, so their text must not drift
silently. Each key is the very call a lesson's cell makes (tests/course/data/lesson_tables.json).
After an intended change, regenerate: `pytest tests/course/test_lesson_tables.py --regen-tables`
(to pin a new call, add its key to the JSON with any value, then regenerate).
"""

import json
import pathlib

import pytest

from nanoserve.course import experiments as ex  # noqa: F401 (used by the calls' text)
from nanoserve.course import scenarios  # noqa: F401 (used by the calls' text)

DATA = pathlib.Path(__file__).parent / "data" / "lesson_tables.json"
TABLES = json.loads(DATA.read_text())


@pytest.mark.parametrize("call", TABLES)
def test_lesson_table_text(call, request):
    got = repr(eval(call))
    if request.config.getoption("--regen-tables"):
        DATA.write_text(json.dumps({**json.loads(DATA.read_text()), call: got}, indent=1) + "\n")
        pytest.skip("regenerated")
    assert got == TABLES[call]


def test_every_pinned_call_is_in_a_lesson():
    sources = "".join(p.read_text() for p in DATA.parents[3].glob("notebooks/*.ipynb"))
    for call in TABLES:
        assert json.dumps(call)[1:-1] in sources, f"no lesson makes the call {call}"
