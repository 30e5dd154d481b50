"""The step's input preparation (engine/input_buffers.py) alone: hot, called back to back, and cold,
right after a sweep over more memory than the caches hold, as a decode step's weights sweep them.

    python benchmarks/input_prepare.py [--rounds 3]

Decode steps of 1 and 32 sequences and prompt steps of 512 to 8,192 tokens, microseconds per
`prepare`, the median of 100 calls per round; prints a table (medians of rounds) with the machine.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

from nanoserve.engine.input_buffers import InputBuffers
from nanoserve.engine.scheduler import ScheduledSeq
from nanoserve.sampling_params import SamplingParams

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantization import machine  # noqa: E402

BLOCK = 16
STEPS = {"decode, 1 sequence": (1, 1, 300), "decode, 32 sequences": (32, 1, 300),
         "prompt, 512 tokens": (1, 512, 0), "prompt, 2,048 tokens": (1, 2048, 0),
         "prompts, 4 x 2,048 tokens": (4, 2048, 0)}  # name -> (sequences, new tokens each, context)


def step(seqs: int, tokens: int, context: int, rng: random.Random) -> list[ScheduledSeq]:
    blocks = -(-(context + tokens) // BLOCK)
    return [ScheduledSeq(f"r{i}", [rng.randint(1, 99) for _ in range(tokens)], context,
                         rng.sample(range(8192), blocks), True, SamplingParams(), tokens == 1)
            for i in range(seqs)]


def median_us(fn, sweep: torch.Tensor | None, calls: int = 100) -> float:
    times = []
    for _ in range(calls):
        if sweep is not None:
            sweep.sum()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sweep-mb", type=int, default=160, help="MiB swept before each cold call")
    args = ap.parse_args(argv)
    sweep = torch.ones(args.sweep_mb << 18)  # fp32: 4 bytes a value
    bufs, rng = InputBuffers("cpu", BLOCK), random.Random(0)
    rows = {name: {"hot": [], "cold": []} for name in STEPS}
    for _ in range(args.rounds):
        for name, shape in STEPS.items():
            seqs = step(*shape, rng)
            bufs.prepare(seqs)  # the buffers grown
            rows[name]["hot"].append(median_us(lambda: bufs.prepare(seqs), None))
            rows[name]["cold"].append(median_us(lambda: bufs.prepare(seqs), sweep))
    print(f"{machine()}; torch {torch.__version__}\n\n`InputBuffers.prepare`, us per call, medians of "
          f"{args.rounds} rounds of 100 calls; cold: after a {args.sweep_mb} MiB sweep\n\n"
          "| step | hot | cold |\n|---|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {statistics.median(r['hot']):.1f} | {statistics.median(r['cold']):.1f} |")


if __name__ == "__main__":
    main()
