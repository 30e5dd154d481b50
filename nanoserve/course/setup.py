"""What every lesson shares: quick mode, the sizes per lesson and device, loading the model,
engines over an already-loaded model, running prompts to completion, and SLOs as text.

NANOSERVE_QUICK=1 (set by CI) shrinks models, sweeps and workloads so that every notebook runs
on 2 CPU cores in about a minute; otherwise the sizes suit the device: llama-120m on a CPU,
Llama-3.2-1B on a GPU (random weights: timing depends on shapes, not values).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata

import numpy as np
import torch

from nanoserve import env
from nanoserve.config import EngineConfig, default_device
from nanoserve.course.table import Table
from nanoserve.engine import LLM, LLMEngine, engine_of
from nanoserve.measure.ceilings import device_name, dtype_name
from nanoserve.measure.workload import random_tokens
from nanoserve.model import DEMO_MODEL_DIR
from nanoserve.sampling_params import SamplingParams


def quick_mode() -> bool:
    """NANOSERVE_QUICK=1 (CI): small models, sweeps and workloads."""
    return env.flag("NANOSERVE_QUICK")


def device_kind(device: str | None = None) -> str:
    return "cuda" if str(device or default_device()).startswith("cuda") else "cpu"


MODELS = {"quick": "preset:tiny", "cpu": "preset:llama-120m", "cuda": "preset:llama-3.2-1b"}

# Per lesson: quick (CI, any device), cpu and cuda sizes. Models are random-weight presets of
# real shapes (timing depends on shapes, not weights): MODELS unless a lesson names its own.
SIZES: dict[str, dict[str, dict]] = {
    "00": {"quick": dict(linear_k=1024, linear_batches=(1, 4, 16, 64, 256)),
           "cpu": dict(linear_k=4096, linear_batches=(1, 4, 16, 64, 256, 1024)),
           "cuda": dict(linear_k=8192, linear_batches=(1, 16, 128, 1024, 8192))},
    "01": {"quick": dict(prompt_len=128, max_tokens=16, lengths=(32, 64, 128, 256, 512, 1024), reps=2,
                         contexts=(64, 512, 2048), decode_steps=4),
           "cpu": dict(prompt_len=512, max_tokens=32, lengths=(64, 128, 256, 512, 1024, 2048), reps=3,
                       contexts=(128, 512, 1024, 2048, 4000), decode_steps=8),
           "cuda": dict(prompt_len=2048, max_tokens=64,
                        lengths=(256, 512, 1024, 2048, 4096, 8192, 16384), reps=3,
                        contexts=(256, 1024, 4096, 16384, 32768), decode_steps=16)},
    "02": {"quick": dict(text_tokens=16, prompt_len=16, max_tokens=24, frag_requests=12,
                         frag_max_num_seqs=6, frag_input=32, frag_output=24),
           # prompt_len, max_tokens: the no-cache path recomputes the whole sequence per token
           # (quadratic): 32 + 48 keeps lesson 02 within 3 minutes on 2 cores at full size
           "cpu": dict(text_tokens=48, prompt_len=32, max_tokens=48, frag_requests=24,
                       frag_max_num_seqs=12, frag_input=64, frag_output=64),
           "cuda": dict(text_tokens=64, prompt_len=256, max_tokens=256, frag_requests=64,
                        frag_max_num_seqs=32, frag_input=256, frag_output=256)},
    # grid_*: the batch x context grid; cells past grid_kv_tokens (B x context) are left out, and
    # the largest reaches past where the KV read equals the weight read (kv_crossover_tokens); one
    # round on a CPU, where each round's prefills of B x context tokens take most of the time
    "03": {"quick": dict(batches=(1, 2, 4, 8, 16, 32), steps=6, context_len=32,
                         prefill_counts=(1, 2, 4, 8), prefill_len=128,
                         grid_batches=(1, 4, 16), grid_contexts=(32, 256), grid_kv_tokens=4096, grid_reps=1),
           "cpu": dict(batches=(1, 2, 4, 8, 16, 32, 64), steps=8, context_len=32,
                       prefill_counts=(1, 2, 4, 8, 16), prefill_len=256,
                       grid_batches=(1, 4, 16), grid_contexts=(256, 1536), grid_kv_tokens=24576,
                       grid_reps=1),
           "cuda": dict(batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), steps=16, context_len=128,
                        prefill_counts=(1, 2, 4, 8, 16, 32), prefill_len=1024,
                        grid_batches=(1, 4, 16, 64), grid_contexts=(256, 2048, 8192),
                        grid_kv_tokens=262144, grid_reps=3)},
    "04": {"quick": dict(num_requests=16, max_num_seqs=4, input_len=(16, 64), output_len=(2, 32),
                         load=0.8),
           "cpu": dict(num_requests=32, max_num_seqs=8, input_len=(32, 128), output_len=(4, 96),
                       load=0.8),
           "cuda": dict(num_requests=128, max_num_seqs=32, input_len=(128, 512),
                        output_len=(8, 256), load=0.8)},
    "05": {
        "quick": dict(num_decoders=4, long_prompt_len=1024, num_long=2,
                      budgets=(32, 128, 512)),
        "cpu": dict(num_decoders=8, long_prompt_len=1024, num_long=2,
                    budgets=(64, 128, 512)),
        "cuda": dict(num_decoders=32, long_prompt_len=8192, num_long=4,
                     budgets=(512, 1024, 2048, 4096)),
    },
    "06": {
        "quick": dict(num_requests=12, prefix_len=512, suffix_len=32, output_len=8,
                      evict_blocks=48, evict_prefix_len=256, evict_unrelated_len=112,
                      evict_counts=(0, 2, 4, 5, 6, 7, 8)),
        "cpu": dict(num_requests=12, prefix_len=512, suffix_len=32,
                    output_len=16, evict_blocks=48, evict_prefix_len=256, evict_unrelated_len=112,
                    evict_counts=(0, 2, 4, 5, 6, 7, 8)),
        "cuda": dict(num_requests=64, prefix_len=4096, suffix_len=128,
                     output_len=32, evict_blocks=1024, evict_prefix_len=4096,
                     evict_unrelated_len=2032, evict_counts=(0, 2, 4, 5, 6, 7, 8, 10)),
    },
    # shift_load: the loaded weeks' rate, a fraction of the measured capacity; ttft_inputs: the
    # prompt lengths of the TTFT sweep (shortest, longest, how many)
    "07": {
        "quick": dict(num_requests=16, input_median=64, output_median=24,
                      short_output_median=8, rate_fractions=(0.4, 0.8, 1.2), sweep_requests=12,
                      real_chats=6, real_chat_max_tokens=48, shift_load=0.8, ttft_inputs=(16, 1024, 8)),
        "cpu": dict(num_requests=16, input_median=64, output_median=24,
                    short_output_median=8, rate_fractions=(0.3, 0.6, 0.9, 1.2), sweep_requests=24,
                    real_chats=12, real_chat_max_tokens=96, shift_load=0.8, ttft_inputs=(32, 2048, 9)),
        "cuda": dict(num_requests=100, input_median=512, output_median=96,
                     short_output_median=32, rate_fractions=(0.3, 0.6, 0.9, 1.2), sweep_requests=150,
                     real_chats=12, real_chat_max_tokens=128, shift_load=0.8,
                     ttft_inputs=(128, 16384, 10)),
    },
    "08": {
        "quick": dict(num_requests=8, input_len=96, output_len=16, caps=(1, 4, 8)),
        "cpu": dict(num_requests=16, input_len=256, output_len=48,
                    caps=(1, 4, 16)),
        "cuda": dict(num_requests=128, input_len=1024, output_len=256,
                     caps=(1, 8, 32, 128)),
    },
    "09": {
        "quick": dict(num_requests=16, input_median=192, output_median=16,
                      sim_requests=40, rates=3, datasheet_requests=40),
        "cpu": dict(num_requests=16, input_median=256, output_median=32,
                    sim_requests=120, rates=5, datasheet_requests=80),
        "cuda": dict(num_requests=200, input_median=1024, output_median=128,
                     sim_requests=300, rates=5, datasheet_requests=120),
    },
    # model: what the server and the in-process LLM load (the demo model in quick mode: text in
    # and out); name: the served model name; chat_*: the chat with the real model, its own server
    "10": {
        "quick": dict(model=DEMO_MODEL_DIR, name="demo-model", input_len=32, output_len=8,
                      sweep_requests=8, rate_fractions=(0.3, 0.6, 0.9), batch1_requests=4, streams=16,
                      server_args=("--served-model-name", "demo-model", "--num-kv-blocks", "256"),
                      chat_questions=1, chat_max_tokens=24),
        "cpu": dict(model="preset:llama-120m", name="preset:llama-120m", input_len=128, output_len=32,
                    sweep_requests=24, rate_fractions=(0.2, 0.4, 0.6, 0.8, 1.0), batch1_requests=8,
                    streams=64, server_args=(), chat_questions=3, chat_max_tokens=64),
        "cuda": dict(model="preset:llama-3.2-1b", name="preset:llama-3.2-1b", input_len=512,
                     output_len=128, sweep_requests=200, rate_fractions=(0.2, 0.4, 0.6, 0.8, 1.0),
                     batch1_requests=16, streams=64, server_args=(), chat_questions=3,
                     chat_max_tokens=96),
    },
    # batches: the step profile's and host split's decode batches (the profile's in `rounds`
    # interleaved rounds); graph_batches: CUDA graphs on and off (all within the default capture
    # sizes); pre_*: the preemption study's requests
    # graph_kv_bytes: each graphs-on/off load's own KV pool, beside the lesson's loaded model
    "11": {"quick": dict(batches=(1, 16), context=32, steps=6, rounds=3, graph_batches=(1, 16),
                         graph_kv_bytes=2**28, pre_requests=8, pre_prompt=32, pre_tokens=32),
           "cpu": dict(batches=(1, 16), context=128, steps=6, rounds=3, graph_batches=(1, 16),
                       graph_kv_bytes=2**30, pre_requests=16, pre_prompt=64, pre_tokens=48),
           "cuda": dict(batches=(1, 32), context=512, steps=16, rounds=3, graph_batches=(1, 8, 32, 64),
                        graph_kv_bytes=2**31,
                        pre_requests=64, pre_prompt=512, pre_tokens=256)},
    # on the real model (course.scenarios.chat): k drafts per verify; verify_*: the step-cost grid
    # (positions include k + 1, batches include big_batch); kv_blocks: the loaded pool; grid_*: the
    # explorer's runs over k, batch (at most big_batch) and task
    "12": {"quick": dict(model="smollm2-135m", k=4, verify_batches=(1, 4), positions=(1, 3, 5),
                         verify_context=64, verify_steps=3, max_tokens=32, reps=1, big_batch=4,
                         trace_tokens=40, samples=3000, kv_blocks=256, grid_ks=(1, 4),
                         grid_batches=(1, 4), grid_tokens=16, grid_reps=1),
           "cpu": dict(model="smollm2-135m", k=4, verify_batches=(1, 16, 32), positions=(1, 2, 5, 8),
                       verify_context=128, verify_steps=4, max_tokens=64, reps=3, big_batch=16,
                       trace_tokens=48, samples=20000, kv_blocks=640, grid_ks=(1, 2, 4, 6, 8),
                       grid_batches=(1, 16), grid_tokens=48, grid_reps=2),
           "cuda": dict(model="smollm2-135m", k=4, verify_batches=(1, 16, 64, 128), positions=(1, 2, 5, 8),
                        verify_context=512, verify_steps=8, max_tokens=128, reps=3, big_batch=64,
                        trace_tokens=48, samples=50000, kv_blocks=8192, grid_ks=(1, 2, 4, 6, 8),
                        grid_batches=(1, 64), grid_tokens=64, grid_reps=1)},
    # formats: the weight formats timed at batch 1 (context, steps); kv_memory: the bytes both KV
    # caches get, a few requests' worth; requests .. output_len: the goodput workload; loads: its
    # arrival rates, as multiples of what the bf16 engine serves with every request at once (past 1,
    # the bf16 cache is what limits the batch); prefill_len: the compute-bound prompt; kv_step_*: the
    # decode step timed over each cache, at a context where K/V are a large share of its bytes;
    # quality_model: the model whose quality and generations are compared
    "13": {"quick": dict(model=DEMO_MODEL_DIR,
                         formats=("float32", "bfloat16", "int8", "fp8", "int8 + lm_head"),
                         context=32, steps=6, kv_memory=3 * 2**17, requests=12, input_len=32, output_len=16,
                         loads=(0.8, 1.6), prefill_len=256, kv_step_batch=2, kv_step_context=128,
                         quality_model=DEMO_MODEL_DIR, quality_tokens=24),
           "cpu": dict(model="preset:llama-120m",
                       formats=("float32", "bfloat16", "int8", "fp8", "int8 + lm_head"),
                       context=128, steps=8, kv_memory=int(3.75 * 2**20), requests=24, input_len=64,
                       output_len=96, loads=(0.8, 1.2, 1.6), prefill_len=1024, kv_step_batch=2,
                       kv_step_context=2048, quality_model="smollm2-135m", quality_tokens=48),
           "cuda": dict(model="preset:llama-3.2-1b", formats=("bfloat16", "int8", "fp8", "int8 + lm_head"),
                        context=512, steps=16, kv_memory=2**28, requests=64, input_len=512, output_len=128,
                        loads=(0.8, 1.2, 1.6), prefill_len=4096, kv_step_batch=16, kv_step_context=4096,
                        quality_model="smollm2-135m", quality_tokens=48)},
}


def lesson_model(device: str | None = None, quick: bool | None = None) -> str:
    """The preset the lessons time: tiny in quick mode, llama-120m on a CPU, Llama-3.2-1B on a GPU."""
    quick = quick_mode() if quick is None else quick
    return MODELS["quick" if quick else device_kind(device)]


class Sizes(dict):
    """A lesson's sizes: a dict whose repr wraps between entries at WIDTH columns (a line of a
    deck's slide) instead of running off the slide's edge as one line."""

    WIDTH = 100

    def __repr__(self) -> str:
        lines = []
        for item in (f"{k!r}: {v!r}" for k, v in self.items()):
            # each line: a "{" or " " before it, a "," or "}" after it
            if lines and len(lines[-1]) + len(item) + 4 <= self.WIDTH:
                lines[-1] += ", " + item
            else:
                lines.append(item)
        return "{" + ",\n ".join(lines) + "}"


def sizes(lesson: str, quick: bool | None = None, device: str | None = None) -> Sizes:
    """The sizes lesson `lesson` ("00".."13") uses here (quick, or for this device), its model
    under "model"."""
    if lesson not in SIZES:
        raise ValueError(f"lesson {lesson!r} has no sizes; choose from {sorted(SIZES)}")
    quick = quick_mode() if quick is None else quick
    kind = "quick" if quick else device_kind(device)
    return Sizes({"model": lesson_model(device, quick), **SIZES[lesson][kind]})


def load_llm(model: str | None = None, device: str | None = None, dtype: str | None = None,
             seed: int = 0, **config) -> LLM:
    """Load `model` (default: lesson_model()) once; experiments run on engines over it
    (`fresh_engine`). config: EngineConfig fields.

    Quick mode on a CPU runs torch on one thread: CI runs two notebooks at once on two cores, and
    two-thread OpenMP work sharing a core with other work slows down many times over."""
    set_threads_for_quick_mode(device)
    return LLM(model or lesson_model(device), device=device, dtype=dtype, seed=seed,
               config=EngineConfig(**config))


def set_threads_for_quick_mode(device: str | None = None) -> None:
    """Quick mode on a CPU runs torch on one thread (load_llm says why); a lesson that loads its
    own engines calls this first."""
    if quick_mode() and device_kind(device) == "cpu":
        torch.set_num_threads(1)


def text_llm(device: str | None = None) -> LLM:
    """The embedded demo model (text in, text out) when installed, else the tiny preset (ids)."""
    return LLM(None, device=device, seed=0, config=EngineConfig(enable_prefix_caching=False))


def default_dtype(device: str | None = None) -> str:
    """What the engine picks when no dtype is given: bfloat16 on a GPU, float32 on a CPU."""
    return "bfloat16" if device_kind(device) == "cuda" else "float32"


def model_dtype(llm) -> str:
    """The dtype the model runs in, as a name ('float32')."""
    return dtype_name(engine_of(llm).dtype)


def random_prompt(engine_or_llm, n: int, rng: np.random.Generator) -> list[int]:
    """n random token ids of the engine's vocabulary (ids below 10 left out: special tokens)."""
    vocab = engine_of(engine_or_llm).model_config.vocab_size
    return random_tokens(n, rng, vocab, min(10, vocab - 1))


def progress_bar(total: int, desc: str, show: bool):
    """A tqdm progress bar (the notebook widget in a notebook), or none when show is False."""
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not show, leave=False)


def fresh_engine(engine_or_llm, scheduler_cls=None, kv_manager_cls=None, **overrides) -> LLMEngine:
    """A new engine over the same loaded model and KV tensors: its own scheduler and block
    bookkeeping (so an empty prefix cache) and the EngineConfig fields in `overrides`;
    scheduler_cls, kv_manager_cls: a learner's pieces in place of the engine's.
    num_kv_blocks may shrink the cache (never grow it); block_size can't change."""
    engine = engine_of(engine_or_llm)
    if overrides.get("block_size", engine.config.block_size) != engine.config.block_size:
        raise ValueError("block_size is fixed by the allocated KV tensors; load the model again")
    overrides.setdefault("num_kv_blocks", engine.num_kv_blocks)
    return LLMEngine.from_executor(engine.executor, replace(engine.config, **overrides),
                                   scheduler_cls=scheduler_cls, kv_manager_cls=kv_manager_cls)


def generate(engine_or_llm, prompts: Sequence[list[int]], params: SamplingParams | Sequence) -> list:
    """All prompts at once, stepped to completion (no real-time arrivals). -> outputs in order."""
    engine = engine_of(engine_or_llm)
    params = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    final = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    return [final[i] for i in ids]


def shown_path(arg) -> str:
    """A model path or command argument as a lesson prints it: inside the checkout, relative to it
    (nanoserve/assets/demo-model); under the home folder, from ~; anything else as it is. A
    learner's absolute paths say nothing to anyone else reading the output, a deck's audience."""
    arg = os.fspath(arg)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isabs(arg):
        return arg
    if os.path.commonpath([root, arg]) == root:
        return os.path.relpath(arg, root)
    home = os.path.expanduser("~")
    return "~" + arg[len(home):] if home != "/" and os.path.commonpath([home, arg]) == home else arg


def slo_text(slo: dict) -> str:
    """{"ttft": 0.12, "tpot": 0.0264} -> 'ttft<=120ms,tpot<=26.4ms' (three significant digits)."""
    return ",".join(f"{k}<={v * 1e3:.3g}ms" for k, v in slo.items())


def installed(device: str | None = None) -> Table:
    """Versions and the device this course will measure."""
    device = device or default_device()

    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"
    rows = [("python", platform.python_version()), *[(p, version(p)) for p in
            ("nanoserve", "torch", "triton", "numpy", "matplotlib", "ipywidgets", "tqdm")],
            ("device", f"{device}: {device_name(device)}")]
    if device_kind(device) == "cpu":
        rows.append(("torch threads", f"{torch.get_num_threads()} of {os.cpu_count()} CPUs"))
    else:
        props = torch.cuda.get_device_properties(torch.device(device))
        rows.append(("GPU memory", f"{props.total_memory / 1e9:.1f} GB"))
    rows += [("quick mode (NANOSERVE_QUICK)", str(quick_mode())), ("lesson model", lesson_model(device))]
    return Table([{"what": k, "value": v} for k, v in rows], "What this course runs on")
