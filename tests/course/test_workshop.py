"""The instructor's agenda (workshop/agenda.md) agrees with the lessons it schedules: the core path
fits three hours and its start times add up, an optional lesson's minutes are what its speaker
notes plan, and a core lesson gets no more than its notes plan (the agenda names what to skip)."""

import re
from pathlib import Path

from nanoserve.course import lessons

AGENDA = Path(__file__).resolve().parents[2] / "workshop" / "agenda.md"


def table_rows(text: str, header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_core_path_fits_three_hours_and_its_start_times_add_up():
    rows = table_rows(AGENDA.read_text(), "| start |")
    t = 0
    for start, mins, part, _ in rows:
        h, m = map(int, start.split(":"))
        assert 60 * h + m == t, f"{part}: starts at {start}, the rows before end at {t // 60}:{t % 60:02d}"
        t += int(mins)
    assert t == 180, f"the core path takes {t} minutes"


def test_lesson_minutes_match_their_speaker_notes():
    text = AGENDA.read_text()
    core = {re.search(r"Lesson (\d\d)", r[2]).group(1): int(r[1])
            for r in table_rows(text, "| start |") if "Lesson" in r[2]}
    optional = {re.search(r"Lesson (\d\d)", r[0]).group(1): int(r[1])
                for r in table_rows(text, "| part |") if r[0].startswith("Lesson")}
    assert core and optional and not set(core) & set(optional)
    for number, mins in optional.items():
        assert mins == round(lessons.minutes(lessons.lesson_path(number))[1]), number
    for number, mins in core.items():
        assert 0 < mins <= lessons.minutes(lessons.lesson_path(number))[1], number
