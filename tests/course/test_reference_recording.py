"""Reference data worth looking at: scripts/reference_results.py refuses to record while other
processes use the CPU (and names its files after the device), course.reference.all_series hands a
lesson every device recorded, labelled, and lesson 05's trade-off figure draws each of them."""

import importlib.util
import json
from pathlib import Path

import pytest

from nanoserve.course import reference, setup

ROOT = Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location("reference_results", ROOT / "scripts/reference_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(folder, name, kind, sizes, points):
    data = {"machine": name, "date": "2026-12-01", "device_kind": kind,
            "modes": {"quick": {"05": {"sizes": sizes, "series": {"budget": points}}}}}
    (folder / f"{kind}-{name}.json").write_text(json.dumps(data))
    reference._load.cache_clear()


def other_processes(monkeypatch, *readings):
    """Other processes that take readings[0] cores before the measurement, readings[1] during it."""
    from nanoserve.measure import machine_load
    values = iter(readings)

    class Fake:
        def cores(self):
            return next(values)
    monkeypatch.setattr(machine_load, "OtherProcesses", Fake)


def test_refuses_to_record_on_a_busy_machine(monkeypatch, tmp_path, capsys):
    rr = script()
    monkeypatch.setattr(reference, "DATA", tmp_path)
    other_processes(monkeypatch, 1.8)
    measured = []
    monkeypatch.setattr(rr, "measure", lambda lesson, quick: measured.append(lesson))
    assert rr.main(["--modes", "quick", "--lessons", "05", "--sample", "0"]) == 3
    assert "refusing to record: other processes took 180% CPU" in capsys.readouterr().err
    assert not measured and not list(tmp_path.iterdir())


def test_refuses_to_write_when_others_ran_during_the_measurement(monkeypatch, tmp_path, capsys):
    rr = script()
    monkeypatch.setattr(reference, "DATA", tmp_path)
    other_processes(monkeypatch, 0.02, 0.95)
    monkeypatch.setattr(rr, "measure", lambda lesson, quick: {"sizes": {}, "series": {}})
    assert rr.main(["--name", "box", "--modes", "quick", "--lessons", "05", "--sample", "0"]) == 3
    assert "not recorded: other processes took 95% CPU while measuring" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_idle_machine_records_a_device_labelled_file(monkeypatch, tmp_path):
    rr = script()
    monkeypatch.setattr(reference, "DATA", tmp_path)
    other_processes(monkeypatch, 0.01, 0.03)
    monkeypatch.setattr(rr, "measure", lambda lesson, quick: {"sizes": {"q": quick}, "series": {"s": [1]}})
    assert rr.main(["--name", "Test Box 2", "--lessons", "05", "--sample", "0"]) == 0
    (path,) = tmp_path.iterdir()
    assert path.name == "cpu-test-box-2.json"
    data = json.loads(path.read_text())
    assert set(data["modes"]) == {"quick", "full"} and data["load"]["other_processes_cpu_percent"] == 3.0


def test_all_series_labels_every_device(tmp_path):
    here = setup.sizes("05", quick=True)
    write(tmp_path, "laptop", "cpu", here, [["no chunking", 80.0, 40.0, 20.0]])
    write(tmp_path, "h200", "cuda", {**here, "long_prompt_len": 4096}, [["no chunking", 9.0, 4.0, 2.0]])
    got = reference.all_series("05", "budget", quick=True, folder=tmp_path)
    assert [label for label, _ in got] == ["cpu: laptop, 2026-12-01, quick sizes",
                                           "cuda: h200, 2026-12-01, quick sizes, its own sizes"]
    assert reference.all_series("05", "budget", quick=False, folder=tmp_path) == []


def test_the_tradeoff_figure_draws_each_device(tmp_path):
    pytest.importorskip("matplotlib")
    from nanoserve import LLM
    from nanoserve.course.scenarios import interference
    from nanoserve.course.widgets import plot_budget_tradeoff
    llm = LLM("preset:tiny", device="cpu", dtype="float32", seed=0)
    s = interference.interference_setup(llm, 2, 48, num_long=1, min_budget=32)
    runs = interference.interference_grid(llm, s, [32], progress=False)
    refs = [("cpu: a", [["no chunking", 50.0, 30.0, 10.0], ["chunked, 32 tok/step", 20.0, 10.0, 15.0]]),
            ("cuda: b", [["no chunking", 5.0, 3.0, 1.0]])]
    fig = plot_budget_tradeoff(runs, reference=refs)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "reference: cpu: a" in labels and "reference: cuda: b" in labels
    single = plot_budget_tradeoff(runs, reference=refs[0])
    assert "reference: cpu: a" in [t.get_text() for t in single.axes[0].get_legend().get_texts()]
