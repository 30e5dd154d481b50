"""Grade the course exercises, and plug a student's kernels into a running engine.

`python -m nanoserve grade [ex02 ex05 ...]` runs the graded tests (tests/exercises/test_exNN_*.py)
against `exercises/` in a pytest subprocess and prints a score per exercise and per task, with
the first line of each failing check's message. `--impl solutions` grades the reference answers.
Where triton is not installed (pip has it for Linux only), ex08 (Triton kernels) is left out and
the command says why.

Students' pieces plug into the engine, which never imports course material: a scheduler class
with `LLM(model, scheduler=MyScheduler)`, kernels with `nanoserve.kernels.use_kernels(llm,
paged_attention=mine)`. `load_piece` imports a piece of exercises/ or solutions/ by name and
`compare_schedulers` runs a scheduler beside the built-in one.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from nanoserve import cli

GRADED_FILE = re.compile(r"^test_(ex\d\d)_\w+\.py$")
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
    """tests/exercises/test_exNN_*.py, all or only the given exercise ids (ex02 or 2)."""
    wanted = {f"ex{int(e.lower().removeprefix('ex')):02d}" for e in exercises} if exercises else None
    files = sorted(p for p in (root / "tests" / "exercises").iterdir() if GRADED_FILE.match(p.name))
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
               env: dict[str, str] | None = None, timeout: float | None = None) -> GradeRun:
    """Run the graded tests in a pytest subprocess and collect one Case per test.

    impl: the package graded ("exercises" or "solutions"); env: extra environment variables
    (tests/exercises/conftest.py reads NANOSERVE_IMPL_OVERRIDES and NANOSERVE_MUTANTS).
    """
    root = repo_root()
    files = graded_files(root, exercises)
    env = dict(os.environ, **(env or {}), NANOSERVE_IMPL=impl)
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
        cases.append(Case(m.group(1), task, name, outcome, message, props.get("mutant")))
    return cases


# --- the score table --------------------------------------------------------------------

def exercise_titles(root: Path, package: str = "exercises") -> dict[str, str]:
    """ex id -> the first sentence of its module docstring, e.g. "Exercise 2: the paged KV cache"
    (read with ast: nothing is imported)."""
    titles = {}
    for path in sorted((root / package).glob("ex[0-9][0-9]_*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or path.stem
        titles[path.name[:4]] = doc.splitlines()[0].split(". ")[0].rstrip(".")
    return titles


def score_table(cases: list[Case], titles: dict[str, str] | None = None) -> str:
    """Per exercise: tasks passed / tasks; per task: PASS/FAIL, cases, first failure message."""
    titles = titles or {}
    lines, total, passed = [], 0, 0
    for ex in sorted({c.exercise for c in cases}):
        tasks: dict[str, list[Case]] = {}
        for c in cases:
            if c.exercise == ex:
                tasks.setdefault(c.task, []).append(c)
        ok = [t for t, cs in tasks.items() if all(c.outcome != "failed" for c in cs)]
        total, passed = total + len(tasks), passed + len(ok)
        title = titles.get(ex, ex)
        lines.append(f"{title[:68]:<70}{len(ok):>3}/{len(tasks)}")
        for task, cs in tasks.items():
            bad = [c for c in cs if c.outcome == "failed"]
            mark = "FAIL" if bad else "pass"
            count = f" ({len(cs) - len(bad)}/{len(cs)} cases)" if len(cs) > 1 and bad else ""
            lines.append(f"  {mark}  {task.replace('_', ' ')}{count}")
            if bad:
                lines.append(f"        {bad[0].message}")
    lines.append(f"{'Total':<70}{passed:>3}/{total} tasks")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("nanoserve grade", "Run the graded tests and print a score per exercise.")
    ap.add_argument("exercise", nargs="*", default=None,
                    help="exercise ids to grade, e.g. ex02 ex05 (default: all)")
    ap.add_argument("--impl", default="exercises", choices=("exercises", "solutions"),
                    help="which package to grade: exercises is your answers")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print pytest's output")
    args = ap.parse_args(argv)
    try:
        root = repo_root()
        wanted = [GRADED_FILE.match(p.name).group(1) for p in graded_files(root, args.exercise or None)]
        if NEEDS_TRITON in wanted and importlib.util.find_spec("triton") is None:
            print(f"nanoserve grade: {NO_TRITON}", file=sys.stderr)
            wanted.remove(NEEDS_TRITON)
            if not wanted:
                return 2
        run = run_graded(wanted, impl=args.impl)
    except (FileNotFoundError, ValueError) as e:
        print(f"nanoserve grade: {e}", file=sys.stderr)
        return 2
    if args.verbose or not run.cases:
        print(run.output)
    if not run.cases:
        print("nanoserve grade: pytest ran no graded test (see its output above)", file=sys.stderr)
        return 2
    print(score_table(run.cases, exercise_titles(root)))
    return 0 if all(c.outcome != "failed" for c in run.cases) else 1


if __name__ == "__main__":
    sys.exit(main())
