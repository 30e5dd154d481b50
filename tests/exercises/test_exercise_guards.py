"""Guards on the graded exercises themselves (not graded; `python -m nanoserve grade` skips them).

- exercises/ and solutions/ expose the same public names and signatures (and, while a skeleton
  is untouched, the same docstrings);
- the untouched skeletons fail every graded test (so no test passes vacuously);
- every mutant in mutants/ (a wrong-but-plausible answer) fails some graded test;
- no exercise imports the package's own implementation of what it grades (the answer key), and a
  submission that imports it or calls its parent's version of the graded method scores 0, saying why;
- a GQA slip in exercise 3 fails only its GQA tasks, with messages that say GQA;
- every rule that exercise 4's docstring states has a graded test and a mutant.
The solutions passing every graded test is the default run of tests/exercises itself.
The runs of graded tests go through pytest in a subprocess (nanoserve.course.grade.run_graded).
"""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from exercise_checks import answer_key_hits, answer_key_imports

from nanoserve.course.grade import graded_files, run_graded

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_DIR = Path(__file__).parent / "mutants"
MUTANTS = sorted(MUTANTS_DIR.glob("ex[0-9][0-9]_*.py"))
GIVEN_CLASSES = {"BaseScheduler"}  # provided code in the skeletons, not exercise bodies


def modules(package: str) -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted((ROOT / package).glob("ex[0-9][0-9]_*.py"))}


def public_api(tree: ast.Module) -> dict[str, tuple]:
    """name -> (signature, docstring) of public functions, classes and methods (Class.method)."""
    api = {}

    def describe(fn):
        return ast.unparse(fn.args), ast.unparse(fn.returns) if fn.returns else None, ast.get_docstring(fn)

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            api[node.name] = describe(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            api[node.name] = ([ast.unparse(b) for b in node.bases], None, ast.get_docstring(node))
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and (item.name == "__init__"
                                                          or not item.name.startswith("_")):
                    api[f"{node.name}.{item.name}"] = describe(item)
    return api


def body(fn: ast.FunctionDef) -> list[ast.stmt]:
    return fn.body[1:] if ast.get_docstring(fn) is not None else fn.body


def is_stub(fn: ast.FunctionDef) -> bool:
    """Ends in `raise NotImplementedError(...)`, after at most a few given lines (ex04's first two)."""
    last = body(fn)[-1]
    return isinstance(last, ast.Raise) and "NotImplementedError" in ast.unparse(last.exc or last)


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef) and node.name not in GIVEN_CLASSES:
            out.update({f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)})
    return out


def untouched(name: str) -> bool:
    """A skeleton is untouched when every function that differs from the solution is a stub."""
    ex, sol = functions(modules("exercises")[name]), functions(modules("solutions")[name])
    stubs = [f for f in ex.values() if is_stub(f)]
    same = all(is_stub(f) or ast.dump(f) == ast.dump(sol.get(k, f)) for k, f in ex.items())
    return bool(stubs) and same


def test_exercises_and_solutions_have_the_same_api():
    ex, sol = modules("exercises"), modules("solutions")
    assert ex.keys() == sol.keys(), f"modules differ: {sorted(ex.keys() ^ sol.keys())}"
    for name in ex:
        a, b = public_api(ex[name]), public_api(sol[name])
        assert a.keys() == b.keys(), f"{name}: public names differ: {sorted(a.keys() ^ b.keys())}"
        docs = untouched(name)  # a student may annotate docstrings; signatures must stay
        for key in a:
            assert a[key][:2] == b[key][:2], f"{name}: the signature of {key} differs from solutions/"
            assert not docs or a[key][2] == b[key][2], f"{name}: the docstring of {key} differs"
        assert not docs or ast.get_docstring(ex[name]) == ast.get_docstring(sol[name]), \
            f"{name}: module docstrings differ"
        stubs = {k: f for k, f in functions(ex[name]).items() if docs and is_stub(f)}
        for key, fn in stubs.items():  # a stub's given lines are how the answer starts
            given = [ast.dump(st) for st in body(fn)[:-1]]
            answer = [ast.dump(st) for st in body(functions(sol[name])[key])[:len(given)]]
            assert given == answer, f"{name}: the given lines of {key} are not how solutions/ starts it"


def test_every_exercise_has_graded_tests():
    graded = {p.name[5:9] for p in graded_files(ROOT)}
    assert graded == {name[:4] for name in modules("solutions")}


@pytest.fixture(scope="module")
def skeleton_run():
    return run_graded(impl="exercises", timeout=600)


def test_untouched_skeletons_fail_every_graded_test(skeleton_run):
    assert skeleton_run.cases, f"the skeleton run collected no graded test:\n{skeleton_run.output[-3000:]}"
    pristine = {name[:4] for name in modules("exercises") if untouched(name)}
    if not pristine:
        pytest.skip("every exercise module has been edited: nothing to guard")
    # skipped cases (ex08 where triton is missing) prove nothing either way
    passed = [c.case for c in skeleton_run.cases if c.exercise in pristine and c.outcome == "passed"]
    assert not passed, f"graded tests that pass on the untouched skeletons (vacuous): {passed}"
    vague = [c.case for c in skeleton_run.cases if c.exercise in pristine and c.outcome == "failed"
             and "NotImplementedError" not in c.message]
    assert not vague, f"skeleton failures that don't name the missing piece: {vague}"


@pytest.fixture(scope="module")
def mutant_run():
    return run_graded(impl="solutions", env={"NANOSERVE_MUTANTS": "all"}, timeout=600)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[p.stem for p in MUTANTS])
def test_mutant_is_caught(mutant_run, mutant):
    cases = [c for c in mutant_run.cases if c.mutant == mutant.stem]
    assert cases, f"no graded test ran against mutant {mutant.stem}:\n{mutant_run.output[-3000:]}"
    if mutant.name.startswith("ex08") and importlib.util.find_spec("triton") is None:
        pytest.skip("ex08's graded tests skip without triton: its mutants are checked in `make test`")
    failed = [c for c in cases if c.outcome == "failed"]
    assert failed, (f"mutant {mutant.stem} ({ast.get_docstring(ast.parse(mutant.read_text()))}) "
                    f"passed all {len(cases)} graded tests of {mutant.name[:4]}")


# -- the answer key: nanoserve's own kernels ------------------------------------------------------

@pytest.mark.parametrize("source", [
    "from nanoserve.kernels import reference",
    "import nanoserve.kernels.reference as r",
    "from nanoserve.kernels.reference import gather_kv",
    "from nanoserve.kernels import triton_ops as t",
    "import nanoserve.kernels.triton_attention",
    "from nanoserve import kernels\nf = kernels.reference.gather_kv",
    "import nanoserve\nf = nanoserve.kernels.reference.paged_attention",
    "from nanoserve.kernels import get_ops",
    "def f():\n    from nanoserve.kernels.reference import reshape_and_cache"])
def test_answer_key_imports_are_found_in_any_form(source):
    assert answer_key_imports(source), f"not flagged: {source!r}"


def test_allowed_imports_are_not_flagged():
    source = ("import torch\nfrom nanoserve.kernels import AttentionMetadata, use_kernels\n"
              "from .ex02_paged_kv import gather_kv\n"
              "import nanoserve.kernels\nm = nanoserve.kernels.AttentionMetadata")
    assert answer_key_imports(source) == []


def test_no_exercise_or_solution_imports_the_answer_key():
    for path in sorted([*(ROOT / "exercises").glob("ex*.py"), *(ROOT / "solutions").glob("ex*.py")]):
        hits = answer_key_imports(path.read_text()) + answer_key_hits(path.name[:4], path.read_text())
        assert not hits, f"{path.relative_to(ROOT)} imports the answer key: {hits}"


@pytest.mark.parametrize("ex_id, source", [
    ("ex01", "from nanoserve.measure.roofline import step_cost"),
    ("ex01", "from nanoserve.measure import roofline\nf = roofline.decode_step_floor"),
    ("ex04", "from nanoserve.engine.scheduler import Scheduler"),
    ("ex04", "from nanoserve.engine import Scheduler as S"),  # a re-export
    ("ex04", "class C(B):\n    def schedule(self, now):\n        return super().schedule(now)"),
    ("ex05", "class C(B):\n    def schedule(self, now):\n        return B.schedule(self, now)"),
    ("ex05", "class C(B):\n    def schedule(self, now):\n        return P.schedule_running(self, 8, now)"),
    ("ex06", "from nanoserve.engine.kv_cache import hash_block"),
    ("ex06", "from nanoserve.engine import KVCacheManager"),
    ("ex07", "import nanoserve.measure.metrics as m"),
    ("ex07", "from nanoserve.measure.metrics import completed"),
    ("ex11", "from nanoserve.engine.spec_decode import ngram_lookup"),  # a re-export
    ("ex11", "from nanoserve.engine.rejection_sampler import accept_greedy")])
def test_each_exercise_answer_key_is_found(ex_id, source):
    assert answer_key_hits(ex_id, source), f"{ex_id}: not flagged: {source!r}"


@pytest.mark.parametrize("ex_id, source", [
    ("ex04", "from nanoserve.engine.scheduler import SchedulerBase, SchedulerOutput"),
    ("ex05", "from .ex04_scheduler import BaseScheduler\nclass C(BaseScheduler):\n"
             "    def schedule(self, now):\n        return self.helper(now)"),
    ("ex06", "from collections import OrderedDict\nimport hashlib"),
    ("ex07", "import numpy as np\nfrom nanoserve.outputs import RequestOutput"),
    ("ex01", "from nanoserve.config import ModelConfig")])
def test_allowed_code_is_not_flagged(ex_id, source):
    assert answer_key_hits(ex_id, source) == []


DELEGATES = {"ex01_roofline": "ex01_delegates_to_roofline", "ex04_scheduler": "ex04_delegates_to_scheduler",
             "ex05_chunked_prefill": "ex05_delegates_to_scheduler",
             "ex06_prefix_cache": "ex06_delegates_to_kv_cache", "ex07_metrics": "ex07_delegates_to_metrics"}


@pytest.fixture(scope="module")
def delegate_run():
    """Each of ex01, ex04-ex07 replaced by a submission that hands the work to the package."""
    env = {"NANOSERVE_IMPL_OVERRIDES": ";".join(f"{m}={MUTANTS_DIR / f}.py" for m, f in DELEGATES.items())}
    return run_graded([m[:4] for m in DELEGATES], impl="solutions", env=env, timeout=600)


@pytest.mark.parametrize("module", sorted(DELEGATES))
def test_a_delegating_submission_scores_zero_and_says_why(delegate_run, module):
    cases = [c for c in delegate_run.cases if c.exercise == module[:4]]
    assert cases, delegate_run.output[-3000:]
    passed = [c.case for c in cases if c.outcome != "failed"]
    assert not passed, f"{DELEGATES[module]} hands the work to the package and still passes {passed}"
    vague = [c.message for c in cases
             if not c.message.startswith("0 points") or "answer key" not in c.message]
    assert not vague, f"failures that don't say the module uses the answer key: {vague[:2]}"


@pytest.fixture(scope="module")
def override_run():
    """ex02 replaced by the answer key's delegate, ex03 by the GQA slip: what `grade` would say."""
    overrides = {"ex02_paged_kv": "ex02_delegates_to_reference",
                 "ex03_attention": "ex03_gqa_repeat_not_interleave"}
    env = {"NANOSERVE_IMPL_OVERRIDES": ";".join(f"{m}={MUTANTS_DIR / f}.py" for m, f in overrides.items())}
    return run_graded(["ex02", "ex03"], impl="solutions", env=env, timeout=600)


def test_delegating_to_the_reference_scores_zero_and_says_why(override_run):
    cases = [c for c in override_run.cases if c.exercise == "ex02"]
    assert cases, override_run.output[-3000:]
    passed = [c.case for c in cases if c.outcome != "failed"]
    assert not passed, f"an ex02 that calls nanoserve.kernels.reference still passes {passed}"
    vague = [c.message for c in cases if "answer key" not in c.message]
    assert not vague, f"failures that don't say the module imports the answer key: {vague[:2]}"


def test_a_gqa_slip_fails_only_the_gqa_tasks_and_says_gqa(override_run):
    failed = [c for c in override_run.cases if c.exercise == "ex03" and c.outcome == "failed"]
    assert {c.task for c in failed} == {"one_request_grouped_query_attention", "grouped_query_attention"}, \
        f"tasks failed by the GQA slip: {sorted({c.task for c in failed})}"
    assert all(c.message.startswith("off by") and "GQA" in c.message for c in failed), \
        [c.message for c in failed]


# -- exercise 4: every stated rule is graded ------------------------------------------------------

def test_every_ex04_rule_has_a_graded_test_and_a_mutant():
    doc = ast.get_docstring(modules("exercises")["ex04_scheduler.py"])
    rules = re.findall(r"^(\d+)\. ", doc[doc.index("The rules"):], flags=re.M)
    assert rules == [str(i) for i in range(1, len(rules) + 1)] and len(rules) >= 8, rules
    tests = (Path(__file__).parent / "test_ex04_scheduler.py").read_text()
    mutants = " ".join(ast.get_docstring(ast.parse(p.read_text())) for p in MUTANTS if p.name[:4] == "ex04")
    for n in rules:
        assert re.search(rf"\brules? (\d+ and )?{n}\b", tests, re.I), f"ex04 rule {n}: no test names it"
        assert re.search(rf"\brule {n}\b", mutants), f"ex04 rule {n}: no mutant (mutants/ex04_*.py) breaks it"
