"""Batch-1 decode: how much of a step the ops take and how much is host work around them.

    python benchmarks/batch1_host_work.py [--model smollm2-135m] [--steps 32] [--rounds 3] [--no-eager]

Per variant (bf16 weights; int8 codes with the lm_head as codes too; each by default, the layers
in one call (kernels/cpu_decode_layer.py), and with enforce_eager=True, every kernel called from
Python), in interleaved rounds, lesson 11's `host_split` at batch 1: the step's wall time by
phase (the host phases each, and their sum), the forward's ops' own time (torch.profiler over as
many further steps) and so the Python between those ops. A model with many thin layers pays that
Python once per op per layer, which a runtime that runs the whole step in native code does not.
Prints a table (medians of rounds) with the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from nanoserve import LLM, EngineConfig
from nanoserve.course.experiments.host_time import HOST, host_split

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantization import machine  # noqa: E402

VARIANTS = {"bf16": (None, False), "bf16, eager": (None, True), "int8, lm_head int8": ("int8", False),
            "int8, lm_head int8, eager": ("int8", True)}  # name -> (quantization, enforce_eager)
CONTEXT = 32  # prompt tokens, as llamacpp.py's batch-1 jobs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed (and as many profiled)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-eager", action="store_true", help="leave out the enforce_eager variants")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    llms = {name: LLM(args.model, device="cpu", dtype="bfloat16", config=EngineConfig(
                max_num_seqs=4, quantization=q, quantization_lm_head=bool(q), enforce_eager=eager))
            for name, (q, eager) in VARIANTS.items() if not (eager and args.no_eager)}
    for llm in llms.values():
        host_split(llm, 1, CONTEXT, 2)  # warm-up: a fresh engine's first steps run slower Python
    rows = {name: [] for name in llms}
    for r in range(args.rounds):
        for name, llm in llms.items():
            s = host_split(llm, 1, CONTEXT, args.steps, seed=r)
            rows[name].append(dict(step=s.step_ms, ops=s.forward_ops_ms, python=s.forward_python_ms,
                                   host=s.host_ms, **{p: s.phases_ms[p] for p in HOST}))
    print(f"{machine()}; torch {torch.__version__}, {args.threads} threads\n\n"
          f"{args.model}, batch 1, {CONTEXT}-token prompts; ms per decode step, median of "
          f"{args.rounds} rounds of {args.steps} steps\n\n"
          "| weights | step | forward: ops | forward: Python between ops | host phases | "
          + " | ".join(HOST) + " |\n|---|---:|---:|---:|---:|" + "---:|" * len(HOST))
    for name, rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(f"| {name} | {med['step']:.2f} | {med['ops']:.2f} | {med['python']:.2f} "
              f"({100 * med['python'] / med['step']:.0f}%) | {med['host']:.2f} | "
              + " | ".join(f"{med[p]:.3f}" for p in HOST) + " |")


if __name__ == "__main__":
    main()
