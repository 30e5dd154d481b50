"""Batch-1 decode: how much of a step the ops take and how much is host work around them.

    python benchmarks/batch1_host_work.py [--model smollm2-135m] [--tokens 96] [--rounds 2]

Per variant (bf16 weights; int8 codes with the lm_head as codes too), in interleaved rounds:
the median inter-token latency of a greedy batch-1 generation (a fresh prompt each time, so no
prefix-cache hit), and, under torch.profiler, the ops' own time per decode step: the summed self
time of every op in a `tokens`-token generation less that of a 1-token one (the prefill), over
`tokens` - 1 steps. What is left of the step is host work: Python around the ops (module calls,
the kernels' wrappers, dispatch), scheduling and sampling. A model with many thin layers pays it
once per op per layer, which a runtime that runs the whole step in native code does not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from nanoserve import LLM, EngineConfig, SamplingParams

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantization import machine  # noqa: E402

VARIANTS = {"bf16": None, "int8, lm_head int8": "int8"}


def op_ms(llm, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(all ops, GEMVs) self milliseconds of one generation of `tokens` tokens."""
    with profile(activities=[ProfilerActivity.CPU]) as p:
        llm.generate([prompt], SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    events = p.key_averages()
    return (sum(e.self_cpu_time_total for e in events) / 1e3,
            sum(e.self_cpu_time_total for e in events if "gemv" in e.key) / 1e3)


def measure(llm, tokens: int, seed: int) -> dict[str, float]:
    prompts = iter([[seed + 40 * k + i for i in range(32)] for k in range(6)])  # fresh each call
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)

    def itl() -> float:
        times = llm.generate([next(prompts)], params)[0].metrics.token_times
        return statistics.median(b - a for a, b in zip(times[1:], times[2:]))
    itl()  # warm-up
    step = 1e3 * statistics.median(itl() for _ in range(3))
    (all_n, gemv_n), (all_1, gemv_1) = op_ms(llm, next(prompts), tokens), op_ms(llm, next(prompts), 1)
    ops = (all_n - all_1) / (tokens - 1)
    return dict(step=step, ops=ops, gemv=(gemv_n - gemv_1) / (tokens - 1), host=step - ops)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    llms = {name: LLM(args.model, device="cpu", dtype="bfloat16", config=EngineConfig(
                num_kv_blocks=64, max_num_seqs=4, quantization=q, quantization_lm_head=bool(q)))
            for name, q in VARIANTS.items()}
    rows = {name: [] for name in llms}
    for r in range(args.rounds):
        for name, llm in llms.items():
            rows[name].append(measure(llm, args.tokens, 100 + 1000 * r))
    print(f"{machine()}; torch {torch.__version__}, {args.threads} threads\n\n"
          f"{args.model}, batch 1, 32-token prompts; ms per decode step, "
          f"median of {args.rounds} rounds\n\n| weights | step | ops | of which GEMVs | host work |\n"
          "|---|---:|---:|---:|---:|")
    for name, rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(f"| {name} | {med['step']:.2f} | {med['ops']:.2f} | {med['gemv']:.2f} | "
              f"{med['host']:.2f} ({100 * med['host'] / med['step']:.0f}%) |")


if __name__ == "__main__":
    main()
