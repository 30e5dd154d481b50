"""The instructor's agenda (workshop/agenda.md) agrees with the lessons it schedules: the core path
fits three hours and its start times add up, an optional lesson's minutes are what its speaker
notes plan, a core lesson's minutes are what its notes plan for the sections it shows, and the
core path shows all thirteen claims (course.lessons.CLAIMS), with ex02 and one more exercise."""

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


def core_rows(text: str) -> dict[str, tuple[int, list[str]]]:
    """Lesson number -> (minutes, the sections its row shows) of the core path."""
    return {re.search(r"Lesson (\d\d)", r[2]).group(1): (int(r[1]), re.findall(r'"([^"]+)"', r[3]))
            for r in table_rows(text, "| start |") if "Lesson" in r[2]}


def test_a_core_lessons_minutes_are_its_title_and_shown_sections():
    for number, (mins, shown) in core_rows(AGENDA.read_text()).items():
        sections = lessons.section_minutes(lessons.lesson_path(number))
        missing = [s for s in shown if s not in sections]
        assert not missing, f"lesson {number}: the agenda shows sections it doesn't have: {missing}"
        title = next(iter(sections))
        planned = sections[title] + sum(sections[s] for s in shown)
        assert mins == planned, f"lesson {number}: {mins} minutes in the agenda, its notes plan {planned:g}"


def test_the_core_path_measures_all_thirteen_claims():
    text = AGENDA.read_text()
    assert len(lessons.CLAIMS) == 13
    rows = {r[0]: r[1:] for r in table_rows(text, "| claim |")}
    assert rows.keys() == lessons.CLAIMS.keys(), \
        f"claims not in the agenda: {sorted(lessons.CLAIMS.keys() - rows.keys())}"
    core = core_rows(text)
    exercises = {m.group(1) for r in table_rows(text, "| start |")
                 for m in [re.search(r"Exercise (ex\d\d)", r[2])] if m}
    assert "ex02" in exercises and len(exercises) >= 2, f"hands-on exercises in the core path: {exercises}"
    covered = 0
    for claim, (lesson, section, shown) in rows.items():
        assert (lesson, section) == lessons.CLAIMS[claim][:2], f"{claim}: the agenda's section is not CLAIMS'"
        assert section in lessons.section_minutes(lessons.lesson_path(lesson)), \
            f"{claim}: lesson {lesson} has no section {section!r}"
        assert lesson in core and section in core[lesson][1], \
            f"{claim}: {section!r} is not shown in the core path"
        assert shown.startswith("live") or shown.startswith("attendee"), f"{claim}: shown {shown!r}"
        for ex in re.findall(r"ex\d\d", shown):
            assert ex in exercises, f"{claim}: measured by {ex}, which the core path doesn't run"
        covered += 1
    assert covered == 13
