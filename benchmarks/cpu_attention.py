"""Decode attention on this CPU: the torch path (gather in cache-sized groups, then SDPA) vs the C++ op.

    python benchmarks/cpu_attention.py            # llama-120m's heads, fp32 and bf16
    python benchmarks/cpu_attention.py --reps 50
    python benchmarks/cpu_attention.py --dtypes bfloat16,fp8    # fp8: bf16 queries, an e4m3 cache

One layer's decode attention over a paged cache with shuffled blocks (as a long-running server's
cache is), for a few (sequences x context) shapes. The two implementations alternate call by
call, so machine drift hits both alike; medians of --reps calls each. Also prints the K/V bytes
each layer must read and the rate the op reads them at (compare: the weight-read rate of
`python -m nanoserve roofline`). Then, for a model's worth of layers (--layers) at 64 x 320, the
op's two floors: the op with every sequence on the same few blocks (K/V resident in cache: its
arithmetic alone) and a plain read of the same K/V bytes (a sum over each layer's cache); the op
is memory-bound when it runs at the read's time, compute-bound when at the resident time. Writes
benchmarks/results/cpu-attention-<date>.{md,json}, naming the CPU.
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

from nanoserve.kernels import cpu_attention  # noqa: E402

SHAPES = [(64, 320), (1, 128), (1, 2048), (16, 2048)]  # (sequences, context tokens)


def dtypes(name: str) -> tuple[torch.dtype, torch.dtype]:
    """--dtypes name -> (the queries' dtype, the cache's): fp8 is bf16 queries over an e4m3 cache."""
    return (torch.bfloat16, torch.float8_e4m3fn) if name == "fp8" else (getattr(torch, name),) * 2


def inputs(D, L, num_heads, num_kv_heads, head_dim, block_size, dtype_name, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype, cache_dtype = dtypes(dtype_name)
    per_seq = -(-L // block_size)
    num_blocks = D * per_seq + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(cache_dtype)
    v_cache = torch.randn(shape, generator=g).to(cache_dtype)
    tables = torch.randperm(num_blocks, generator=g)[:D * per_seq].view(D, per_seq).int()
    lens = torch.full((D,), L, dtype=torch.int32)
    qd = torch.randn(D, num_kv_heads, num_heads // num_kv_heads, head_dim, generator=g).to(dtype)
    return qd, torch.empty_like(qd), k_cache, v_cache, tables, lens, lens.tolist(), head_dim ** -0.5


def floors(D, L, layers, heads, dtype_name, reps, block_size=16) -> dict[str, float]:
    """Median ms over `layers` layers: the op over each layer's cache (blocks in order, as a
    fresh engine allocates them), the op on cache-resident blocks, and a plain read."""
    num_heads, num_kv_heads, head_dim = heads
    dtype, cache_dtype = dtypes(dtype_name)
    per_seq = -(-L // block_size)
    shape = (D * per_seq, block_size, num_kv_heads, head_dim)
    caches = [(torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)) for _ in range(layers)]
    in_order = torch.arange(D * per_seq, dtype=torch.int32).view(D, per_seq)
    resident = torch.arange(per_seq, dtype=torch.int32).repeat(D, 1)  # all on one sequence's blocks
    lens = torch.full((D,), L, dtype=torch.int32)
    qd = torch.randn(D, num_kv_heads, num_heads // num_kv_heads, head_dim).to(dtype)
    od = torch.empty_like(qd)

    def op(tables):
        for k, v in caches:
            cpu_attention.decode_attention(qd, od, k, v, tables, lens, lens.tolist(), head_dim ** -0.5)

    def read():  # torch sums no fp8: its bytes as int64 (a sum of int8 runs far below memory speed)
        for k, v in caches:
            (k.view(torch.int64) if k.element_size() == 1 else k).sum()
            (v.view(torch.int64) if v.element_size() == 1 else v).sum()

    fns = {"op": lambda: op(in_order), "resident": lambda: op(resident), "read": read}
    times = {name: [] for name in fns}
    for _ in range(reps + 1):  # the first round warms up
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - t))
    return {name: statistics.median(v[1:]) for name, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--heads", default="12,4,64", help="num_heads,num_kv_heads,head_dim")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--layers", type=int, default=12, help="layers of the floors run (llama-120m: 12)")
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
            a = inputs(D, L, *heads, 16, dtype_name)
            fns = {"reference": lambda: cpu_attention.grouped_decode_attention(*a),
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
    info["floors"], floor_reps = [], max(5, args.reps // 3)
    for dtype_name in args.dtypes.split(","):
        f = floors(64, 320, args.layers, heads, dtype_name, floor_reps)
        info["floors"].append(dict(dtype=dtype_name, **{f"{k}_ms": v for k, v in f.items()}))
        print(json.dumps(info["floors"][-1]), flush=True)
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
    md += ["", f"{args.layers} layers at 64 x 320, blocks in order, medians of {floor_reps} "
           "alternating runs: the op, the op on cache-resident blocks (its arithmetic), a plain read "
           "of the same K/V bytes.", "",
           "| dtype | op ms | resident ms | read ms |", "|---|---:|---:|---:|"]
    md += [f"| {f['dtype']} | {f['op_ms']:.1f} | {f['resident_ms']:.1f} | {f['read_ms']:.1f} |"
           for f in info["floors"]]
    base = os.path.join(args.out, f"cpu-attention-{info['date']}")
    with open(base + ".json", "w") as f:
        json.dump(dict(info, rows=rows), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print("wrote", base + ".md")


if __name__ == "__main__":
    main()
