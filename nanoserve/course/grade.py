"""Grade the course exercises, and plug a student's kernels into a running engine.

`python -m nanoserve grade [ex02 ex05 ...]` runs the graded tests (tests/exercises/test_exNN_*.py)
against `exercises/` in a pytest subprocess and prints a score per exercise and per task, with
the first line of each failing check's message. `--impl solutions` grades the reference answers.
Where triton is not installed (pip has it for Linux only), ex08 (Triton kernels) is left out and
the command says why.

For instructors: `--submission DIR` grades one student's exercise files (DIR/exNN_*.py, or
DIR/exercises/exNN_*.py) instead of exercises/, `--format json|gradescope` writes a report or
Gradescope's results.json (course.grade_report), and `--submissions DIR` grades every student
folder in DIR into one CSV. Graded tests in tests/exercises/hidden/ (the instructor's copy only)
run too and are marked hidden.

Students' pieces plug into the engine, which never imports course material: a scheduler class
with `LLM(model, scheduler=MyScheduler)`, kernels with `nanoserve.kernels.use_kernels(llm,
paged_attention=mine)`. `load_piece` imports a piece of exercises/ or solutions/ by name and
`compare_schedulers` runs a scheduler beside the built-in one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from nanoserve import cli
from nanoserve.course import grade_report
from nanoserve.course.grade_report import TITLES, score_table  # noqa: F401 (grade.score_table)

GRADED_FILE = re.compile(r"^test_(ex\d\d)_\w+\.py$")
HIDDEN_DIR = "hidden"  # tests/exercises/hidden/: graded tests kept off the students' copy
NEEDS_TRITON = "ex08"
NO_TRITON = ("ex08 (Triton kernels) left out: triton is not installed (pip has it for Linux only; "
             "its kernels run on a GPU, or on a CPU under TRITON_INTERPRET=1)")


def load_piece(path: str, impl: str = "exercises"):
    """A piece of `exercises/` (yours) or `solutions/`, e.g. "ex04_scheduler.ContinuousScheduler"."""
    if impl not in ("exercises", "solutions"):
        raise ValueError(f"impl={impl!r}; allowed: 'exercises' or 'solutions'")
    root = str(repo_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(f"{impl}.{module}"), name)


def compare_schedulers(scheduler_cls, model: str = "preset:tiny", num_prompts: int = 6,
                       max_tokens: int = 12, config=None) -> str:
    """Run the same prompts with the built-in scheduler and with `scheduler_cls` plugged in.
    -> a table: per request, whether the greedy outputs agree, and each engine's step count."""
    from nanoserve import LLM, EngineConfig, SamplingParams
    # the budget fits every prompt whole: the ex04 scheduler does not chunk prompts
    config = config or EngineConfig(max_num_batched_tokens=64, max_num_seqs=4, num_kv_blocks=64)
    prompts = [[(7 * i + j) % 900 + 10 for j in range(5 + 9 * i)] for i in range(num_prompts)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    runs = {}
    for label, cls in (("built-in", None), (scheduler_cls.__name__, scheduler_cls)):
        llm = LLM(model, config=config, scheduler=cls)
        runs[label] = ([o.token_ids for o in llm.generate(prompts, params)], llm.engine.stats.steps)
    (ref, ref_steps), (mine, my_steps) = runs.values()
    lines = [f"{'request':>7} {'prompt':>6}  same greedy tokens as built-in"]
    lines += [f"{i:>7} {len(p):>6}  {'yes' if a == b else 'NO'}" for i, (p, a, b) in
              enumerate(zip(prompts, ref, mine))]
    lines.append(f"steps: built-in {ref_steps}, {scheduler_cls.__name__} {my_steps}")
    return "\n".join(lines)


# --- running the graded tests ---------------------------------------------------------

@dataclass
class Case:
    """One test case (a parametrization of a task)."""

    exercise: str  # "ex02"
    task: str  # test function name without "test_" and parameters
    case: str  # full test name, with parameters
    outcome: str  # "passed" | "failed" | "skipped"
    message: str = ""  # first line of the failure, in plain words
    mutant: str | None = None  # in the guards' mutant runs: the mutant this case checked
    hidden: bool = False  # from tests/exercises/hidden/


@dataclass
class GradeRun:
    cases: list[Case] = field(default_factory=list)
    returncode: int = 0
    output: str = ""  # pytest's own output (for errors that happened outside tests)


def repo_root() -> Path:
    """The course checkout: the working directory if it has tests/exercises, else nanoserve's parent."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "tests" / "exercises").is_dir():
            return root
    raise FileNotFoundError("tests/exercises not found: run `python -m nanoserve grade` from the "
                            "root of the course checkout")


def graded_files(root: Path, exercises: list[str] | None = None) -> list[Path]:
    """tests/exercises/test_exNN_*.py and tests/exercises/hidden/test_exNN_*.py (where the
    instructor's copy has them), all or only the given exercise ids (ex02 or 2)."""
    wanted = {f"ex{int(e.lower().removeprefix('ex')):02d}" for e in exercises} if exercises else None
    folder = root / "tests" / "exercises"
    files = sorted((p for p in [*folder.iterdir(), *((folder / HIDDEN_DIR).glob("*.py"))]
                    if GRADED_FILE.match(p.name)), key=lambda p: (p.parent.name == HIDDEN_DIR, p.name))
    if wanted is not None:
        unknown = wanted - {GRADED_FILE.match(p.name).group(1) for p in files}
        if unknown:
            raise ValueError(f"no graded tests for {sorted(unknown)}; available: "
                             f"{sorted(GRADED_FILE.match(p.name).group(1) for p in files)}")
        files = [p for p in files if GRADED_FILE.match(p.name).group(1) in wanted]
    return files


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            # pytest wraps a fixture's failure as: failed on setup with "Failed: <message>"
            line = re.sub(r'^failed on setup with "', "", line)
            for prefix in ("AssertionError: ", "Failed: ", "E   "):
                line = line.removeprefix(prefix)
            return line[:300]
    return ""


def run_graded(exercises: list[str] | None = None, impl: str = "exercises",
               env: dict[str, str] | None = None, timeout: float | None = None,
               submission: Path | None = None) -> GradeRun:
    """Run the graded tests in a pytest subprocess and collect one Case per test.

    impl: the package graded ("exercises" or "solutions"); submission: a student's folder of
    exercise files graded instead (a missing file scores 0 on its exercise); env: extra
    environment variables (tests/exercises/conftest.py reads NANOSERVE_IMPL_OVERRIDES,
    NANOSERVE_MUTANTS and NANOSERVE_SUBMISSION).
    """
    root = repo_root()
    files = graded_files(root, exercises)
    env = dict(os.environ, **(env or {}), NANOSERVE_IMPL=impl)
    if submission is not None:
        env["NANOSERVE_SUBMISSION"] = str(submission_folder(Path(submission)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", *map(str, files), f"--impl={impl}", "-q",
               "-p", "no:cacheprovider", "-p", "no:randomly", f"--junitxml={report}",
               "-o", "junit_logging=no"]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        run = GradeRun(returncode=proc.returncode, output=proc.stdout + proc.stderr)
        if report.exists():
            run.cases = _parse_junit(report)
    return run


def _parse_junit(path: Path) -> list[Case]:
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        m = re.search(r"test_(ex\d\d)_", tc.get("classname", ""))
        if m is None:
            continue
        name = tc.get("name", "")
        task = name.split("[", 1)[0].removeprefix("test_")
        outcome, message = "passed", ""
        for tag in ("failure", "error"):
            el = tc.find(tag)
            if el is not None:
                outcome = "failed"
                message = _first_line(el.get("message")) or _first_line(el.text)
                break
        else:
            if tc.find("skipped") is not None:
                outcome = "skipped"
                message = _first_line(tc.find("skipped").get("message"))
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        hidden = f".{HIDDEN_DIR}." in f".{tc.get('classname', '')}"
        cases.append(Case(m.group(1), task, name, outcome, message, props.get("mutant"), hidden))
    return cases


def submission_folder(path: Path) -> Path:
    """Where a student's exercise files are: `path`, or its exercises/ subfolder."""
    if not path.is_dir():
        raise FileNotFoundError(f"submission folder {path} does not exist")
    return path / "exercises" if (path / "exercises").is_dir() else path


def exercise_titles(root: Path | None = None, package: str = "exercises") -> dict[str, str]:
    """ex id -> its title, e.g. "Exercise 2: the paged KV cache": the grader's own (grade_report.TITLES),
    never the student's docstring."""
    return dict(TITLES)


def grade_submissions(folder: Path, exercises: list[str], timeout: float | None = None) -> str:
    """Grade every student folder in `folder` (one pytest run each) -> the CSV of
    grade_report.submissions_csv: a missing exercise file scores 0 and is listed."""
    students = sorted(p for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise FileNotFoundError(f"no student folders in {folder}")
    rows = {}
    for student in students:
        run = run_graded(exercises, submission=student, timeout=timeout)
        if not run.cases:
            raise RuntimeError(f"grading {student.name} ran no graded test:\n{run.output[-2000:]}")
        have = {p.name[:4] for p in submission_folder(student).glob("ex[0-9][0-9]_*.py")}
        ts = grade_report.tasks(run.cases)
        rows[student.name] = {ex: (sum(t.passed for t in ts if t.exercise == ex),
                                   sum(t.exercise == ex for t in ts), ex not in have) for ex in exercises}
    return grade_report.submissions_csv(rows, exercises)


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("nanoserve grade", "Run the graded tests and print a score per exercise.")
    ap.add_argument("exercise", nargs="*", default=None,
                    help="exercise ids to grade, e.g. ex02 ex05 (default: all)")
    ap.add_argument("--impl", default="exercises", choices=("exercises", "solutions"),
                    help="which package to grade: exercises is your answers")
    ap.add_argument("--format", default="text", choices=("text", "json", "gradescope"),
                    help="text: the score table; json: a report; gradescope: Gradescope's results.json")
    ap.add_argument("--submission", type=Path, help="grade this student's folder of exercise files")
    ap.add_argument("--submissions", type=Path,
                    help="grade every student folder in this folder into one CSV (one row per student)")
    ap.add_argument("-o", "--output", type=Path, help="write the report here (default: stdout)")
    ap.add_argument("--visibility", default="visible", choices=grade_report.VISIBILITY,
                    help="gradescope: visibility of the tests and of the results")
    ap.add_argument("--hidden-visibility", default="after_published", choices=grade_report.VISIBILITY,
                    help="gradescope: visibility of the tests from tests/exercises/hidden/")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print pytest's output")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        root = repo_root()
        files = graded_files(root, args.exercise or None)
        wanted = sorted({GRADED_FILE.match(p.name).group(1) for p in files})
        if NEEDS_TRITON in wanted and importlib.util.find_spec("triton") is None:
            print(f"nanoserve grade: {NO_TRITON}", file=sys.stderr)
            wanted.remove(NEEDS_TRITON)
            if not wanted:
                return 2
        if args.submissions is not None:
            return _write(args.output, grade_submissions(args.submissions, wanted))
        run = run_graded(wanted, impl=args.impl, submission=args.submission)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"nanoserve grade: {e}", file=sys.stderr)
        return 2
    if args.verbose or not run.cases:
        print(run.output, file=sys.stderr if args.format != "text" else sys.stdout)
    if not run.cases:
        print("nanoserve grade: pytest ran no graded test (see its output above)", file=sys.stderr)
        return 2
    if args.format == "text":
        _write(args.output, score_table(run.cases) + "\n")
    elif args.format == "json":
        _write(args.output, json.dumps(grade_report.json_report(run.cases), indent=1) + "\n")
    else:
        results = grade_report.gradescope_results(run.cases, time.perf_counter() - start,
                                                  args.visibility, args.hidden_visibility)
        _write(args.output, json.dumps(results, indent=1) + "\n")
        return 0  # the score is in the file: Gradescope reads it whatever the exit status
    return 0 if all(c.outcome != "failed" for c in run.cases) else 1


def _write(path: Path | None, text: str) -> int:
    if path is None:
        sys.stdout.write(text)
    else:
        Path(path).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
