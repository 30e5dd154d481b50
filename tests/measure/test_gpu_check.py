"""benchmarks/gpu_check.py, the one prepared GPU run, end to end on CPU (--dry-run).

GPU time is scarce (one run, minutes), so the script must work the first time it meets a GPU:
here every section runs with tiny shapes on the reference kernels, and every section must
come back with figures that carry units, or with the reason it was skipped or failed.
"""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the script runs in a subprocess under a time limit: the C++ ops are built before
pytestmark = pytest.mark.usefixtures("cpu_ops")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(tmp_path, *args, timeout=600):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def check_shape(result, sections):
    assert result["date"] and "torch" in result["env"] and "gpu" in result["env"]
    assert list(result["sections"]) == sections, "every section is reported, in order"
    for name, sec in result["sections"].items():
        assert sec["status"] in ("ok", "skipped", "error"), name
        if sec["status"] == "ok":
            assert sec["figures"], f"{name}: ok without figures"
            for fig, v in sec["figures"].items():
                assert isinstance(v["value"], (int, float)), f"{name}.{fig}: {v}"
                assert isinstance(v["unit"], str) and v["unit"], f"{name}.{fig} has no unit"
        else:
            assert sec["reason"], f"{name}: {sec['status']} without a reason"


@pytest.mark.slow
def test_dry_run_reports_every_section_with_units(tmp_path):
    gc = load_script()
    result, stdout = run(tmp_path, "--dry-run")
    check_shape(result, gc.SECTIONS)
    secs = result["sections"]
    not_ok = {n: s.get("reason") for n, s in secs.items() if s["status"] != "ok"}
    # HF's continuous batching is a moving target across transformers versions: allowed to fail;
    # without triton (`make test-no-triton`) the section that calls the Triton kernels directly fails
    allowed = {"hf_continuous"} | ({"quant_linear"} if importlib.util.find_spec("triton") is None else set())
    assert set(not_ok) <= allowed, not_ok
    kt = secs["kernel_tests"]["figures"]
    assert kt["failed"]["value"] == kt["errors"]["value"] == 0
    # without triton (macOS, Windows: `make test-no-triton`) the Triton kernel tests skip
    assert kt["passed"]["value"] > 0 or importlib.util.find_spec("triton") is None
    assert secs["equivalence"]["figures"]["greedy_equal"]["value"] is True
    for variant in ("ngram", "draft"):  # speculation keeps greedy output: HF's, token for token
        assert secs["equivalence"]["figures"][f"llama_reference_{variant}_equal_sequences"]["value"] == 4
    assert result["summary"]["kv_blocks_fp8_over_bf16"]["value"] == 2.0
    for q in ("int8", "fp8", "fp8_w8a8"):
        assert secs[f"nanoserve_decode_8b_{q}"]["figures"]["prefill_48_TFLOPs"]["value"] > 0
    if importlib.util.find_spec("triton") is not None:
        assert secs["quant_linear"]["figures"]["48x64_int8_M70_dequant_us"]["value"] > 0
    for sec in ("nanoserve_decode", "nanoserve_eager_decode", "hf_decode"):
        assert secs[sec]["figures"]["decode_B1_tokens_per_s"]["value"] > 0
    for sec in ("nanoserve_offline", "nanoserve_eager_offline", "hf_offline_static"):
        assert secs[sec]["figures"]["offline_total_tokens_per_s"]["unit"].startswith("tokens/s")
    assert {"decode_B1_nanoserve_over_hf", "offline_graphs_over_eager"} <= set(result["summary"])
    lesson = secs["lesson_05"]["figures"]
    assert lesson["nochunk_decoder_itl_p99"]["value"] > 0 and lesson["lesson_seconds"]["value"] > 0
    assert len([f for f in lesson if f.endswith("_decoder_itl_p99")]) == 4, "no chunking and 3 budgets"
    assert secs["nanoserve_decode_8b"]["figures"]["decode_B1_GBps"]["value"] > 0
    mbu = result["summary"]["nanoserve_decode_B1_mbu"]
    assert 0 < mbu["value"] < 1.5 and "copy bandwidth" in mbu["unit"]
    assert 0 < result["summary"]["nanoserve_prefill_48_mfu"]["value"] < 1.5
    assert "prefill_48_flash_over_sdpa" in result["summary"]  # (the reference kernels on a CPU)
    assert secs["prefill_attention"]["figures"]["attn_64_sdpa_TFLOPs"]["value"] > 0
    for sec in ("hf_decode_static", "hf_decode_compiled"):
        assert secs[sec]["figures"]["decode_B1_tokens_per_s"]["value"] > 0
    # every lesson measured is written as reference data the lessons' figures read
    from nanoserve.course import reference
    folder = Path(result["lesson_reference_data"]).parent
    for lesson, key in [("00", "linear"), ("01", "prefill"), ("02", "cache"), ("03", "decode_batch"),
                        ("05", "budget")]:
        assert secs[f"lesson_{lesson}"]["figures"]["lesson_seconds"]["value"] > 0
        found = reference.series(lesson, key, device="cpu", quick=True, folder=folder)
        assert found is not None and len(found[1]) > 0, (lesson, key)
    for line in ("kernel_tests", "passed", "tokens/s", "GB/s", "TFLOP/s", "ms"):
        assert line in stdout, f"the printed table lacks {line!r}"


def test_a_spent_budget_skips_every_section_with_a_reason(tmp_path):
    gc = load_script()
    result, _ = run(tmp_path, "--dry-run", "--budget-s", "0", timeout=120)
    check_shape(result, gc.SECTIONS)
    assert all(s["status"] == "skipped" for s in result["sections"].values())


def test_a_folder_out_gets_the_dated_gpu_name(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    cmd = [sys.executable, str(SCRIPT), "--dry-run", "--budget-s", "0", "--out", str(out) + "/"]
    proc = subprocess.run(cmd,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (name,) = [p.name for p in out.iterdir()]
    assert name.startswith("gpu-") and name.endswith("-cpu-dry-run.json")


def test_the_quant_linear_section_fails_where_a_path_errs_after_timing_the_rest(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from types import SimpleNamespace

    import torch

    from nanoserve.kernels import triton_quant_linear as tq
    gc = load_script()
    tiled = tq.tiled
    monkeypatch.setattr(tq, "tiled", lambda *a, **kw: tiled(*a, **kw) * 1.05)  # 5% off: past the limit
    threads = torch.get_num_threads()  # a dry Ctx runs on one thread
    try:
        args = SimpleNamespace(dry_run=True, part=str(tmp_path / "part.json"), deadline=time.time() + 300)
        ctx = gc.Ctx(args)
        ctx.rec = ctx.part["quant_linear"] = {"figures": {}, "info": {}}
        with pytest.raises(AssertionError, match="worst W8A16 error"):
            gc.more.sec_quant_linear(ctx)
    finally:
        torch.set_num_threads(threads)
    figs = ctx.rec["figures"]
    assert figs["w8a16_worst_rel_err"]["value"] > gc.more.W8A16_ERR_LIMIT
    assert figs["40x96_fp8_M70_dequant_us"]["value"] > 0, "the paths after the wrong one are timed"


def test_decode_steps_without_a_graph_are_counted():
    from types import SimpleNamespace

    from nanoserve.engine.cuda_graphs import CudaGraphRunner
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_check_sections as more
    figs = {}
    ctx = SimpleNamespace(fig=lambda name, value, unit: figs.update({name: value}))
    graphs = object.__new__(CudaGraphRunner)  # what can_run reads: captured sizes 1 and 2
    graphs.enabled, graphs.sizes, graphs.max_blocks = True, [1, 2], 4
    decode = SimpleNamespace(is_decode=True, token_ids=[7], block_ids=[0])
    prefill = SimpleNamespace(is_decode=False, token_ids=[1, 2, 3], block_ids=[0])
    with more.eager_decode_steps(ctx):
        assert graphs.can_run([decode]) and graphs.can_run([decode, decode])
        assert not graphs.can_run([decode] * 3)  # past the largest graph: eager
        assert not graphs.can_run([prefill])  # not a decode step: not counted
    assert figs == {"decode_steps": 3, "eager_decode_steps": 1}
    assert CudaGraphRunner.can_run is not None and "counted" not in CudaGraphRunner.can_run.__name__
