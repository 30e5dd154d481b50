"""Guards on the graded exercises themselves (not graded; `python -m nanoserve grade` skips them).

- exercises/ and solutions/ expose the same public names and signatures (and, while a skeleton
  is untouched, the same docstrings);
- the untouched skeletons fail every graded test (so no test passes vacuously);
- every mutant in mutants/ (a wrong-but-plausible answer) fails some graded test.
The solutions passing every graded test is the default run of tests/exercises itself.
The last two run pytest in a subprocess each (nanoserve.course.grade.run_graded).
"""

import ast
from pathlib import Path

import pytest

from nanoserve.course.grade import graded_files, run_graded

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = sorted((Path(__file__).parent / "mutants").glob("ex[0-9][0-9]_*.py"))
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


def is_stub(fn: ast.FunctionDef) -> bool:
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    return (len(body) == 1 and isinstance(body[0], ast.Raise)
            and "NotImplementedError" in ast.unparse(body[0].exc))


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
    passed = [c.case for c in skeleton_run.cases if c.exercise in pristine and c.outcome != "failed"]
    assert not passed, f"graded tests that pass on the untouched skeletons (vacuous): {passed}"
    vague = [c.case for c in skeleton_run.cases
             if c.exercise in pristine and "NotImplementedError" not in c.message]
    assert not vague, f"skeleton failures that don't name the missing piece: {vague}"


@pytest.fixture(scope="module")
def mutant_run():
    return run_graded(impl="solutions", env={"NANOSERVE_MUTANTS": "all"}, timeout=600)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[p.stem for p in MUTANTS])
def test_mutant_is_caught(mutant_run, mutant):
    cases = [c for c in mutant_run.cases if c.mutant == mutant.stem]
    assert cases, f"no graded test ran against mutant {mutant.stem}:\n{mutant_run.output[-3000:]}"
    failed = [c for c in cases if c.outcome == "failed"]
    assert failed, (f"mutant {mutant.stem} ({ast.get_docstring(ast.parse(mutant.read_text()))}) "
                    f"passed all {len(cases)} graded tests of {mutant.name[:4]}")
