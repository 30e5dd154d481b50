"""The systems peers.py compares, behind one small interface, all on the same checkpoint folder.

`system.run(jobs) -> results`: a job is a dict, {"kind": "offline", "prompts", "max_tokens": n}
(-> seconds until every prompt has n new tokens), {"kind": "online", "prompts", "max_tokens":
[n per prompt], "arrivals": [s]} (-> per request {"arrival", "token_times"} in seconds from
t0) or {"kind": "overhead", "batch"} (nanoserve: scheduler + batch-preparation share of a
decode step). A job's "variant" names the engine settings it needs; `variants` maps it to the
configuration of the system that serves it (absent: the system skips the job).
Every output length is fixed (greedy, EOS ignored), so all systems do the same work.

- NanoServe: nanoserve's LLM with one EngineConfig per variant.
- HFGenerate: transformers' `generate`, static batching with left padding (SDPA).
- HFContinuous: transformers' `generate_batch` (continuous batching, paged cache).
- VLLM: vLLM's CPU build in its own venv, one subprocess per variant (vllm_driver.py).
- LlamaCpp: llama.cpp through llama-cpp-python in its own venv, on a GGUF file, batch-1 jobs only
  (llamacpp_driver.py; llamacpp.py compares it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace

import torch

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.measure.bench import replay, scheduler_overhead
from nanoserve.measure.step_profile import step_profile
from nanoserve.measure.workload import Workload, WorkloadRequest, greedy_params

# Variants:
#   main: the system's throughput settings (nanoserve: 2048-token steps, prefix caching on)
#   no_prefix_cache: main without prefix caching
#   chunk512: chunked prefill in 512-token steps
#   whole_prompt: a long prompt prefilled in one step (nanoserve: chunking off; with a prompt
#                 larger than the 512-token budget it gets a step of its own, as in vLLM v0)


def nanoserve_config(variant: str, kv_gib: float) -> EngineConfig:
    main = EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                        kv_cache_memory=int(kv_gib * 2**30))
    return {"main": main, "no_prefix_cache": replace(main, enable_prefix_caching=False),
            "chunk512": replace(main, max_num_batched_tokens=512),
            "whole_prompt": replace(main, max_num_batched_tokens=512,
                                    enable_chunked_prefill=False)}[variant]


class NanoServe:
    name = "nanoserve"
    variants = {v: v for v in ("main", "no_prefix_cache", "chunk512", "whole_prompt")}  # job's: ours

    def __init__(self, folder: str, dtype: str, variant: str, kv_gib: float,
                 quantization: str | None = None, quantization_lm_head: bool = False):
        # quantization only when asked: an LLM without that argument then raises TypeError
        extra = {"quantization": quantization} if quantization else {}
        config = nanoserve_config(variant, kv_gib)
        if quantization_lm_head:  # an EngineConfig field, valid only beside the method
            config = replace(config, quantization=quantization, quantization_lm_head=True)
        self.llm = LLM(folder, device="cpu", dtype=dtype, config=config, **extra)
        self.llm.generate([[11, 12, 13, 14]], SamplingParams(max_tokens=4, temperature=0))  # warm-up

    def run(self, jobs: list[dict]) -> list:
        return [getattr(self, job["kind"])(job) for job in jobs]

    def offline(self, job) -> float:
        params = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0, ignore_eos=True)
        t = time.perf_counter()
        self.llm.generate(job["prompts"], params)
        return time.perf_counter() - t

    def online(self, job) -> list[dict]:
        reqs = [WorkloadRequest(p, greedy_params(n), a)
                for p, n, a in zip(job["prompts"], job["max_tokens"], job["arrivals"])]
        # warm every shape first (fresh prompts): a fresh engine's first 2048-token prefill pays
        # for first-touch allocation, which vLLM's start-up profiling run has already paid
        r = replay(self.llm, Workload("job", "", reqs), progress=False, warmup=len(reqs))
        return [{"arrival": o.metrics.arrival_time - r.start,
                 "token_times": [t - r.start for t in o.metrics.token_times]} for o in r.outputs]

    def overhead(self, job) -> float:
        return scheduler_overhead(self.llm, job["batch"]).fraction

    def profile(self, job) -> list[dict]:
        return [asdict(step_profile(self.llm, b, n, prefill=p)) for b, n, p in job["shapes"]]


class HFGenerate:
    name = "hf-generate"
    variants = {"main": "main"}

    def __init__(self, folder: str, dtype: str, variant: str, kv_gib: float):
        from transformers import AutoModelForCausalLM
        self.model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
        self.offline({"prompts": [[11, 12, 13, 14]], "max_tokens": 4})  # warm-up

    def run(self, jobs: list[dict]) -> list:
        return [self.offline(j) for j in jobs]

    @torch.inference_mode()
    def offline(self, job) -> float:
        from transformers import GenerationConfig
        prompts, n = job["prompts"], job["max_tokens"]
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        gc = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        t = time.perf_counter()
        self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
        return time.perf_counter() - t


class HFContinuous(HFGenerate):
    name = "hf-cb"
    PAGE = 256  # tokens per cache page (its default)

    @torch.inference_mode()
    def offline(self, job) -> float:
        from transformers import ContinuousBatchingConfig, GenerationConfig
        n = job["max_tokens"]
        gc = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        # On CPU its defaults size the cache from total RAM, and every step's attention mask
        # spans the whole cache (a tiny job took 56 s instead of 1.3 s): size the cache and the
        # batch to this job, with nanoserve main's 2048-token step budget.
        pages = sum(math.ceil((len(p) + n) / self.PAGE) for p in job["prompts"])
        cb = ContinuousBatchingConfig(page_size=self.PAGE, num_blocks=pages, max_batch_tokens=2048,
                                      max_requests_per_batch=len(job["prompts"]))
        t = time.perf_counter()
        out = self.model.generate_batch(job["prompts"], generation_config=gc,
                                        continuous_batching_config=cb)
        elapsed = time.perf_counter() - t
        if len(out) != len(job["prompts"]) or any(len(o.generated_tokens) != n for o in out.values()):
            raise RuntimeError("generate_batch did not return every request with all its tokens")
        return elapsed


class VLLM:
    """vLLM's CPU build, run by `python` (its venv's interpreter) on vllm_driver.py."""

    name = "vllm-cpu"
    # vLLM's CPU defaults: 4096-token chunked-prefill steps, prefix caching on; a 2048-token
    # prompt thus fits in one step, so main serves the whole_prompt jobs too
    variants = {"main": "main", "whole_prompt": "main", "no_prefix_cache": "no_prefix_cache",
                "chunk512": "chunk512"}

    def __init__(self, folder: str, dtype: str, variant: str, kv_gib: float, python: str,
                 timeout: float = 3600):
        engine = {"main": {}, "no_prefix_cache": {"enable_prefix_caching": False},
                  "chunk512": {"max_num_batched_tokens": 512}}[variant]
        self.spec = {"model": folder, "dtype": dtype, "engine": dict(engine, max_num_seqs=64)}
        self.python, self.timeout, self.kv_gib = python, timeout, kv_gib
        self.version: str | None = None

    def run(self, jobs: list[dict]) -> list:
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(max(1, round(self.kv_gib))),
                   VLLM_CPU_OMP_THREADS_BIND="auto")
        out = run_driver(self.python, "vllm_driver.py", "", dict(self.spec, jobs=jobs), env,
                         self.timeout)
        self.version = out["vllm_version"]
        return out["results"]


class LlamaCpp:
    """llama.cpp on one GGUF file through llama-cpp-python, run by `python` (its venv's
    interpreter) on llamacpp_driver.py; batch-1 offline jobs only (decode and prefill)."""

    name = "llama.cpp"
    variants = {"main": "main"}

    def __init__(self, gguf: str, python: str, threads: int, n_ctx: int, timeout: float = 3600):
        # llama-bench's batch defaults: 2048 tokens a call, computed in 512-token micro-batches
        self.spec = {"model": gguf, "threads": threads, "n_ctx": n_ctx, "n_batch": 2048,
                     "n_ubatch": 512}
        self.python, self.timeout = python, timeout
        self.version: str | None = None
        self.system_info: str | None = None

    def run(self, jobs: list[dict]) -> list:
        out = run_driver(self.python, "llamacpp_driver.py", "bench", dict(self.spec, jobs=jobs),
                         dict(os.environ), self.timeout)
        self.version, self.system_info = out["version"], out["system_info"]
        return out["results"]


def run_driver(python: str, driver: str, command: str, spec: dict, env: dict,
               timeout: float) -> dict:
    """Run `python driver [command] SPEC.json RESULT.json` (a driver beside this file, in another
    venv) and -> its RESULT; its output is printed if it fails."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), driver)
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        proc = subprocess.run([python, path, *([command] if command else []), spec_path, result],
                              env=env, text=True, capture_output=True, timeout=timeout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise RuntimeError(f"{driver} failed (exit {proc.returncode}); output above")
        with open(result) as f:
            return json.load(f)


def importable(python: str | None, module: str, flag: str) -> str | None:
    """None when `python` (given by the option `flag`) can import `module`, else why not."""
    if not python:
        return f"no {flag} given"
    try:
        proc = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python}: {e}"
    return None if proc.returncode == 0 else f"{python} cannot import {module}: {proc.stderr[-300:]}"


def vllm_available(python: str | None) -> str | None:
    """None when `python` can import vllm, else why not."""
    return importable(python, "vllm", "--vllm-python")
