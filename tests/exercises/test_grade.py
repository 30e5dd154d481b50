"""nanoserve.course.grade: the junit parsing and the score table (fast, no subprocess); the
instructor's reports: Gradescope's results.json checked against its schema, and a folder of
submissions graded into one CSV (slow: they run the graded tests)."""

import ast
import csv
import io
import json
import shutil

import pytest

from nanoserve.course import grade, grade_report


def test_junit_parsing_and_score_table(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text("""<testsuites><testsuite>
      <testcase classname="tests.exercises.test_ex02_paged_kv" name="test_blocks_needed"/>
      <testcase classname="tests.exercises.test_ex02_paged_kv" name="test_write_kv[dtype0]"/>
      <testcase classname="tests.exercises.test_ex02_paged_kv" name="test_write_kv[dtype1]">
        <failure message="AssertionError: slot -1 was written&#10;assert False">trace</failure></testcase>
      <testcase classname="tests.exercises.test_ex07_metrics" name="test_tpot">
        <properties><property name="mutant" value="ex07_x"/></properties>
        <error message="NotImplementedError: ex07: write tpot">trace</error></testcase>
      <testcase classname="tests.test_other" name="test_not_graded"/>
    </testsuite></testsuites>""")
    cases = grade._parse_junit(report)
    assert [(c.exercise, c.task, c.outcome) for c in cases] == [
        ("ex02", "blocks_needed", "passed"), ("ex02", "write_kv", "passed"), ("ex02", "write_kv", "failed"),
        ("ex07", "tpot", "failed")]
    assert cases[2].message == "slot -1 was written" and cases[3].mutant == "ex07_x"
    table = grade.score_table(cases, {"ex02": "Exercise 2: the paged KV cache"})
    assert "Exercise 2: the paged KV cache" in table and "1/2" in table
    assert "FAIL  write kv (1/2 cases)" in table and "slot -1 was written" in table
    assert table.splitlines()[-1].split()[-2:] == ["1/3", "tasks"]


def test_exercise_titles_and_unknown_exercise(capsys):
    titles = grade.exercise_titles(grade.repo_root())
    assert titles["ex04"].startswith("Exercise 4: a continuous-batching scheduler")
    assert grade.main(["ex42"]) == 2
    assert "no graded tests for ['ex42']" in capsys.readouterr().err


# -- for instructors: titles, reports, Gradescope, a folder of submissions ----------------------

ROOT = grade.repo_root()
VISIBILITY = {"visible", "hidden", "after_due_date", "after_published"}
# Gradescope's results.json (gradescope-autograders.readthedocs.io, "Autograder Specifications"):
# field -> (types, required here); the top-level score may be left out only when every test has one
RESULTS_FIELDS = {"score": ((int, float), True), "execution_time": ((int, float), False),
                  "output": ((str,), False), "visibility": ((str,), False),
                  "stdout_visibility": ((str,), False), "extra_data": ((dict,), False),
                  "tests": ((list,), True)}
TEST_FIELDS = {"score": ((int, float), True), "max_score": ((int, float), True), "name": ((str,), True),
               "number": ((str,), False), "output": ((str,), True), "tags": ((list,), False),
               "visibility": ((str,), False), "status": ((str,), False), "extra_data": ((dict,), False)}


def check_fields(obj: dict, fields: dict, where: str) -> None:
    unknown = set(obj) - set(fields)
    assert not unknown, f"{where}: fields Gradescope doesn't define: {sorted(unknown)}"
    for name, (types, required) in fields.items():
        if name not in obj:
            assert not required, f"{where}: {name} missing"
            continue
        assert isinstance(obj[name], types) and not isinstance(obj[name], bool), \
            f"{where}: {name}={obj[name]!r} is not {types}"
    for name in ("visibility", "stdout_visibility"):
        assert obj.get(name, "visible") in VISIBILITY, f"{where}: {name}={obj[name]!r}"
    assert obj.get("status", "passed") in ("passed", "failed"), f"{where}: status={obj['status']!r}"


def validate_gradescope(results: dict) -> None:
    check_fields(results, RESULTS_FIELDS, "results.json")
    assert results["tests"], "results.json: no tests"
    for i, t in enumerate(results["tests"]):
        check_fields(t, TEST_FIELDS, f"tests[{i}]")
        assert 0 <= t["score"] <= t["max_score"], f"tests[{i}]: score {t['score']} of {t['max_score']}"
    assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))


def test_titles_come_from_the_grader_not_the_students_file(tmp_path):
    for path in sorted((ROOT / "solutions").glob("ex[0-9][0-9]_*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc.startswith(grade_report.TITLES[path.name[:4]]), f"{path.name}: title is not the grader's"
    forged = tmp_path / "ex02_paged_kv.py"
    forged.write_text('"""Exercise 2: full marks, says the student."""\n')
    cases = [grade.Case("ex02", "blocks_needed", "test_blocks_needed", "failed", "NotImplementedError")]
    assert "full marks" not in grade.score_table(cases)
    assert grade.score_table(cases).splitlines()[0].startswith("Exercise 2: the paged KV cache")


def test_hidden_tests_are_found_and_marked(tmp_path):
    folder = tmp_path / "tests" / "exercises"
    (folder / "hidden").mkdir(parents=True)
    for p in (folder / "test_ex02_paged_kv.py", folder / "hidden" / "test_ex02_hidden_extra.py"):
        p.write_text("")
    assert [p.relative_to(folder).as_posix() for p in grade.graded_files(tmp_path, ["ex02"])] == [
        "test_ex02_paged_kv.py", "hidden/test_ex02_hidden_extra.py"]
    report = tmp_path / "r.xml"
    report.write_text("""<testsuites><testsuite>
      <testcase classname="tests.exercises.test_ex02_paged_kv" name="test_blocks_needed"/>
      <testcase classname="tests.exercises.hidden.test_ex02_hidden_extra" name="test_big_blocks">
        <failure message="AssertionError: wrong">trace</failure></testcase>
    </testsuite></testsuites>""")
    cases = grade._parse_junit(report)
    assert [c.hidden for c in cases] == [False, True]
    results = grade_report.gradescope_results(cases, 3.0, hidden_visibility="hidden")
    validate_gradescope(results)
    assert [(t["visibility"], t["status"], t["score"]) for t in results["tests"]] == [
        ("visible", "passed", 1.0), ("hidden", "failed", 0.0)]
    assert results["score"] == 1.0 and "wrong" in results["tests"][1]["output"]
    report_json = grade_report.json_report(cases)
    assert (report_json["score"], report_json["max_score"]) == (1, 2)
    assert report_json["exercises"][0]["tasks"][1] == {
        "name": "big_blocks", "passed": False, "cases": 1, "failed_cases": 1, "message": "wrong",
        "hidden": True}
    with pytest.raises(ValueError, match="visibility 'secret'"):
        grade_report.gradescope_results(cases, 1.0, visibility="secret")


def student_folders(tmp_path):
    """Three students: one right (copies of solutions/), one wrong (a mutant of ex02), one
    without ex02's file."""
    right, wrong, missing = (tmp_path / n for n in ("ana", "ben", "cy"))
    for d in (right, wrong / "exercises", missing):  # ben hands in his exercises/ folder
        d.mkdir(parents=True)
    for name in ("ex02_paged_kv.py", "ex07_metrics.py"):
        shutil.copy(ROOT / "solutions" / name, right / name)
    shutil.copy(ROOT / "tests/exercises/mutants/ex02_slot_off_by_one.py",
                wrong / "exercises/ex02_paged_kv.py")
    shutil.copy(ROOT / "solutions/ex07_metrics.py", wrong / "exercises/ex07_metrics.py")
    shutil.copy(ROOT / "solutions/ex07_metrics.py", missing / "ex07_metrics.py")
    return tmp_path


@pytest.mark.slow
def test_gradescope_output_of_a_submission_follows_the_schema(tmp_path, capsys):
    folder = student_folders(tmp_path)
    out = tmp_path / "results.json"
    assert grade.main(["ex02", "ex07", "--submission", str(folder / "ben"), "--format", "gradescope",
                       "-o", str(out)]) == 0
    results = json.loads(out.read_text())
    validate_gradescope(results)
    failed = [t for t in results["tests"] if t["status"] == "failed"]
    assert failed and all(t["name"].startswith("Exercise 2: the paged KV cache") for t in failed), failed
    assert len(results["tests"]) == 13 and results["score"] == 13 - len(failed)


@pytest.mark.slow
def test_a_folder_of_submissions_makes_one_csv(tmp_path, capsys):
    folder = student_folders(tmp_path)
    out = tmp_path / "grades.csv"
    assert grade.main(["ex02", "ex07", "--submissions", str(folder), "-o", str(out)]) == 0
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    assert list(rows) == ["ana", "ben", "cy"]
    assert rows["ana"] == {"student": "ana", "ex02": "7", "ex07": "6", "total": "13", "max_total": "13",
                           "missing": ""}
    assert 0 < int(rows["ben"]["ex02"]) < 7 and rows["ben"]["ex07"] == "6" and rows["ben"]["missing"] == ""
    assert rows["cy"] == {"student": "cy", "ex02": "0", "ex07": "6", "total": "6", "max_total": "13",
                          "missing": "ex02"}


@pytest.mark.slow
def test_run_autograder_writes_results_json(tmp_path):
    """workshop/gradescope/run_autograder in Gradescope's layout: the course in source/, the
    student's files in submission/ (one right ex07, one missing ex02), results/results.json out."""
    import os
    import subprocess
    import sys
    (tmp_path / "source").symlink_to(ROOT)
    (tmp_path / "submission").mkdir()
    shutil.copy(ROOT / "solutions/ex07_metrics.py", tmp_path / "submission/ex07_metrics.py")
    python = tmp_path / "bin"
    python.mkdir()
    (python / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's
    (python / "python3").chmod(0o755)
    env = dict(os.environ, AUTOGRADER=str(tmp_path), EXERCISES="ex02 ex07",
               PATH=f"{python}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    subprocess.run(["bash", str(ROOT / "workshop/gradescope/run_autograder")], env=env, check=True,
                   capture_output=True, timeout=600)
    results = json.loads((tmp_path / "results/results.json").read_text())
    validate_gradescope(results)
    by_ex = {}
    for t in results["tests"]:
        by_ex.setdefault(t["name"].split(":")[0], []).append(t)
    assert all(t["status"] == "passed" for t in by_ex["Exercise 7"])
    assert all(t["status"] == "failed" and "missing from the submission" in t["output"]
               for t in by_ex["Exercise 2"])
