"""What `python -m nanoserve grade` hands back: a score table for the student's terminal, a plain
JSON report, Gradescope's results.json, and one CSV row per student for a folder of submissions.

A task is one graded test function (all its parametrized cases); it scores 1 point when every
case passes (a skipped case, ex08 without triton, neither passes nor fails it). The titles come
from the grader, never from the student's file, so an edited docstring can't rename an exercise.

Gradescope's results.json (gradescope-autograders.readthedocs.io, "Autograder Specifications"):
top-level `score`, `execution_time` (s), `visibility`, `stdout_visibility` and `tests`, each test
with `name`, `number`, `score`, `max_score`, `status` ("passed"/"failed"), `visibility` and
`output`. Visibility is one of VISIBILITY; tests from the instructor's hidden folder
(grade.HIDDEN_DIR) get the hidden visibility the instructor chose.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

TITLES = {
    "ex01": "Exercise 1: roofline arithmetic",
    "ex02": "Exercise 2: the paged KV cache",
    "ex03": "Exercise 3: attention over a flattened batch and the paged cache",
    "ex04": "Exercise 4: a continuous-batching scheduler under a token budget (no chunked prefill)",
    "ex05": "Exercise 5: chunked prefill",
    "ex06": "Exercise 6: prefix caching",
    "ex07": "Exercise 7: serving metrics",
    "ex08": "Exercise 8: Triton kernels",
    "ex09": "Exercise 9: what a token costs",
    "ex10": "Exercise 10: the SLO of a served load",
    "ex11": "Exercise 11: speculative decoding",
}
VISIBILITY = ("visible", "hidden", "after_due_date", "after_published")


@dataclass
class Task:
    exercise: str
    name: str  # test function name without "test_"
    cases: int
    failed: int
    message: str  # the first failing case's message ("" when it passed)
    hidden: bool = False

    @property
    def passed(self) -> bool:
        return self.failed == 0


def tasks(cases) -> list[Task]:
    """One Task per (exercise, test function) of grade.Case rows, in the order they ran."""
    grouped: dict[tuple, list] = {}
    for c in cases:
        grouped.setdefault((c.exercise, c.task, c.hidden), []).append(c)
    out = []
    for (ex, name, hidden), cs in grouped.items():
        bad = [c for c in cs if c.outcome == "failed"]
        out.append(Task(ex, name, len(cs), len(bad), bad[0].message if bad else "", hidden))
    return sorted(out, key=lambda t: t.exercise)  # stable: test order kept within an exercise


def title(ex: str) -> str:
    return TITLES.get(ex, ex)


def score_table(cases, titles: dict[str, str] | None = None) -> str:
    """Per exercise: tasks passed / tasks; per task: PASS/FAIL, cases, first failure message."""
    titles = titles or TITLES
    lines, ts = [], tasks(cases)
    for ex in sorted({t.exercise for t in ts}):
        mine = [t for t in ts if t.exercise == ex]
        lines.append(f"{titles.get(ex, ex)[:68]:<70}{sum(t.passed for t in mine):>3}/{len(mine)}")
        for t in mine:
            count = f" ({t.cases - t.failed}/{t.cases} cases)" if t.cases > 1 and t.failed else ""
            lines.append(f"  {'pass' if t.passed else 'FAIL'}  {t.name.replace('_', ' ')}{count}")
            if not t.passed:
                lines.append(f"        {t.message}")
    lines.append(f"{'Total':<70}{sum(t.passed for t in ts):>3}/{len(ts)} tasks")
    return "\n".join(lines)


def json_report(cases) -> dict:
    """{"score", "max_score", "exercises": [{"id", "title", "score", "max_score", "tasks": [...]}]}"""
    ts = tasks(cases)
    exercises = []
    for ex in sorted({t.exercise for t in ts}):
        mine = [t for t in ts if t.exercise == ex]
        exercises.append({"id": ex, "title": title(ex), "score": sum(t.passed for t in mine),
                          "max_score": len(mine),
                          "tasks": [{"name": t.name, "passed": t.passed, "cases": t.cases,
                                     "failed_cases": t.failed, "message": t.message, "hidden": t.hidden}
                                    for t in mine]})
    return {"score": sum(t.passed for t in ts), "max_score": len(ts), "exercises": exercises}


def gradescope_results(cases, execution_time: float, visibility: str = "visible",
                       hidden_visibility: str = "after_published", output: str = "") -> dict:
    """Gradescope's results.json: one test per graded task, 1 point each."""
    for v in (visibility, hidden_visibility):
        if v not in VISIBILITY:
            raise ValueError(f"visibility {v!r}; allowed: {VISIBILITY}")
    tests, numbers = [], {}
    for t in tasks(cases):
        numbers[t.exercise] = numbers.get(t.exercise, 0) + 1
        tests.append({
            "name": f"{title(t.exercise)}: {t.name.replace('_', ' ')}",
            "number": f"{int(t.exercise[2:])}.{numbers[t.exercise]}",
            "score": float(t.passed), "max_score": 1.0,
            "status": "passed" if t.passed else "failed",
            "visibility": hidden_visibility if t.hidden else visibility,
            "output": "passed" if t.passed else f"{t.failed} of {t.cases} cases failed: {t.message}"})
    results = {"score": float(sum(t["score"] for t in tests)), "execution_time": round(execution_time, 1),
               "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}
    if output:
        results["output"] = output
    return results


def submissions_csv(rows: dict[str, dict[str, tuple[int, int, bool]]], exercises: list[str]) -> str:
    """One row per student: tasks passed per exercise, the total, the most there was, and the
    exercises whose file was missing (they score 0). rows: student -> {ex: (passed, tasks, missing)}."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["student", *exercises, "total", "max_total", "missing"])
    for student in sorted(rows):
        r = rows[student]
        got = [r[ex][0] for ex in exercises]
        writer.writerow([student, *got, sum(got), sum(r[ex][1] for ex in exercises),
                         " ".join(ex for ex in exercises if r[ex][2])])
    return buf.getvalue()
