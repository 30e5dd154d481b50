"""benchmarks/llamacpp.py without llama.cpp: the bytes a GGUF's decode step reads (its floor), the
report's tables and ratios, the int8 configuration skipped when the LLM refuses the argument. With a
llama.cpp venv named by NANOSERVE_LLAMACPP_PYTHON (CI builds none: skipped), the driver's copies of
a tiny GGUF and its batch-1 timings."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, quants

from nanoserve import env
from nanoserve.measure.ceilings import DeviceCeilings

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LLAMACPP_PYTHON = env.get("NANOSERVE_LLAMACPP_PYTHON")


@pytest.fixture(scope="module")
def bench():
    path = os.path.join(ROOT, "benchmarks", "llamacpp.py")
    spec = importlib.util.spec_from_file_location("llamacpp_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_census_counts_each_type_and_the_bytes_of_the_tensors(bench, tmp_path):
    path = str(tmp_path / "two.gguf")
    w = GGUFWriter(path, "llama")
    weight = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", quants.quantize(weight, GGMLQuantizationType.Q8_0),
                 raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(96, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    c = bench.census(path)
    assert c["types"] == {"Q8_0": 1, "F32": 1}
    # Q8_0: 34 bytes per 32 values (a float16 scale and 32 int8); the metadata is not read per step
    assert c["tensor_bytes"] == 64 * 96 // 32 * 34 + 96 * 4
    assert c["file_bytes"] > c["tensor_bytes"]


def test_copies_are_named_after_their_type_and_the_source_keeps_its_own(bench):
    src = "/x/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert bench.copy_path(src, "Q4_1") == src
    assert bench.copy_path(src, "F16") == "/x/SmolLM2-135M-Instruct.F16.gguf"


def test_int8_is_skipped_with_the_reason_when_the_llm_refuses_the_argument(bench, monkeypatch):
    class Refusing:
        def __init__(self, *args, quantization=None, quantization_lm_head=False):
            if quantization:
                raise TypeError("LLM.__init__() got an unexpected keyword argument 'quantization'")

        def run(self, jobs):
            return [1.0 for _ in jobs]

    monkeypatch.setattr(bench, "NanoServe", Refusing)
    why = bench.nanoserve_system("folder", "bfloat16", "int8", False)
    assert isinstance(why, str) and "no quantization argument" in why
    assert bench.nanoserve_system("folder", "bfloat16", None, False).run([{}, {}]) == [1.0, 1.0]

    class Broken(Refusing):
        def __init__(self, *args, quantization=None, quantization_lm_head=False):
            raise TypeError("bad dtype")  # any other TypeError is a bug, not a skip

    monkeypatch.setattr(bench, "NanoServe", Broken)
    with pytest.raises(TypeError, match="bad dtype"):
        bench.nanoserve_system("folder", "bfloat16", "int8", False)


def test_nanoserve_system_builds_the_int8_lm_head_variant(bench):
    """The benchmark's own NanoServe, not a stand-in: the lm_head as codes beside int8 layers."""
    system = bench.NanoServe("preset:tiny", "float32", "main", 0.05, quantization="int8",
                             quantization_lm_head=True)
    model = system.llm.engine.model
    assert model.quant_config.method == "int8" and model.lm_head_quant is not None
    plain = bench.NanoServe("preset:tiny", "float32", "main", 0.05, quantization="int8")
    assert plain.llm.engine.model.lm_head_quant is None
    # the floor counts the head's codes: fewer bytes, so a shorter floor, than the fp32 head
    cfg = system.llm.engine.model_config
    ceilings = DeviceCeilings("cpu", "test", 1, "", "", False, 1e10, 1e10, {"float32": 1e15})
    both = [bench.roofline.roofline_time(bench.roofline.stored_step_cost(
        s.llm.engine.model, cfg, bench.roofline.decode_batch(1, 64)), ceilings, "float32")
        for s in (system, plain)]
    head = model.lm_head_quant
    head_bytes = cfg.vocab_size * cfg.hidden_size * 4 - head.qweight.nbytes - head.weight_scale.nbytes
    assert both[1] - both[0] == pytest.approx(head_bytes / 1e10)


def test_b1_runs_every_system_once_a_round_in_turn_and_keeps_each_rounds_ratio(bench, monkeypatch):
    """Rounds interleave the systems, the order reversed every other round, so a machine that
    slows down over the run slows each alike; the ratio is taken within each round."""
    order, prompts, sz = [], [], bench.B1["quick"]
    itls = {"llama.cpp Q8_0": [10e-3, 20e-3, 10e-3], "nanoserve bfloat16": [5e-3, 10e-3, 10e-3]}

    class Fake:
        system_info = "fake"

        def __init__(self, label):
            self.label, self.llm = label, type("L", (), {"engine": type("E", (), {"model": None})})

        def run(self, jobs):
            order.append(self.label)
            prompts.append(jobs[0]["prompts"][0])
            itl = itls[self.label][sum(o == self.label for o in order) - 1]
            return [0.01 + (sz["b1"][1] - 1) * itl if j["tag"] == "b1_n" else 0.01 for j in jobs]

    monkeypatch.setattr(bench, "LlamaCpp", lambda path, *a: Fake(f"llama.cpp {path}"))
    monkeypatch.setattr(bench, "nanoserve_system", lambda folder, dtype, *a: Fake(f"nanoserve {dtype}"))
    monkeypatch.setattr(bench.roofline, "stored_step_cost", lambda *a, **k: None)
    monkeypatch.setattr(bench.roofline, "roofline_time", lambda *a: 2e-3)
    args = type("A", (), dict(llamacpp_python="py", threads=2, dtypes="bfloat16", no_int8=True,
                              rounds=3, seed=0))
    report = {"b1": {}, "load": {}, "skipped": {}, "gguf": {"Q8_0": {"tensor_bytes": 1e8}}}
    ceilings = DeviceCeilings("cpu", "test", 1, "", "", False, 1e10, 1e10, {"float32": 1e15})
    bench.part_b1(args, sz, "folder", type("C", (), {"vocab_size": 100}), {"Q8_0": "Q8_0"},
                  ceilings, report)
    L, N = "llama.cpp Q8_0", "nanoserve bfloat16"
    assert order == [L, N, N, L, L, N]
    # the same prompts within a round, fresh ones each round (nanoserve's prefix cache keeps them)
    assert prompts[0] == prompts[1] and prompts[2] == prompts[3] and prompts[0] != prompts[2] != prompts[4]
    assert report["b1"][N]["b1_decode_rounds"] == pytest.approx([200, 100, 100])
    assert report["b1"][N]["b1_decode"] == pytest.approx(100)  # the median round
    assert report["b1"][L]["b1_decode"] == pytest.approx(100) and report["b1"][L]["floor_ms"] == 10
    # within each round: 2x, 2x, 1x; the medians' ratio (1.00x) would hide the faster rounds
    lines = bench.round_ratio_lines(report["b1"], [(N, L)])
    assert lines == [f"- {N} / {L}: median 2.00x over 3 rounds (1.00x to 2.00x)"]


def fake_report() -> dict:
    serve = dict(completed=48, failed=0, duration_s=10.0, total_tok_s=900.0, ttft_p50_ms=50.0,
                 itl_p50_ms=20.0, tpot_p50_ms=21.0, output_tokens_per_request=65.0, retokenized_output_p50=63,
                 prompt_tokens_per_request=128.0, errors=[])
    return {"date": "2026-12-02T01:00:00", "sizes_name": "full", "threads": 2, "concurrency": 16,
            "sizes": {"b1": (32, 128), "prefill": (128, 2048)}, "bandwidth_GB_s": 20.0,
            "serve_sizes": {"requests": 48, "input": 128, "output": 64},
            "machine": {"cpu": "AMD EPYC", "cores": 2, "avx512f": True, "avx512_bf16": True,
                        "amx_bf16": False},
            "versions": {"llama_cpp": "0.3.36", "torch": "2.13.0", "nanoserve": "abc"},
            "uptime": "load average: 5.0", "load": {"llama.cpp F16": 1.5},
            "gguf": {"F16": {"types": {"F16": 211, "F32": 61}, "tensor_bytes": 270e6}},
            "b1": {"llama.cpp F16": {"b1_decode": 40.0, "floor_ms": 13.5, "b1_floor_pct": 54.0,
                                     "prefill_128": 900.0, "prefill_2048": 500.0},
                   "nanoserve bfloat16": {"b1_decode": 80.0, "floor_ms": 13.6, "b1_floor_pct": 108.8,
                                          "prefill_128": 450.0, "prefill_2048": 250.0},
                   "nanoserve int8": {"b1_decode": 90.0, "floor_ms": math.nan}},
            "serve": {"nanoserve serve (bfloat16)": dict(serve, output_tok_s=600.0),
                      "llama_cpp.server (F16, one request at a time)": dict(serve, output_tok_s=200.0)},
            "skipped": {}, "errors": {"llama-server (F16, --parallel 16)": "RuntimeError: exited"}}


def test_the_report_has_both_tables_and_the_ratios_the_right_way_up(bench):
    md = bench.markdown(fake_report())
    assert "| llama.cpp F16 | 40 | 13.50 | 54 | 900 | 500 |" in md
    assert "| nanoserve bfloat16 | 80 | 13.60 | 109 | 450 | 250 |" in md
    assert "| nanoserve int8 | 90 | - | - | - | - |" in md  # no floor: its bytes are its own
    decode, prefill = md.split("Prefill 2048 tokens, nanoserve / llama.cpp:")
    assert "- nanoserve bfloat16 / llama.cpp F16: 2.00x" in decode
    assert "- nanoserve bfloat16 / llama.cpp F16: 0.50x" in prefill.split("GGUF files")[0]
    assert "nanoserve int8 / llama.cpp Q8_0" not in md  # no Q8_0 row, no ratio
    assert "- nanoserve serve (bfloat16) / llama_cpp.server (F16, one request at a time): 3.00x" in md
    assert "| 48/0 | 65, 63 | 128 |" in md and "211 F16, 61 F32" in md
    assert "- llama-server (F16, --parallel 16): RuntimeError: exited" in md
    assert "requests failed" not in md
    report = fake_report()
    report["serve"]["llama_cpp.server (F16, one request at a time)"].update(
        completed=3, failed=13, errors=["TimeoutError: "])
    assert ("- **llama_cpp.server (F16, one request at a time): 13 of 16 requests failed** "
            "(TimeoutError: )") in bench.markdown(report)


@pytest.mark.skipif(not LLAMACPP_PYTHON, reason="no llama.cpp venv (set NANOSERVE_LLAMACPP_PYTHON)")
def test_the_driver_copies_a_gguf_and_times_batch_1_jobs(bench, hf_models, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "model"))
    from gguf_files import train_tokenizer, write_llama_gguf
    model, _ = hf_models("llama")
    state = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
    src = write_llama_gguf(str(tmp_path / "tiny.F32.gguf"), state, model.config,
                           train_tokenizer(model.config.vocab_size), "F32")
    copies = bench.make_copies(src, ["F32", "Q8_0", "F16"], LLAMACPP_PYTHON)
    assert copies["F32"] == src
    assert bench.census(copies["Q8_0"])["types"].get("Q8_0", 0) >= 2 * 7  # every layer's matmuls
    assert bench.census(copies["F16"])["types"].get("F16", 0) >= 2 * 7
    jobs = [{"kind": "offline", "tag": t, "prompts": [[5, 6, 7, 8]], "max_tokens": n}
            for t, n in (("b1_n", 16), ("b1_1", 1))]
    times = bench.LlamaCpp(copies["Q8_0"], LLAMACPP_PYTHON, 2, 64).run(jobs)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_serve_throughput_counts_the_tokens_asked_for_not_the_chunks(bench):
    """A server without a usage chunk has its closing empty chunk counted as a token by the client
    (65 for 64); the figure is the 64 every request had to return, over the run's duration."""
    j = {"completed": 3, "failed": 1, "duration": 2.0, "output_throughput": 97.5,
         "total_output_tokens": 195, "total_input_tokens": 384, "median_ttft_ms": 10.0,
         "median_itl_ms": 5.0, "median_tpot_ms": 5.5,
         "generated_texts": ["a b", "a b c", "a b c d", ""], "errors": [None, None, None, "HTTP 500: x"]}

    class Words:
        def encode(self, text):
            return text.split()

    s = bench.serve_summary(j, 64, Words())
    assert s["output_tok_s"] == 3 * 64 / 2.0 and s["client_output_tok_s"] == 97.5
    assert s["output_tokens_per_request"] == 65 and s["retokenized_output_p50"] == 3
    assert s["errors"] == ["HTTP 500: x"]
