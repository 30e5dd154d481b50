"""nanoserve.course.grade: the junit parsing and the score table (fast, no subprocess)."""

from nanoserve.course import grade


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
