"""Where a step's time goes: weight matmuls, attention, the small kernels, and the rest.

`step_profile(llm, batch_size, context_len)` runs decode steps of batch_size sequences at about
context_len tokens of context (or, with prefill=True, one step prefilling batch_size prompts of
context_len tokens) and splits each step's wall time into
- linear: every weight matmul (q/k/v, o, gate/up, down; float or 8-bit codes) and the lm_head,
- attention: `paged_attention` (gathering K/V out of the paged cache, then softmax(QK^T)V),
- norm, rope, cache write: three more kernels of the kernel namespace,
- other: the rest of the model's forward (the MLP's silu_and_mul, residual adds, embedding,
  Python and op dispatch),
- host: the step outside the model (scheduling, preparing the input tensors, sampling and its
  bookkeeping, building the outputs): what a GPU step adds on the CPU, around its kernels.
Timing wraps the model's Linear modules and kernels with wall-clock timers (adding a few
microseconds per call), so it holds only where ops run synchronously: the CPU. On a GPU the split
would time kernel launches, not kernels. Prompts are fresh random tokens: no prefix-cache hits.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
from torch import nn

from nanoserve.engine import LLM, LLMEngine, engine_of
from nanoserve.kernels import kernel_ops
from nanoserve.kernels.cpu_gemm import PackedLinear
from nanoserve.kernels.cpu_quant_gemm import QuantizedCpuLinear
from nanoserve.model.quantization import QuantizedLinear
from nanoserve.sampling_params import SamplingParams

# the model's linears as the loader leaves them: float, or 8-bit codes (the CPU's own classes
# replace nn.Linear and QuantizedLinear where the C++ ops load)
LINEARS = (nn.Linear, PackedLinear, QuantizedLinear, QuantizedCpuLinear)
PARTS = ("linear", "attention", "norm", "rope", "cache write", "other", "host")
_KERNEL_PART = {"paged_attention": "attention", "rms_norm": "norm", "rotary_embedding": "rope",
                "reshape_and_cache": "cache write"}


@dataclass
class StepProfile:
    label: str
    steps: int
    step_ms: float  # mean wall time of one step
    parts_ms: dict[str, float]  # PARTS -> mean ms per step; they sum to step_ms

    def share(self, part: str) -> float:
        return self.parts_ms[part] / self.step_ms

    def __str__(self) -> str:
        cells = "  ".join(f"{p} {self.parts_ms[p]:.1f} ({100 * self.share(p):.0f}%)" for p in PARTS)
        return f"{self.label}: {self.step_ms:.1f} ms/step = {cells}"


def step_profile(llm: LLM | LLMEngine, batch_size: int = 1, context_len: int = 128,
                 prefill: bool = False, steps: int = 5, label: str | None = None) -> StepProfile:
    """Mean split of `steps` decode steps (or of the one prefill step) -> StepProfile."""
    engine = engine_of(llm)
    if engine.has_unfinished():
        raise ValueError("step_profile needs an idle engine: it has unfinished requests")
    if torch.device(engine.device).type != "cpu":
        raise ValueError(f"step_profile times ops with a wall clock: CPU only, not {engine.device}")
    if engine.config.compile:
        raise ValueError("step_profile times eager ops: a torch.compile'd model (compile=True) "
                         "runs fused kernels it cannot see")
    cfg = engine.config
    if batch_size > cfg.max_num_seqs:
        raise ValueError(f"batch_size={batch_size} exceeds max_num_seqs={cfg.max_num_seqs}: "
                         "the sequences would not all decode together")
    if prefill and batch_size * context_len > cfg.max_num_batched_tokens:
        raise ValueError(f"a prefill of {batch_size} x {context_len} tokens does not fit one step "
                         f"(max_num_batched_tokens={cfg.max_num_batched_tokens})")
    if context_len + steps + 1 > engine.max_model_len:
        raise ValueError(f"context_len={context_len} + {steps} steps exceeds "
                         f"max_model_len={engine.max_model_len}")
    # "model": seconds in the model's forward and its lm_head (the step minus host)
    model, spent, t0 = engine.model, dict.fromkeys((*PARTS, "model"), 0.0), {}

    def timed(fn, *parts):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            for part in parts:
                spent[part] += time.perf_counter() - t
            return out
        return wrapper

    def start(module, args):
        t0[id(module)] = time.perf_counter()

    def stop(module, args, out):
        spent["linear"] += time.perf_counter() - t0[id(module)]

    def forward_start(module, args):
        t0["model"] = time.perf_counter()

    def forward_stop(module, args, out):
        spent["model"] += time.perf_counter() - t0["model"]

    old_ops = next(m.ops for m in model.modules() if "ops" in vars(m))
    vocab = engine.model_config.vocab_size
    # room for the tokens early sequences decode while later ones still prefill (at most one
    # per step, and a step computes at least one prefill token); aborted at the end anyway
    params = SamplingParams(max_tokens=1 if prefill else min(
        engine.max_model_len - context_len, steps + 1 + batch_size * context_len),
        temperature=0, ignore_eos=True)
    # fresh random prompts: no prefix-cache hit on an earlier call's
    prompts = torch.randint(10, vocab, (batch_size, context_len), generator=torch.Generator().manual_seed(
        int.from_bytes(os.urandom(4), "little"))).tolist()
    ids = [engine.add_request(p, params) for p in prompts]
    hooks = []
    try:
        while not prefill and any(engine.requests[i].is_prefilling for i in ids):
            engine.step()  # untimed: bring every sequence to decoding
        head = getattr(model, "lm_head_quant", None)  # timed with compute_logits, below
        hooks = [h for m in model.modules() if isinstance(m, LINEARS) and m is not head
                 for h in (m.register_forward_pre_hook(start), m.register_forward_hook(stop))]
        hooks += [model.register_forward_pre_hook(forward_start), model.register_forward_hook(forward_stop)]
        model.set_ops(kernel_ops(old_ops, **{k: timed(getattr(old_ops, k), part)
                                             for k, part in _KERNEL_PART.items()}))
        model.compute_logits = timed(model.compute_logits, "linear", "model")  # the lm_head
        t = time.perf_counter()
        for _ in range(1 if prefill else steps):
            engine.step()
        total = time.perf_counter() - t
    finally:
        for h in hooks:
            h.remove()
        vars(model).pop("compute_logits", None)
        model.set_ops(old_ops)
        for i in ids:
            engine.abort(i)
    n = 1 if prefill else steps
    spent["host"] = total - spent.pop("model")
    spent["other"] = total - sum(spent.values())
    kind = "prefill" if prefill else "decode"
    return StepProfile(label or f"{kind} batch {batch_size} x {context_len} tokens", n,
                       1e3 * total / n, {k: 1e3 * v / n for k, v in spent.items()})


def step_profiles(llm: LLM | LLMEngine, batch_sizes, context_len: int = 128, steps: int = 5,
                  rounds: int = 3) -> list[StepProfile]:
    """step_profile of each batch size, in `rounds` rounds that each run every batch size (so a
    burst of other work lands in one round, not on one batch size) -> per batch size, the round
    whose step time is the median, split as that round measured it."""
    runs: dict[int, list[StepProfile]] = {b: [] for b in batch_sizes}
    for _ in range(max(1, rounds)):
        for b in batch_sizes:
            runs[b].append(step_profile(llm, b, context_len, steps=steps))
    return [sorted(rs, key=lambda p: p.step_ms)[(len(rs) - 1) // 2] for rs in runs.values()]
