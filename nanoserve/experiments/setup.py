"""Quick mode, the lessons' sizes and models, and helpers shared by the experiments.

NANOSERVE_QUICK=1 (set by CI) shrinks models, sweeps and workloads so that every notebook runs
on 2 CPU cores in about a minute; otherwise the sizes suit the device: llama-120m on a CPU,
Llama-3.2-1B on a GPU (random weights: timing depends on shapes, not values).
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

import numpy as np
import torch

from nanoserve import bench
from nanoserve.config import EngineConfig, default_device
from nanoserve.engine import LLM, LLMEngine
from nanoserve.roofline import dtype_name
from nanoserve.scenarios import Table
from nanoserve.workload import random_tokens


def quick_mode() -> bool:
    """NANOSERVE_QUICK=1 (CI): small models, sweeps and workloads."""
    return os.environ.get("NANOSERVE_QUICK", "0").strip().lower() not in ("", "0", "false", "no")


def device_kind(device: str | None = None) -> str:
    return "cuda" if str(device or default_device()).startswith("cuda") else "cpu"


MODELS = {"quick": "preset:tiny", "cpu": "preset:llama-120m", "cuda": "preset:llama-3.2-1b"}

# Per lesson: quick (CI, any device), cpu and cuda sizes.
SIZES: dict[str, dict[str, dict]] = {
    "00": {"quick": dict(linear_k=1024, linear_batches=(1, 4, 16, 64, 256)),
           "cpu": dict(linear_k=4096, linear_batches=(1, 4, 16, 64, 256, 1024)),
           "cuda": dict(linear_k=8192, linear_batches=(1, 16, 128, 1024, 8192))},
    "01": {"quick": dict(prompt_len=128, max_tokens=16, lengths=(32, 64, 128, 256, 512, 1024), reps=2),
           "cpu": dict(prompt_len=512, max_tokens=32, lengths=(64, 128, 256, 512, 1024, 2048), reps=3),
           "cuda": dict(prompt_len=2048, max_tokens=64,
                        lengths=(256, 512, 1024, 2048, 4096, 8192, 16384), reps=3)},
    "02": {"quick": dict(text_tokens=16, prompt_len=16, max_tokens=24, frag_requests=12,
                         frag_max_num_seqs=6, frag_input=32, frag_output=24),
           "cpu": dict(text_tokens=48, prompt_len=64, max_tokens=96, frag_requests=24,
                       frag_max_num_seqs=12, frag_input=64, frag_output=64),
           "cuda": dict(text_tokens=64, prompt_len=256, max_tokens=256, frag_requests=64,
                        frag_max_num_seqs=32, frag_input=256, frag_output=256)},
    "03": {"quick": dict(batches=(1, 2, 4, 8, 16, 32), steps=8, context_len=32),
           "cpu": dict(batches=(1, 2, 4, 8, 16, 32, 64), steps=12, context_len=64),
           "cuda": dict(batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), steps=16, context_len=128)},
    "04": {"quick": dict(num_requests=16, max_num_seqs=4, input_len=(16, 64), output_len=(2, 32),
                         load=0.8),
           "cpu": dict(num_requests=32, max_num_seqs=8, input_len=(32, 128), output_len=(4, 96),
                       load=0.8),
           "cuda": dict(num_requests=128, max_num_seqs=32, input_len=(128, 512),
                        output_len=(8, 256), load=0.8)},
}


def lesson_model(device: str | None = None, quick: bool | None = None) -> str:
    """The preset the lessons time: tiny in quick mode, llama-120m on a CPU, Llama-3.2-1B on a GPU."""
    quick = quick_mode() if quick is None else quick
    return MODELS["quick" if quick else device_kind(device)]


def sizes(lesson: str, quick: bool | None = None, device: str | None = None) -> dict:
    """The sizes lesson `lesson` ("00".."04") uses here, with its model under "model"."""
    if lesson not in SIZES:
        raise ValueError(f"lesson {lesson!r} has no sizes; choose from {sorted(SIZES)}")
    quick = quick_mode() if quick is None else quick
    return dict(SIZES[lesson]["quick" if quick else device_kind(device)],
                model=lesson_model(device, quick))


def lesson_llm(model: str | None = None, device: str | None = None, dtype: str | None = None,
               seed: int = 0, **config) -> LLM:
    """Load `model` (default: lesson_model()) once for timing; experiments copy its engine.
    Prefix caching is off unless asked for: these lessons time computing, not skipping it."""
    config.setdefault("enable_prefix_caching", False)
    llm = LLM(model or lesson_model(device), device=device, dtype=dtype, seed=seed,
              config=EngineConfig(**config))
    llm.name = model or lesson_model(device)
    return llm


def text_llm(device: str | None = None) -> LLM:
    """The embedded demo model (text in, text out) when installed, else the tiny preset (ids)."""
    llm = LLM(None, device=device, seed=0, config=EngineConfig(enable_prefix_caching=False))
    llm.name = "demo model" if llm.tokenizer is not None else "preset:tiny (no tokenizer: ids)"
    return llm


def default_dtype(device: str | None = None) -> str:
    """What the engine picks when no dtype is given: bfloat16 on a GPU, float32 on a CPU."""
    return "bfloat16" if device_kind(device) == "cuda" else "float32"


def model_dtype(llm) -> str:
    return dtype_name(_engine(llm).dtype)


def _engine(x) -> LLMEngine:
    return getattr(x, "engine", x)


def _dtype(x) -> str:
    return dtype_name(_engine(x).dtype)


def _prompt(engine: LLMEngine, n: int, rng: np.random.Generator) -> list[int]:
    vocab = engine.model_config.vocab_size
    return random_tokens(n, rng, vocab, min(10, vocab - 1))


def _progress(total: int, desc: str, show: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not show, leave=False)


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
            ("device", f"{device}: {bench.device_name(device)}")]
    if device_kind(device) == "cpu":
        rows.append(("torch threads", f"{torch.get_num_threads()} of {os.cpu_count()} CPUs"))
    else:
        props = torch.cuda.get_device_properties(torch.device(device))
        rows.append(("GPU memory", f"{props.total_memory / 1e9:.1f} GB"))
    rows += [("quick mode (NANOSERVE_QUICK)", str(quick_mode())), ("lesson model", lesson_model(device))]
    return Table([{"what": k, "value": v} for k, v in rows], "What this course runs on")
