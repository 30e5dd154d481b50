#!/usr/bin/env python3
"""One prepared GPU run: kernel tests, HF equivalence, ceilings, nanoserve vs HF benchmarks.

Sections, in order (each guarded: an error or a skip is recorded, and the run moves on):
  kernel_tests     pytest tests/kernels on CUDA (the C++ CPU ops' files left out): pass/fail counts
  equivalence      tiny random Llama and Qwen2 saved by transformers, fp32: nanoserve greedy (CUDA
                   graphs and eager, and with ngram and draft-model speculation) == HF generate, token
                   for token; bf16 logit errors as info
  ceilings         copy bandwidth (bytes read + written), matmul TFLOP/s (roofline.measure_ceilings)
  nanoserve_*      preset:qwen2.5-0.5b, bf16: decode B=1/8/32/128 (CUDA graphs of every size up to
                   max_num_seqs), prefill 128-8192 tokens (flash prefill kernel; *_sdpa: the reference
                   attention, SDPA, in its place), offline 256 requests (lengths uniform in 100-1024,
                   seed 0, EOS ignored); *_eager_*: the same with enforce_eager (no CUDA graphs)
  prefill_attention  attention alone at 128-8192 tokens: flash kernel, reference, plain SDPA (MFU)
  nanoserve_decode_8b  batch-1 and batch-8 decode on Llama-3-8B shapes (bf16, 16 GB of weights): the
                   bandwidth utilisation a decode step reaches when the weights, not the host, dominate;
                   and one 4096-token prefill (compute-bound)
  nanoserve_decode_8b_int8, _fp8, _fp8_w8a8  the same with 8-bit weights: int8 and fp8 (W8A16, the
                   Triton kernels by rows) and fp8 as W8A8 (NANOSERVE_FP8_W8A8=1: activations
                   quantized per token for the fp8 tensor cores, kernels/fp8_w8a8.py)
  quant_linear     each 8-bit linear path alone on 8B's shapes by the rows of x (gpu_check_sections.py)
  nanoserve_decode_kv_fp8  the sections' model with an fp8 KV cache: blocks in the same memory and
                   the decode sweep
  lesson_00..03, lesson_05  each lesson's experiment at its GPU size (Llama-3.2-1B shapes) through the
                   calls its cells make; their series are written as the lessons' GPU reference data,
                   reference_data/<gpu>.json beside the JSON (copy it to nanoserve/course/reference_data/)
  hf_*             HF transformers on the same weights: generate (decode, prefill, static batches
                   offline), with a static cache (hf_decode_static) and torch.compile on top
                   (hf_decode_compiled: the fair peer), continuous batching (hf_continuous)
More sections live in gpu_check_sections.py.
Achieved GB/s and TFLOP/s count the compulsory bytes and FLOPs of each step (measure/roofline.py's
step_cost); the summary divides them by the measured copy bandwidth and bf16 matmul peak (MBU, MFU)
and by the datasheet's HBM bandwidth.
Groups of sections run in child processes with time limits, so a hang or a broken CUDA context
costs one group; the JSON is rewritten as results come in, and late sections are skipped.

On a lent GPU (device tool `run`): the image's python3 already has torch, triton, transformers,
pytest, pytest-xdist and hypothesis, so nothing is installed or carried. About 9 minutes (the
first H200 run, 2026-11-30: 544 s; the machine started in about 30 s):

    run(command="export PYTHONUNBUFFERED=1; set -o pipefail; nvidia-smi -L; "
                "python3 benchmarks/gpu_check.py --budget-s 540 --out $OUT/ 2>&1 | tee $OUT/gpu_check.log",
        timeout_s=590)

then give_back unless a group failed: `--groups big,hf` reruns only those, by group name (the
machine stays warm for 30 s after a call); each group has its own time cap (GROUPS), and the
groups run in order of what matters most, so a spent budget skips the last (HF's offline and
continuous batching, which need more than their caps at these sizes: its generate took 70-93 ms a
step on the H200). Copy gpu-<date>-<gpu>.json and reference_data/ from files_at into
benchmarks/results/ and nanoserve/course/reference_data/. The run stays inside --budget-s plus at
most 20 s.
On a CPU (CI, tests/measure/test_gpu_check.py), every section end to end with tiny shapes:

    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_check_sections as more  # noqa: E402  (beside this file)

GROUPS = {  # child process -> (its time limit on a GPU, {its sections in order: least seconds to start one})
    "kernels": (150, {"kernel_tests": 30}),
    "check": (70, {"equivalence": 10, "ceilings": 5}),
    "nanoserve": (150, {"nanoserve_decode": 15, "nanoserve_prefill": 8, "nanoserve_prefill_sdpa": 8,
                        "nanoserve_offline": 25, "nanoserve_eager_decode": 15}),
    "attention": (30, {"prefill_attention": 10}),
    "quant_linear": (120, {"quant_linear": 30}),
    "big": (60, {"nanoserve_decode_8b": 40}),
    "big_int8": (60, {"nanoserve_decode_8b_int8": 40}),
    "big_fp8": (100, {"nanoserve_decode_8b_fp8": 40, "nanoserve_decode_8b_fp8_w8a8": 40}),
    "kv_fp8": (60, {"nanoserve_decode_kv_fp8": 20}),
    "lessons": (120, {"lesson_00": 10, "lesson_01": 20, "lesson_02": 15, "lesson_03": 30}),
    "lesson": (90, {"lesson_05": 30}),
    "hf": (110, {"hf_decode": 10, "hf_decode_static": 15, "hf_prefill": 8, "hf_decode_compiled": 50}),
    "hf_offline": (60, {"nanoserve_eager_offline": 30, "hf_offline_static": 25}),
    "hf_cb": (90, {"hf_continuous": 30}),
}
SECTIONS = [s for _, needs in GROUPS.values() for s in needs]
SHAPES = {
    "gpu": dict(model="preset:qwen2.5-0.5b", dtype="bfloat16", decode_batches=[1, 8, 32, 128],
                decode_steps=64, prompt_len=128, prefill_lens=[128, 512, 2048, 8192], reps=3,
                attn_lens=[128, 256, 512, 1024, 2048, 4096, 8192],
                n_requests=256, len_range=(100, 1024), hf_batch=256, kv_bytes=16 << 30, max_seqs=256,
                max_batched=8192, max_model_len=8448, graph_sizes=None),  # None: vLLM's list (all)
    "dry": dict(model="preset:tiny", dtype="bfloat16", decode_batches=[1, 4], decode_steps=4, prompt_len=16,
                prefill_lens=[16, 48], attn_lens=[16, 64], reps=2, n_requests=6, len_range=(4, 16),
                hf_batch=4,
                kv_bytes=64 << 20, max_seqs=16, max_batched=256, max_model_len=512, graph_sizes=[1, 2, 4],
                kernel_k="constant_vector or known_angles"),  # Triton's interpreter: a small subset
}
BIG = {"gpu": dict(model="preset:llama-3-8b", decode_batches=[1, 8], kv_bytes=8 << 30, prefill_len=4096),
       "dry": dict(model="preset:tiny", decode_batches=[1, 2], kv_bytes=16 << 20, prefill_len=48)}
# HBM bandwidth on NVIDIA's datasheets (bytes/s), matched by a substring of the GPU's name
HBM_DATASHEET = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "A100-SXM4-80GB": 2.039e12}


def write_json(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


# ------------------------------------------------------------------ child process: the sections

class Ctx:
    """What sections share: shapes, device, deadline, cached models, and the figures recorded."""

    def __init__(self, args):
        import torch
        self.torch, self.args, self.dry = torch, args, args.dry_run
        if self.dry:  # tiny shapes: a second OpenMP thread only waits, and on a busy CPU far longer
            torch.set_num_threads(1)
        self.S, self.dev = SHAPES["dry" if self.dry else "gpu"], "cpu" if self.dry else "cuda"
        self.tmp = tempfile.mkdtemp(prefix="gpu_check_")
        self.part, self.rec, self.cache = {}, None, {}

    def fig(self, name: str, value, unit: str) -> None:
        value = value if isinstance(value, bool) else float(f"{float(value):.6g}")
        self.rec["figures"][name] = {"value": value, "unit": unit}
        self.save()

    def info(self, **kw) -> None:
        self.rec["info"].update(kw)
        self.save()

    def save(self) -> None:
        write_json(self.args.part, self.part)

    def left(self) -> float:
        return self.args.deadline - time.time()

    def sync(self) -> None:
        if self.dev == "cuda":
            self.torch.cuda.synchronize()

    def timed(self, fn) -> float:
        """Seconds fn() takes, device work included."""
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t

    def free(self, *keys) -> None:
        import gc
        for k in keys:
            self.cache.pop(k, None)
        gc.collect()
        if self.dev == "cuda":
            self.torch.cuda.empty_cache()

    def config(self, model: str | None = None):
        """The ModelConfig of a preset (default: the sections' model)."""
        from nanoserve.model import preset_config
        return preset_config((model or self.S["model"]).split(":", 1)[1])

    def decode_context(self) -> int:
        """The context of a decode sweep's median step: the prompt plus half the steps."""
        return self.S["prompt_len"] + self.S["decode_steps"] // 2

    def prompts(self, n: int, length: int, seed: int, model: str | None = None) -> list[list[int]]:
        vocab, rng = self.config(model).vocab_size, random.Random(seed)
        return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]

    def workload(self) -> list[tuple[list[int], int]]:
        """(prompt, output length) per request: both lengths uniform in len_range, seed 0."""
        rng, (lo, hi) = random.Random(0), self.S["len_range"]
        return [(self.prompts(1, rng.randint(lo, hi), rng.randrange(2**31))[0], rng.randint(lo, hi))
                for _ in range(self.S["n_requests"])]

    def engine_config(self, **fields):
        """The sections' engine configuration, some fields changed."""
        from nanoserve import EngineConfig
        S = self.S
        return EngineConfig(**{**dict(block_size=16, kv_cache_memory=S["kv_bytes"],
                                      max_num_seqs=S["max_seqs"], max_num_batched_tokens=S["max_batched"],
                                      max_model_len=S["max_model_len"], enable_prefix_caching=False,
                                      cuda_graph_batch_sizes=S["graph_sizes"]), **fields})

    def llm(self, eager: bool):
        if ("llm", eager) not in self.cache:
            from nanoserve import LLM
            self.free(("llm", not eager))
            self.cache["llm", eager] = LLM(self.S["model"], device=self.dev, dtype=self.S["dtype"], seed=0,
                                           config=self.engine_config(enforce_eager=eager))
        return self.cache["llm", eager]

    def hf(self):
        """HF transformers holding nanoserve's preset weights (written by save_hf_checkpoint)."""
        if "hf" not in self.cache:
            from transformers import AutoModelForCausalLM

            from nanoserve.model import load_model, save_hf_checkpoint
            folder = os.path.join(self.tmp, "hf-preset")
            save_hf_checkpoint(load_model(self.S["model"], "cpu", self.S["dtype"], seed=0)[0], folder)
            self.cache["hf"] = AutoModelForCausalLM.from_pretrained(
                folder, dtype=getattr(self.torch, self.S["dtype"]), attn_implementation="sdpa")
            self.cache["hf"].to(self.dev).eval()
        return self.cache["hf"]


def sec_kernel_tests(ctx):
    import xml.etree.ElementTree as ET
    xml = os.path.join(ctx.tmp, "k.xml")
    cmd = [sys.executable, "-m", "pytest", "tests/kernels", "-q", "-p", "no:cacheprovider", "--junitxml", xml]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    if ctx.dry:
        cmd += ["-k", ctx.S["kernel_k"]]
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    else:  # the C++ CPU ops are not what a GPU run checks, and their build takes a minute
        cmd += ["--ignore-glob", "tests/kernels/test_cpu_*"]
        if importlib.util.find_spec("xdist"):  # Triton compiles dominate: spread them over CPU cores
            cmd += ["-n", "4"]
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=max(9, ctx.left() - 3))
    except subprocess.TimeoutExpired as e:
        ctx.info(output_tail=(e.stdout or b"").decode(errors="replace")[-3000:])
        raise
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    for name, value in [("passed", n["tests"] - n["failures"] - n["errors"] - n["skipped"]),
                        ("failed", n["failures"]), ("errors", n["errors"]), ("skipped", n["skipped"])]:
        ctx.fig(name, value, "tests")
    bad = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
           if c.find("failure") is not None or c.find("error") is not None]
    ctx.info(returncode=p.returncode, failing=bad[:30],
             output_tail=(p.stdout + p.stderr).decode(errors="replace")[-3000:])


def tiny_hf_model(arch: str, folder: str):
    import torch
    import transformers
    cls = {"llama": "Llama", "qwen2": "Qwen2"}[arch]
    cfg = getattr(transformers, f"{cls}Config")(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=None, bos_token_id=None,
        tie_word_embeddings=arch == "qwen2")
    torch.manual_seed(0)
    model = getattr(transformers, f"{cls}ForCausalLM")(cfg).eval()
    with torch.no_grad():  # HF initialises norms and biases trivially: randomise them
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def nanoserve_logits(llm, tokens: list[int]):
    """Logits at every position of one prompt prefilled in one pass. -> (len, vocab) fp32."""
    import torch

    from nanoserve import SamplingParams
    from nanoserve.engine.request import Request
    from nanoserve.engine.scheduler import ScheduledSeq
    runner, kv, params = llm.engine.executor, llm.engine.kv_manager, SamplingParams(max_tokens=1)
    req = Request("probe", tokens, params, 0.0, 10**6)
    assert kv.allocate_slots(req, len(tokens))
    ids, pos, attn, _ = runner.prepare([ScheduledSeq("probe", tokens, 0, kv.block_ids("probe"), True, params,
                                                     False)])
    with torch.inference_mode():
        logits = runner.model.compute_logits(runner.model(ids, pos, runner.kv_caches, attn)).float()
    kv.free(req)
    return logits


def sec_equivalence(ctx):
    import torch

    from nanoserve import LLM, EngineConfig, SamplingParams
    dev, n_new, all_equal = ctx.dev, 12 if ctx.dry else 32, True
    prompts = [[5, 9, 2], list(range(20, 120)), [300, 1, 7, 7, 7, 42, 8, 100, 99], [11]]  # 100: chunked
    variants = [("graphs", False), ("eager", True)] if dev == "cuda" else [("reference", True)]
    for arch in ("llama", "qwen2"):
        folder = os.path.join(ctx.tmp, f"tiny-{arch}")
        hf = tiny_hf_model(arch, folder).to(dev)
        with torch.no_grad():
            refs = [hf.generate(torch.tensor([p], device=dev), max_new_tokens=n_new, min_new_tokens=n_new,
                                do_sample=False)[0, len(p):].tolist() for p in prompts]
        # speculation's verify steps run eagerly beside graph-replayed decode steps; the draft
        # model is the target itself, so its every draft is accepted and every verify step is full
        speculation = [("ngram", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                  "prompt_lookup_min": 1}),
                       ("draft", {"method": "draft_model", "model": folder, "num_speculative_tokens": 3})]
        for name, eager, spec in [(n, e, None) for n, e in variants] + [
                (f"{variants[0][0]}_{n}", variants[0][1], c) for n, c in speculation]:
            llm = LLM(folder, device=dev, dtype="float32", speculative_config=spec, config=EngineConfig(
                block_size=8, num_kv_blocks=256, max_num_seqs=8, max_num_batched_tokens=64,
                cuda_graph_batch_sizes=[1, 2, 4, 8], enforce_eager=eager))
            outs = llm.generate(prompts, SamplingParams(max_tokens=n_new, temperature=0.0))
            got = [o.token_ids for o in outs]
            equal = sum(g == r for g, r in zip(got, refs))
            all_equal &= equal == len(prompts)
            ctx.fig(f"{arch}_{name}_equal_sequences", equal, f"of {len(prompts)} sequences")
            ctx.fig(f"{arch}_{name}_matching_tokens",
                    sum(a == b for g, r in zip(got, refs) for a, b in zip(g, r)) / (n_new * len(prompts)),
                    "fraction")
            if equal < len(prompts):
                ctx.info(**{f"{arch}_{name}_mismatch": [(g, r) for g, r in zip(got, refs) if g != r][:2]})
        if arch == "llama":  # bf16 logits, as info: nanoserve and HF each against HF fp32
            toks = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(1)).tolist()
            with torch.no_grad():
                ref = hf(torch.tensor([toks], device=dev)).logits[0].float()
                hf16 = hf.to(torch.bfloat16)(torch.tensor([toks], device=dev)).logits[0].float()
            ours = nanoserve_logits(LLM(folder, device=dev, dtype="bfloat16", config=EngineConfig(
                block_size=8, num_kv_blocks=64, enforce_eager=True)), toks)
            rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
            ctx.fig("bf16_logits_rel_err_nanoserve", rel(ours, ref), "max|err| / max|fp32 logit|")
            ctx.fig("bf16_logits_rel_err_hf", rel(hf16, ref), "max|err| / max|fp32 logit|")
            agree = (ours.argmax(-1) == hf16.argmax(-1)).float().mean()
            ctx.fig("bf16_argmax_agreement_nanoserve_vs_hf", agree, "fraction")
    ctx.fig("greedy_equal", all_equal, "bool")


def sec_ceilings(ctx):
    import torch
    try:
        from nanoserve.measure.roofline import measure_ceilings
        c = measure_ceilings(ctx.dev, dtypes=("float32", "bfloat16"), quick=ctx.dry)
        ctx.fig("copy_bandwidth", c.copy_bandwidth / 1e9, "GB/s (read + written)")
        ctx.fig("weight_read_bandwidth_fp32_b1", c.weight_read_bandwidth / 1e9, "GB/s")
        for dt, flops in c.peak_flops.items():
            ctx.fig(f"matmul_{dt}", flops / 1e12, "TFLOP/s")
        return ctx.info(source="nanoserve.measure.roofline.measure_ceilings", device_name=c.device_name)
    except Exception as e:  # roofline.py changed under us: measure here
        ctx.info(roofline_error=f"{type(e).__name__}: {e}", source="fallback: 10 ops in a row, median of 5")
    n, m = (64 << 20, 512) if ctx.dry else (1 << 30, 8192)
    src, a, b = (torch.rand(n // 4, device=ctx.dev),
                 *(torch.randn(m, m, device=ctx.dev, dtype=torch.bfloat16) for _ in range(2)))
    dst = torch.empty_like(src)
    copy_unit = "GB/s (read + written)"
    for name, fn, work, unit in [("copy_bandwidth", lambda: dst.copy_(src), 2 * n / 1e9, copy_unit),
                                 ("matmul_bfloat16", lambda: a @ b, 2 * m**3 / 1e12, "TFLOP/s")]:
        times = [ctx.timed(lambda: [fn() for _ in range(10)]) for _ in range(6)][1:]
        ctx.fig(name, 10 * work / statistics.median(times), unit)


def step_cost(ctx, batch, model: str | None = None, weight_bytes: float | None = None,
              kv_dtype_bytes: int | None = None):
    """Compulsory FLOPs and bytes of one step of `model` (default: the sections' model);
    weight_bytes: per weight of the linears, where they are quantized; kv_dtype_bytes: per KV
    value, where the cache is fp8."""
    from nanoserve.measure.roofline import dtype_bytes, step_cost
    return step_cost(ctx.config(model), batch, dtype_bytes(ctx.S["dtype"]), kv_dtype_bytes=kv_dtype_bytes,
                     weight_dtype_bytes=weight_bytes)


def decode_sweep(ctx, step_times, note: str, batches=None, model: str | None = None,
                 weight_bytes: float | None = None, kv_dtype_bytes: int | None = None):
    """step_times(prompts, n_tokens) -> seconds of each full-batch decode step; figures per batch,
    with the compulsory bytes per step over the step's time (GB/s)."""
    from nanoserve.measure.roofline import decode_batch
    S, context, batches = ctx.S, ctx.decode_context(), batches or ctx.S["decode_batches"]
    ctx.info(prompt_len=S["prompt_len"], decode_steps=S["decode_steps"], timing=note)
    step_times(ctx.prompts(2, S["prompt_len"], 99, model), 4)  # warm-up
    for B in batches:
        if ctx.left() < 10:
            return ctx.info(skipped_batches=[b for b in batches if b >= B])
        steps = step_times(ctx.prompts(B, S["prompt_len"], B, model), S["decode_steps"] + 3)
        itl = statistics.median(steps[2:] or steps)
        ctx.fig(f"decode_B{B}_tokens_per_s", B / itl, "tokens/s")
        ctx.fig(f"decode_B{B}_itl", itl * 1e3, "ms")
        cost = step_cost(ctx, decode_batch(B, context), model, weight_bytes, kv_dtype_bytes)
        ctx.fig(f"decode_B{B}_GBps", cost.total_bytes / itl / 1e9, "GB/s (compulsory bytes / step time)")


def prefill_sweep(ctx, run_one, note: str, lens=None, model: str | None = None,
                  weight_bytes: float | None = None):
    """run_one(prompt) answers one prompt with one token: median wall time over fresh prompts, at
    each of `lens` (default: the sections' prefill lengths) of `model`'s vocabulary."""
    from nanoserve.measure.roofline import prefill_batch
    ctx.info(**{"timing" if lens is None else "prefill_timing": note})  # beside a decode sweep's note
    for P in lens or ctx.S["prefill_lens"]:
        times = [ctx.timed(lambda: run_one(p)) for p in ctx.prompts(ctx.S["reps"] + 1, P, P, model)][1:]
        t = statistics.median(times)
        ctx.fig(f"prefill_{P}_time", t * 1e3, "ms")
        ctx.fig(f"prefill_{P}_tokens_per_s", P / t, "tokens/s")
        ctx.fig(f"prefill_{P}_TFLOPs", step_cost(ctx, prefill_batch(P), model, weight_bytes).total_flops / t
                / 1e12, "TFLOP/s (useful FLOPs / time)")


def throughput(ctx, seconds: float, reqs, n_out: int, **info) -> None:
    n_in = sum(len(p) for p, _ in reqs)
    ctx.fig("offline_time", seconds, "s")
    ctx.fig("offline_requests_per_s", len(reqs) / seconds, "requests/s")
    ctx.fig("offline_output_tokens_per_s", n_out / seconds, "tokens/s")
    ctx.fig("offline_total_tokens_per_s", (n_in + n_out) / seconds, "tokens/s (input + output)")
    ctx.info(requests=len(reqs), input_tokens=n_in, output_tokens=n_out, **info)


def nanoserve_decode(ctx, eager: bool, llm=None, batches=None, model: str | None = None,
                     weight_bytes: float | None = None, kv_dtype_bytes: int | None = None):
    from nanoserve import SamplingParams
    llm, batches = llm or ctx.llm(eager), batches or ctx.S["decode_batches"]
    if model is None:
        ctx.fig("num_kv_blocks", llm.engine.num_kv_blocks, f"blocks in {ctx.S['kv_bytes'] >> 20} MiB")

    def step_times(prompts, n):
        llm.engine.trace.clear()
        llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        return [r.duration for r in llm.engine.trace if r.num_prefill_tokens == 0
                and r.num_decode_tokens == len(prompts)]
    graphs = llm.engine.executor.graphs
    ctx.info(cuda_graphs=bool(graphs is not None and graphs.enabled))
    decode_sweep(ctx, step_times, "median wall time of an engine step decoding the whole batch",
                 batches, model, weight_bytes, kv_dtype_bytes)
    if graphs is not None and graphs.enabled:
        graph_replay(ctx, graphs, batches, model, weight_bytes, kv_dtype_bytes)


def graph_replay(ctx, graphs, batches, model: str | None, weight_bytes: float | None = None,
                 kv_dtype_bytes: int | None = None) -> None:
    """GPU time of the captured decode forward alone (no lm_head, sampling or host work): what
    the step would take if the engine's Python cost were zero. The buffers hold the last step's
    inputs, whose blocks are free by now, so replaying writes only to unused KV slots."""
    from nanoserve.measure.roofline import decode_batch
    for B in batches:
        if B not in graphs.graphs or ctx.left() < 5:
            continue
        graph = graphs.graphs[B]
        graph.replay()
        t = statistics.median(ctx.timed(lambda: [graph.replay() for _ in range(20)]) / 20 for _ in range(5))
        cost = step_cost(ctx, decode_batch(B, ctx.decode_context()), model, weight_bytes, kv_dtype_bytes)
        ctx.fig(f"decode_B{B}_graph_replay", t * 1e3, "ms (model forward, no lm_head)")
        ctx.fig(f"decode_B{B}_graph_replay_GBps", (cost.total_bytes - cost.bytes["lm_head"]) / t / 1e9,
                "GB/s (compulsory bytes without lm_head / replay time)")


def sec_nanoserve_decode_8b(ctx, quantization: str | None = None, w8a8: bool = False):
    """Decode on the largest preset: a step reads 16 GB, so the GPU, not the host, sets its time.
    Then one long prompt's prefill, where the matmuls' rate sets it. w8a8: fp8 codes quantize the
    activations too, where the card has fp8 tensor cores (NANOSERVE_FP8_W8A8)."""
    from unittest import mock

    from nanoserve import LLM, EngineConfig, SamplingParams
    from nanoserve.measure.roofline import quantized_weight_bytes
    big = BIG["dry" if ctx.dry else "gpu"]
    top, P = max(big["decode_batches"]), big["prefill_len"]
    cfg = EngineConfig(block_size=16, kv_cache_memory=big["kv_bytes"], max_num_seqs=top,
                       max_num_batched_tokens=max(ctx.S["prompt_len"] * top, P),
                       max_model_len=max(2048, P + 16), enable_prefix_caching=False,
                       cuda_graph_batch_sizes=big["decode_batches"])
    t = time.perf_counter()
    with mock.patch.dict(os.environ, {"NANOSERVE_FP8_W8A8": "1" if w8a8 else "0"}):  # read at load
        llm = LLM(big["model"], device=ctx.dev, dtype=ctx.S["dtype"], seed=0, config=cfg,
                  quantization=quantization)
    mods = [m for m in llm.engine.model.modules() if hasattr(m, "qweight")]
    ctx.info(model=big["model"], quantization=quantization, load_s=round(time.perf_counter() - t, 2),
             linears=sorted({type(m).__name__ for m in mods}),
             w8a8_linears=sum(bool(getattr(m, "w8a8", False)) for m in mods))
    weight_bytes = quantized_weight_bytes(llm.engine.model)
    nanoserve_decode(ctx, False, llm, big["decode_batches"], big["model"], weight_bytes)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prefill_sweep(ctx, lambda p: llm.generate([p], one), "generate(one prompt, max_tokens=1): TTFT, median",
                  [P], big["model"], weight_bytes)


def sec_nanoserve_decode_kv_fp8(ctx):
    """The sections' model with an fp8 KV cache: the same KV memory holds twice bf16's blocks; the
    decode sweep says what reading one byte a value (and dequantizing it in the tile) costs."""
    from nanoserve import LLM
    llm = LLM(ctx.S["model"], device=ctx.dev, dtype=ctx.S["dtype"], seed=0,
              config=ctx.engine_config(kv_cache_dtype="fp8"))
    nanoserve_decode(ctx, False, llm, kv_dtype_bytes=1)


def sec_lesson_05(ctx):
    """Lesson 05's cells, minus the figures and widgets, at the sizes it picks on this device."""
    from nanoserve.course import scenarios, setup
    t = time.perf_counter()
    sizes = setup.sizes("05", quick=ctx.dry, device=ctx.dev)
    llm = setup.load_llm(sizes["model"], device=ctx.dev)
    su = scenarios.interference_setup(llm, sizes["num_decoders"], sizes["long_prompt_len"], sizes["num_long"],
                                      min_budget=min(sizes["budgets"]))
    ctx.info(sizes=sizes, setup=su.describe(), load_and_probe_s=round(time.perf_counter() - t, 2))
    with more.eager_decode_steps(ctx):
        runs = scenarios.interference_grid(llm, su, sizes["budgets"], progress=False)
    rows = []
    for r in runs:
        row = r.summary()
        rows.append(row)
        key = "nochunk" if r.budget is None else f"budget{r.budget}"
        ctx.fig(f"{key}_decoder_itl_p50", row["decoder ITL p50 (ms)"], "ms")
        ctx.fig(f"{key}_decoder_itl_p99", row["decoder ITL p99 (ms)"], "ms")
        ctx.fig(f"{key}_long_ttft_median", row["long TTFT median (ms)"], "ms")
    ctx.info(table=rows)
    more.lesson_05_reference(ctx, sizes, runs)
    ctx.fig("lesson_seconds", time.perf_counter() - t, "s (load, probes and every run)")


def nanoserve_offline(ctx, eager: bool):
    from nanoserve import SamplingParams
    llm, reqs = ctx.llm(eager), ctx.workload()
    params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for _, o in reqs]
    llm.engine.trace.clear()
    before, outs = llm.engine.stats, []  # a snapshot
    dt = ctx.timed(lambda: outs.extend(llm.generate([p for p, _ in reqs], params)))
    after = llm.engine.stats
    n_out = sum(len(o.token_ids) for o in outs)
    assert n_out == sum(o for _, o in reqs), "an output is shorter than asked for (EOS is ignored)"
    throughput(ctx, dt, reqs, n_out, steps=after.steps - before.steps,
               preemptions=after.preemptions - before.preemptions)


def sec_nanoserve_prefill(ctx):
    from nanoserve import SamplingParams
    llm, one = ctx.llm(False), SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prefill_sweep(ctx, lambda p: llm.generate([p], one), "generate(one prompt, max_tokens=1): TTFT, median")


def sec_hf_decode(ctx):
    step_times = more.hf_step_timer(ctx, ctx.hf())
    decode_sweep(ctx, step_times, "median time between generate steps (logits-processor stamps)")


def sec_hf_prefill(ctx):
    import torch
    hf = ctx.hf()
    with torch.no_grad():
        prefill_sweep(ctx, lambda p: hf.generate(torch.tensor([p], device=ctx.dev), max_new_tokens=1,
                                                 do_sample=False, pad_token_id=0),
                      "generate(one prompt, max_new_tokens=1): TTFT, median")


def sec_hf_offline_static(ctx):
    import torch
    hf, reqs, bs = ctx.hf(), ctx.workload(), ctx.S["hf_batch"]

    def run():  # arrival order; left-padded; each batch runs until its longest output is done
        for i in range(0, len(reqs), bs):
            batch = reqs[i:i + bs]
            L, n = max(len(p) for p, _ in batch), max(o for _, o in batch)
            ids = torch.tensor([[0] * (L - len(p)) + p for p, _ in batch], device=ctx.dev)
            mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p, _ in batch], device=ctx.dev)
            hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        pad_token_id=0)
    with torch.no_grad():
        dt = ctx.timed(run)
    throughput(ctx, dt, reqs, sum(o for _, o in reqs), batch_size=bs,
               note="output tokens: each request's own length (tokens past it are waste)")


def sec_hf_continuous(ctx):
    import torch
    from transformers import GenerationConfig
    hf, reqs, done = ctx.hf(), ctx.workload(), {}
    gc = GenerationConfig(do_sample=False, max_new_tokens=max(o for _, o in reqs), pad_token_id=0)
    try:
        from transformers import ContinuousBatchingConfig
        small = dict(num_blocks=16, max_batch_tokens=256) if ctx.dry else {}  # its static tensors, on CPU
        cbc = ContinuousBatchingConfig(max_requests_per_batch=min(len(reqs), ctx.S["max_seqs"]), **small)
    except (ImportError, TypeError):
        cbc = None
    t0 = time.perf_counter()
    with torch.no_grad(), hf.continuous_batching_context_manager(  # its warm-up captures CUDA graphs
            generation_config=gc, continuous_batching_config=cbc, block=True, timeout=10,
            warmup=not ctx.dry) as manager:
        t = time.perf_counter()
        ctx.info(warmup_s=round(t - t0, 2))
        for i, (p, o) in enumerate(reqs):
            manager.add_request(p, request_id=f"r{i}", max_new_tokens=o)
        while len(done) < len(reqs):
            if ctx.left() < 3:
                raise TimeoutError(f"{len(done)}/{len(reqs)} requests had finished when time ran out")
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                done[r.request_id] = r
            elif r is None and not manager.is_running():
                raise RuntimeError(f"its generation thread stopped; {len(done)}/{len(reqs)} finished")
        dt = time.perf_counter() - t
    throughput(ctx, dt, reqs, sum(len(r.generated_tokens) for r in done.values()),
               failed=sum(r.error is not None for r in done.values()))


SECTION_FNS = {
    "kernel_tests": sec_kernel_tests, "equivalence": sec_equivalence, "ceilings": sec_ceilings,
    "nanoserve_decode": lambda c: nanoserve_decode(c, False), "nanoserve_prefill": sec_nanoserve_prefill,
    "nanoserve_offline": lambda c: nanoserve_offline(c, False),
    "nanoserve_eager_decode": lambda c: nanoserve_decode(c, True),
    "nanoserve_eager_offline": lambda c: nanoserve_offline(c, True), "lesson_05": sec_lesson_05,
    "nanoserve_decode_8b": sec_nanoserve_decode_8b, "hf_decode": sec_hf_decode,
    # int8 weights (W8A16, triton_quant_linear's kernel on a GPU): half the linears' bytes a step
    "nanoserve_decode_8b_int8": lambda c: sec_nanoserve_decode_8b(c, "int8"),
    "nanoserve_decode_8b_fp8": lambda c: sec_nanoserve_decode_8b(c, "fp8"),
    "nanoserve_decode_8b_fp8_w8a8": lambda c: sec_nanoserve_decode_8b(c, "fp8", w8a8=True),
    "nanoserve_decode_kv_fp8": sec_nanoserve_decode_kv_fp8,
    "nanoserve_prefill_sdpa": lambda c: more.sec_nanoserve_prefill_sdpa(c, prefill_sweep),
    "prefill_attention": more.sec_prefill_attention, "quant_linear": more.sec_quant_linear,
    **{f"lesson_{n}": (lambda c, n=n: more.sec_lesson(c, n)) for n in ("00", "01", "02", "03")},
    "hf_decode_static": lambda c: more.sec_hf_decode_static(c, decode_sweep, compiled=False),
    "hf_decode_compiled": lambda c: more.sec_hf_decode_static(c, decode_sweep, compiled=True),
    "hf_prefill": sec_hf_prefill, "hf_offline_static": sec_hf_offline_static,
    "hf_continuous": sec_hf_continuous,
}


def run_child(args) -> int:
    ctx = Ctx(args)
    for name, need in GROUPS[args.child][1].items():
        ctx.rec = ctx.part[name] = {"status": "running", "reason": None, "figures": {}, "info": {}}
        need = 1 if ctx.dry else need
        if ctx.left() < need:
            ctx.rec.update(status="skipped", reason=f"time budget: {ctx.left():.0f} s left, needs ~{need} s")
            ctx.save()
            continue
        print(f"[gpu_check] {name} ...", flush=True)
        t = time.time()
        try:
            SECTION_FNS[name](ctx)
            ok = bool(ctx.rec["figures"])
            ctx.rec.update(status="ok" if ok else "error", reason=None if ok else "no figures recorded")
        except Exception as e:
            ctx.rec.update(status="error", reason=f"{type(e).__name__}: {e}"[:600],
                           traceback=traceback.format_exc()[-2500:])
        ctx.rec["seconds"] = round(time.time() - t, 2)
        print(f"[gpu_check] {name}: {ctx.rec['status']} in {ctx.rec['seconds']} s", flush=True)
        try:  # a broken CUDA context fails here too: note it and go on
            if ctx.dev == "cuda" and ctx.torch.cuda.is_initialized():
                peak = ctx.torch.cuda.max_memory_allocated() / 2**30
                ctx.rec["info"]["peak_gpu_memory_gib"] = round(peak, 2)
                ctx.torch.cuda.reset_peak_memory_stats()
            ctx.free()
        except Exception as e:
            ctx.rec["info"]["cleanup_error"] = f"{type(e).__name__}: {e}"
        ctx.save()
    shutil.rmtree(ctx.tmp, ignore_errors=True)
    sys.stdout.flush()
    os._exit(0)  # a thread left behind (HF's continuous-batching loop, tqdm) must not hold the exit


# ------------------------------------------------------------------ parent process: orchestration

def shell(cmd: list[str]) -> str:
    """A command's stdout, stripped; '' when the command is missing or fails."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment() -> dict:
    import importlib.metadata as md

    import torch
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
           "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(),
           "float32_matmul_precision": torch.get_float32_matmul_precision(), "gpu": None, "driver": None,
           "git_commit": shell(["git", "-C", ROOT, "rev-parse", "HEAD"]) or None}
    for pkg in ("triton", "transformers", "numpy", "safetensors", "pytest", "hypothesis"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    q = ("name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,"
         "power.draw,power.limit")
    rows = shell(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"]).splitlines()
    if rows:
        env["nvidia_smi"] = dict(zip(q.split(","), (v.strip() for v in rows[0].split(","))))
        env["gpu"], env["driver"] = env["nvidia_smi"]["name"], env["nvidia_smi"]["driver_version"]
    return env


def summary(sections: dict, gpu: str | None = None) -> dict:
    """Ratios of one section's figure over another's (x), where both were measured; and each
    step's achieved bandwidth and FLOP/s over the measured ceilings (MBU, MFU) and over the
    datasheet's HBM bandwidth."""
    value = lambda sec, fig: sections.get(sec, {}).get("figures", {}).get(fig, {}).get("value")
    fig = "offline_total_tokens_per_s"
    pairs = {"offline_nanoserve_over_hf_static": ("nanoserve_offline", "hf_offline_static", fig),
             "offline_nanoserve_over_hf_continuous": ("nanoserve_offline", "hf_continuous", fig),
             "offline_graphs_over_eager": ("nanoserve_offline", "nanoserve_eager_offline", fig)}
    for B in sorted({*SHAPES["gpu"]["decode_batches"], *SHAPES["dry"]["decode_batches"]}):
        fig = f"decode_B{B}_tokens_per_s"
        pairs[f"decode_B{B}_nanoserve_over_hf"] = ("nanoserve_decode", "hf_decode", fig)
        pairs[f"decode_B{B}_graphs_over_eager"] = ("nanoserve_decode", "nanoserve_eager_decode", fig)
        pairs[f"decode_B{B}_nanoserve_over_hf_static"] = ("nanoserve_decode", "hf_decode_static", fig)
        pairs[f"decode_B{B}_nanoserve_over_hf_compiled"] = ("nanoserve_decode", "hf_decode_compiled", fig)
        pairs[f"decode_B{B}_kv_fp8_over_bf16"] = ("nanoserve_decode_kv_fp8", "nanoserve_decode", fig)
    pairs["kv_blocks_fp8_over_bf16"] = ("nanoserve_decode_kv_fp8", "nanoserve_decode", "num_kv_blocks")
    for q in ("int8", "fp8", "fp8_w8a8"):  # 8-bit weights against bf16 on the 8B shapes
        for B in sorted({*BIG["gpu"]["decode_batches"], *BIG["dry"]["decode_batches"]}):
            pairs[f"8b_decode_B{B}_{q}_over_bf16"] = (f"nanoserve_decode_8b_{q}", "nanoserve_decode_8b",
                                                      f"decode_B{B}_tokens_per_s")
        for P in sorted({BIG["gpu"]["prefill_len"], BIG["dry"]["prefill_len"]}):
            pairs[f"8b_prefill_{P}_{q}_over_bf16"] = (f"nanoserve_decode_8b_{q}", "nanoserve_decode_8b",
                                                      f"prefill_{P}_TFLOPs")
    for P in sorted({*SHAPES["gpu"]["prefill_lens"], *SHAPES["dry"]["prefill_lens"]}):
        fig = f"prefill_{P}_tokens_per_s"
        pairs[f"prefill_{P}_flash_over_sdpa"] = ("nanoserve_prefill", "nanoserve_prefill_sdpa", fig)
        pairs[f"prefill_{P}_nanoserve_over_hf"] = ("nanoserve_prefill", "hf_prefill", fig)
    for L in sorted({*SHAPES["gpu"]["attn_lens"], *SHAPES["dry"]["attn_lens"]}):
        fig = (f"attn_{L}_flash_TFLOPs", f"attn_{L}_sdpa_TFLOPs")
        pairs[f"attn_{L}_flash_over_sdpa"] = ("prefill_attention", "prefill_attention", fig)
    figs = {name: (fig, fig) if isinstance(fig, str) else fig for name, (_, _, fig) in pairs.items()}
    out = {name: {"value": float(f"{value(a, figs[name][0]) / value(b, figs[name][1]):.4g}"), "unit": "x"}
           for name, (a, b, _) in pairs.items() if value(a, figs[name][0]) and value(b, figs[name][1])}
    copy, peak = value("ceilings", "copy_bandwidth"), value("ceilings", "matmul_bfloat16")
    hbm = next((bw / 1e9 for key, bw in HBM_DATASHEET.items() if gpu and key in gpu), None)
    for sec in ("nanoserve_decode", "nanoserve_eager_decode", "hf_decode", "hf_decode_static",
                "hf_decode_compiled", "nanoserve_decode_8b", "nanoserve_decode_8b_int8",
                "nanoserve_decode_8b_fp8", "nanoserve_decode_8b_fp8_w8a8", "nanoserve_decode_kv_fp8"):
        for fig, v in sections.get(sec, {}).get("figures", {}).items():
            if fig.endswith("GBps"):
                stem = f"{sec}_{fig.removesuffix('_GBps').removeprefix('decode_')}"
                for ceiling, name, unit in [(copy, "mbu", "of the measured copy bandwidth"),
                                            (hbm, "of_hbm_datasheet", "of the datasheet's HBM bandwidth")]:
                    if ceiling:
                        out[f"{stem}_{name}"] = {"value": float(f"{v['value'] / ceiling:.4g}"), "unit": unit}
    for sec in ("nanoserve_prefill", "nanoserve_prefill_sdpa", "hf_prefill"):
        for fig, v in sections.get(sec, {}).get("figures", {}).items():
            if fig.endswith("TFLOPs") and peak:
                out[f"{sec}_{fig.removesuffix('_TFLOPs').removeprefix('prefill_')}_mfu"] = {
                    "value": float(f"{v['value'] / peak:.4g}"), "unit": "of the measured bf16 matmul peak"}
    return out


def print_table(result: dict) -> None:
    env = result["env"]
    print(f"\n== gpu_check {result['date']}  gpu={env.get('gpu')}  driver={env.get('driver')}  "
          f"torch={env.get('torch')} (CUDA {env.get('torch_cuda')})  triton={env.get('triton')}  "
          f"transformers={env.get('transformers')}  dry_run={result['dry_run']}")
    print(f"{'section':<26}{'figure':<44}{'value':>12}  unit")
    rows = [*result["sections"].items(), ("summary", {"status": "ok", "figures": result["summary"]})]
    for name, sec in rows:
        if sec["status"] != "ok":
            print(f"{name:<26}{sec['status'].upper()}: {str(sec.get('reason'))[:120]}")
            continue
        for fig, v in sec["figures"].items():
            value = v["value"] if isinstance(v["value"], bool) else format(v["value"], ".4g")
            print(f"{name:<26}{fig:<44}{value!s:>12}  {v['unit']}")
    print(f"elapsed {result['elapsed_s']} s of a {result['budget_s']} s budget -> {result['out']}")


def run_parent(args) -> int:
    t0, now = time.time(), datetime.now(timezone.utc)
    result = {"schema": 1, "date": now.isoformat(timespec="seconds"), "dry_run": args.dry_run,
              "budget_s": args.budget_s, "env": {}, "sections": {}, "summary": {}}
    try:
        result["env"] = environment()
    except Exception as e:
        result["env"] = {"error": f"{type(e).__name__}: {e}"}
    gpu = result["env"].get("gpu") or ("cpu-dry-run" if args.dry_run else "no-gpu")
    name = f"gpu-{now:%Y-%m-%d}-{re.sub(r'[^a-z0-9]+', '-', gpu.lower()).strip('-')}.json"
    out = args.out or os.path.join(ROOT, "benchmarks", "results", name)
    out = result["out"] = os.path.join(out, name) if out.endswith(os.sep) or os.path.isdir(out) else out
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    for group, (cap, names) in GROUPS.items():
        left = t0 + args.budget_s - time.time()
        limit = min(180 if args.dry_run else cap, left)
        part = os.path.join(tempfile.gettempdir(), f"gpu_check_{os.getpid()}_{group}.json")
        rc = None
        if args.groups and group not in args.groups:
            left = -1  # reported below as not run
        elif limit >= 5:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", group, "--part", part,
                   "--deadline", str(time.time() + limit)] + ["--dry-run"] * args.dry_run
            proc = subprocess.Popen(cmd, start_new_session=True)  # own process group: a kill takes pytest too
            try:
                rc = f"exit {proc.wait(timeout=limit + 20)}"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = f"killed after {limit + 20:.0f} s"
        secs = {}
        if os.path.exists(part):
            with open(part) as f:
                secs = json.load(f)
            os.remove(part)
        for n in names:
            why = (f"its group's process ended before it ({rc})" if rc else "its group was not asked for"
                   if left == -1 else f"no time left ({left:.0f} s)")
            sec = secs.get(n) or {"status": "skipped", "reason": why, "figures": {}, "info": {}}
            if sec["status"] == "running":
                sec.update(status="error", reason=f"its process ended while it ran ({rc}); partial figures")
            result["sections"][n] = sec
        result["elapsed_s"] = round(time.time() - t0, 1)
        write_json(out, result)
    result["summary"] = summary(result["sections"], result["env"].get("gpu"))
    try:
        result["lesson_reference_data"] = more.write_lesson_references(result["sections"], gpu, out,
                                                                       args.dry_run)
    except Exception as e:  # the figures above are kept whatever happens here
        result["lesson_reference_data"] = f"not written: {type(e).__name__}: {e}"
    write_json(out, result)
    print_table(result)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSON file, or a folder for gpu-<date>-<gpu>.json "
                                   "(default: benchmarks/results/gpu-<date>-<gpu>.json)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="seconds for the run; late sections skip")
    ap.add_argument("--dry-run", action="store_true", help="CPU, preset:tiny, tiny shapes, reference kernels")
    ap.add_argument("--groups", type=lambda s: s.split(","), help=f"run only these groups (a rerun of what "
                    f"failed), comma-separated, of: {','.join(GROUPS)}")
    ap.add_argument("--child", choices=list(GROUPS), help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine has no network: never wait on one
    if args.dry_run:  # a section that calls a Triton kernel directly runs it interpreted
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return run_child(args) if args.child else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
