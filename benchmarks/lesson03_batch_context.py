"""Lesson 03's batch x context grid at full size on this machine: decode step time over batch
and context length, the roofline floor beside it, and where the KV read overtakes the weights.

    python benchmarks/lesson03_batch_context.py            # the lesson's sizes for this device
    python benchmarks/lesson03_batch_context.py --quick    # CI sizes
    OMP_NUM_THREADS=1 python benchmarks/lesson03_batch_context.py   # on a shared, busy machine

Writes benchmarks/results/lesson03-batch-context-<date>.{json,md,png}, naming the machine, the
torch version and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import RESULTS_DIR, cpu_facts, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None, help="rounds of the grid (default: the lesson's)")
    ap.add_argument("--out-dir", default=RESULTS_DIR)
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import torch

    from nanoserve.course import experiments as ex
    from nanoserve.course import figures_capacity, setup
    from nanoserve.measure.figures import device_label

    load_before = os.getloadavg()
    S = setup.sizes("03", quick=args.quick)
    llm = setup.load_llm(S["model"], max_num_seqs=max(S["grid_batches"]))
    ceilings, dtype = ex.device_ceilings(), setup.model_dtype(llm)
    points = ex.decode_grid(llm, S["grid_batches"], S["grid_contexts"], S["grid_kv_tokens"],
                            reps=args.reps or S["grid_reps"], progress=False)
    crossover = ex.kv_crossover_tokens(llm)
    table = ex.grid_table(points, ceilings, dtype)
    machine = dict(cpu_facts(), torch=torch.__version__, threads=torch.get_num_threads(),
                   reps=args.reps or S["grid_reps"], device=device_label(llm),
                   load_before=load_before, load_after=os.getloadavg())
    if torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name(0)
    report = dict(model=S["model"], dtype=dtype, sizes={k: S[k] for k in S if k.startswith("grid")},
                  crossover_kv_tokens=crossover, bandwidth=ceilings.bandwidth,
                  peak_flops=ceilings.peak(dtype), machine=machine, rows=table.rows)
    text = (f"# Lesson 03: decode over batch x context\n\n{device_label(llm)}; "
            f"load average {load_before[0]:.1f} before, {machine['load_after'][0]:.1f} after; "
            f"torch {torch.__version__}. KV read = weight read at B x context = {crossover:.0f} "
            f"tokens (modelled).\n\n```\n{table!r}\n```\n")
    stem = write_report(report, text, args.out_dir, "lesson03-batch-context", args.quick,
                        stamp=None)
    fig = figures_capacity.plot_batch_context(points, ceilings, dtype, crossover, device_label(llm))
    fig.savefig(stem + ".png", dpi=110)
    print(f"figure: {stem}.png")


if __name__ == "__main__":
    main()
