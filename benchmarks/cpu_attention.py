"""Decode attention on this CPU: the torch reference (gather, then SDPA) vs the C++ op.

    python benchmarks/cpu_attention.py            # llama-120m's heads, fp32 and bf16
    python benchmarks/cpu_attention.py --reps 50

One layer's decode attention over a paged cache with shuffled blocks (as a long-running server's
cache is), for a few (sequences x context) shapes. The two implementations alternate call by
call, so machine drift hits both alike; medians of --reps calls each. Also prints the K/V bytes
each layer must read and the rate the op reads them at (compare: the weight-read rate of
`python -m nanoserve roofline`). Writes benchmarks/results/cpu-attention-<date>.{md,json},
naming the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import cpu_facts  # noqa: E402

from nanoserve.kernels import cpu_attention, reference  # noqa: E402

SHAPES = [(64, 320), (1, 128), (1, 2048), (16, 2048)]  # (sequences, context tokens)


def inputs(D, L, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    per_seq = -(-L // block_size)
    num_blocks = D * per_seq + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g)[:D * per_seq].view(D, per_seq).int()
    lens = torch.full((D,), L, dtype=torch.int32)
    qd = torch.randn(D, num_kv_heads, num_heads // num_kv_heads, head_dim, generator=g).to(dtype)
    return qd, torch.empty_like(qd), k_cache, v_cache, tables, lens, lens.tolist(), head_dim ** -0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--heads", default="12,4,64", help="num_heads,num_kv_heads,head_dim")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    if not cpu_attention.available():
        sys.exit(f"the C++ op is not available: {cpu_attention.unavailable_reason()}")
    heads = [int(x) for x in args.heads.split(",")]
    info = dict(date=datetime.datetime.now().strftime("%Y-%m-%dT%H%M"), machine=cpu_facts(),
                torch=torch.__version__, threads=torch.get_num_threads(), heads=heads,
                block_size=16, reps=args.reps, load_before=os.getloadavg()[0])
    rows = []
    for dtype_name in args.dtypes.split(","):
        for D, L in SHAPES:
            a = inputs(D, L, *heads, 16, getattr(torch, dtype_name))
            fns = {"reference": lambda: reference._decode_attention(*a),
                   "op": lambda: cpu_attention.decode_attention(*a)}
            times = {name: [] for name in fns}
            for name, fn in fns.items():  # warm-up
                fn()
            for _ in range(args.reps):
                for name, fn in fns.items():
                    t = time.perf_counter()
                    fn()
                    times[name].append(1e3 * (time.perf_counter() - t))
            ms = {name: statistics.median(v) for name, v in times.items()}
            kv_bytes = 2 * D * L * heads[1] * heads[2] * a[2].element_size()
            rows.append(dict(dtype=dtype_name, sequences=D, context=L, reference_ms=ms["reference"],
                             op_ms=ms["op"], speedup=ms["reference"] / ms["op"], kv_mb=kv_bytes / 1e6,
                             op_gb_s=kv_bytes / ms["op"] / 1e6))
            print(json.dumps(rows[-1]), flush=True)
    info["load_after"] = os.getloadavg()[0]
    m = info["machine"]
    md = [f"# Decode attention, one layer: torch reference vs C++ op, {info['date']}", "",
          f"Machine: {m['cpu']}, {m['cores']} vCPU, AVX-512 {'yes' if m['avx512f'] else 'no'}, "
          f"AMX bf16 {'yes' if m['amx_bf16'] else 'no'}, torch {info['torch']}, {info['threads']} "
          f"thread(s). Heads (q, kv, dim) {tuple(heads)}, block size 16, shuffled blocks; medians of "
          f"{args.reps} alternating calls. Load average {info['load_before']:.2f} before, "
          f"{info['load_after']:.2f} after. Script: benchmarks/cpu_attention.py.", "",
          "| dtype | sequences x context | K/V read (MB) | reference ms | op ms | speed-up "
          "| op reads at (GB/s) |",
          "|---|---|---:|---:|---:|---:|---:|"]
    md += [f"| {r['dtype']} | {r['sequences']} x {r['context']} | {r['kv_mb']:.1f} | {r['reference_ms']:.2f} "
           f"| {r['op_ms']:.2f} | {r['speedup']:.2f}x | {r['op_gb_s']:.1f} |" for r in rows]
    base = os.path.join(args.out, f"cpu-attention-{info['date']}")
    with open(base + ".json", "w") as f:
        json.dump(dict(info, rows=rows), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print("wrote", base + ".md")


if __name__ == "__main__":
    main()
