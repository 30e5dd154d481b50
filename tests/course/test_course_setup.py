"""nanoserve.course.setup: quick mode, sizes, loading, engines over a loaded model, tables."""

import math
from importlib import metadata

import pytest

from nanoserve.course import setup
from nanoserve.measure.figures import device_label
from nanoserve.measure.workload import greedy_params
from nanoserve.model import DEMO_MODEL_DIR


@pytest.fixture(scope="module")
def llm():
    return setup.load_llm("preset:tiny", device="cpu", dtype="float32")


def test_quick_mode_reads_the_environment(monkeypatch):
    for value, quick in (("1", True), ("true", True), ("0", False), ("", False), ("no", False)):
        monkeypatch.setenv("NANOSERVE_QUICK", value)
        assert setup.quick_mode() is quick
    monkeypatch.delenv("NANOSERVE_QUICK")
    assert setup.quick_mode() is False


def test_sizes_and_models():
    assert setup.lesson_model(quick=True) == "preset:tiny"
    assert setup.lesson_model("cpu", quick=False) == "preset:llama-120m"
    assert setup.lesson_model("cuda", quick=False) == "preset:llama-3.2-1b"
    for lesson in ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "11"):
        for quick, device in ((True, "cpu"), (False, "cpu"), (False, "cuda")):
            s = setup.sizes(lesson, quick, device)
            assert s["model"] == setup.lesson_model(device, quick)
    full, quick = setup.sizes("01", False, "cpu"), setup.sizes("01", True, "cpu")
    assert max(quick["lengths"]) <= max(full["lengths"])
    assert setup.sizes("10", True, "cpu")["model"] == DEMO_MODEL_DIR  # text in and out over HTTP
    assert setup.sizes("10", False, "cpu")["model"] == "preset:llama-120m"
    assert setup.sizes("12", True, "cpu")["model"] == "smollm2-135m"  # the real model: acceptance needs text
    assert setup.sizes("13", True, "cpu")["model"] == DEMO_MODEL_DIR  # a trained model: quality
    assert setup.sizes("13", False, "cpu")["quality_model"] == "smollm2-135m"
    with pytest.raises(ValueError, match="lesson '99'"):
        setup.sizes("99")
    assert setup.default_dtype("cpu") == "float32" and setup.default_dtype("cuda:0") == "bfloat16"


def test_installed_names_torch_and_the_device():
    rows = {r["what"]: r["value"] for r in setup.installed("cpu").rows}
    assert rows["torch"] == metadata.version("torch")
    assert rows["device"].startswith("cpu")
    assert rows["quick mode (NANOSERVE_QUICK)"] == "True"


def test_text_llm_loads_a_model_for_text():
    demo = setup.text_llm("cpu")
    assert demo.engine.model_name in ("demo-model", "preset:tiny")
    assert (demo.tokenizer is not None) == (demo.engine.model_name == "demo-model")


def test_fresh_engine_shares_the_model_not_the_state(llm):
    a = setup.fresh_engine(llm, max_num_batched_tokens=64, enable_prefix_caching=False)
    assert a.executor is llm.engine.executor and a.kv_manager is not llm.engine.kv_manager
    assert a.config.max_num_batched_tokens == 64 and not a.config.enable_prefix_caching
    small = setup.fresh_engine(llm, num_kv_blocks=8)
    assert small.num_kv_blocks == 8
    with pytest.raises(ValueError, match="exceeds"):
        setup.fresh_engine(llm, num_kv_blocks=llm.engine.num_kv_blocks + 1)
    with pytest.raises(ValueError, match="block_size"):
        setup.fresh_engine(llm, block_size=32)
    outs = setup.generate(a, [[11, 12, 13], [14, 15]], greedy_params(3))
    assert [len(o.token_ids) for o in outs] == [3, 3]
    assert "measured on" in device_label(a)


def test_table_as_text_and_html():
    t = setup.Table([{"a": 1.23456, "b": "x"}, {"a": math.nan}], "title", ".2f")
    text = repr(t)
    assert "title" in text and "1.23" in text and "–" in text and "nan" not in text
    assert "<table>" in t._repr_html_() and "<caption>title</caption>" in t._repr_html_()
    assert setup.slo_text({"ttft": 0.12, "tpot": 0.026}) == "ttft<=120ms,tpot<=26ms"


def test_shown_path_hides_where_the_checkout_and_home_are(monkeypatch, tmp_path):
    assert setup.shown_path(DEMO_MODEL_DIR) == "nanoserve/assets/demo-model"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert setup.shown_path(str(tmp_path / ".cache" / "hub" / "m")) == "~/.cache/hub/m"
    assert setup.shown_path("preset:tiny") == "preset:tiny"
    assert setup.shown_path("--num-kv-blocks") == "--num-kv-blocks"
    assert setup.shown_path("/opt/models/m") == "/opt/models/m"
