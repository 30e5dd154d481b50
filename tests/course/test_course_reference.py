"""course.reference hands a lesson another machine's series only when it was measured on the same
kind of device at exactly the sizes the lesson runs now; course.preflight reports what to fix.
(The workshop pieces that need a kernel or a browser: tests/course/test_lessons_execute.py,
tests/course/browser.)"""

import json

from nanoserve.course import preflight, reference, setup


def write(folder, sizes, mode="quick", kind="cpu", lesson="03"):
    data = {"machine": "test box", "date": "2026-11-30", "device_kind": kind,
            "modes": {mode: {lesson: {"sizes": sizes, "series": {"decode_batch": [[1, 0.03], [2, 0.031]]}}}}}
    (folder / "box.json").write_text(json.dumps(data))
    reference._load.cache_clear()


def test_series_only_at_the_same_sizes_and_device(tmp_path):
    here = setup.sizes("03", quick=True, device="cpu")
    write(tmp_path, here)
    label, points = reference.series("03", "decode_batch", device="cpu", quick=True, folder=tmp_path)
    assert label == "cpu: test box, 2026-11-30, quick sizes" and points == [[1, 0.03], [2, 0.031]]
    assert reference.series("03", "nothing", device="cpu", quick=True, folder=tmp_path) is None
    assert reference.series("03", "decode_batch", device="cpu", quick=False, folder=tmp_path) is None
    write(tmp_path, {**here, "steps": here["steps"] + 1})  # another experiment: no comparison
    assert reference.series("03", "decode_batch", device="cpu", quick=True, folder=tmp_path) is None
    write(tmp_path, here, kind="cuda")
    assert reference.series("03", "decode_batch", device="cpu", quick=True, folder=tmp_path) is None


def test_a_reference_measured_on_a_busy_machine_is_left_out(tmp_path):
    here = setup.sizes("03", quick=True, device="cpu")
    for name, busy, value in (("a-busy.json", 134.0, 0.5), ("b-quiet.json", 0.9, 0.03)):
        data = {"machine": name, "date": "2026-11-30", "device_kind": "cpu",
                "load": {"other_processes_cpu_percent": busy},
                "modes": {"quick": {"03": {"sizes": here, "series": {"decode_batch": [[1, value]]}}}}}
        (tmp_path / name).write_text(json.dumps(data))
    reference._load.cache_clear()
    label, points = reference.series("03", "decode_batch", device="cpu", quick=True, folder=tmp_path)
    assert label.startswith("cpu: b-quiet.json") and points == [[1, 0.03]]
    every = reference.all_series("03", "decode_batch", quick=True, folder=tmp_path)
    assert [lab for lab, _ in every] == [label]


def test_shipped_references_are_complete():
    """Every file in reference_data says what, when and how busy, and its sizes are lessons'."""
    for ref in reference.references():
        for key in ("machine", "date", "device_kind", "cpu_flags", "versions", "load", "modes"):
            assert key in ref, f"{ref.get('machine')}: no {key!r}"
        for mode, lessons in ref["modes"].items():
            for lesson, entry in lessons.items():
                assert entry["sizes"]["model"] == setup.lesson_model(ref["device_kind"], mode == "quick")
                assert entry["series"], f"{ref['machine']} {mode} {lesson}: no series"


def test_preflight_names_what_to_fix(monkeypatch):
    monkeypatch.setattr(preflight, "NEEDS", {"torch": "2.4", "no-such-package-nanoserve": "1.0",
                                             "numpy": "999.0"})
    checks = {c.name: c for c in preflight.check_packages()}
    assert checks["torch"].status == "OK"
    assert checks["no-such-package-nanoserve"].status == "FAIL" and "pip install" in checks[
        "no-such-package-nanoserve"].fix
    assert checks["numpy"].status == "FAIL" and ">= 999.0" in checks["numpy"].fix
    assert preflight._version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert preflight.check_python().status == "OK"


def test_every_reference_is_named_in_one_wording():
    import re
    for ref in reference.references():
        got = reference.label(ref, "quick")
        wording = r"(cpu: .+ \(\d+ cores(; .+)?\)|cuda: .+), \d{4}-\d\d-\d\d, quick sizes"
        assert re.fullmatch(wording, got), got
