"""How fast this CPU multiplies by a model's weights: F.linear, oneDNN-prepacked weights, and
the engine's linear (PackedLinear: the GEMV of cpu_gemv.cpp up to two rows, oneDNN above).

    python benchmarks/cpu_linear.py [--model preset:llama-120m] [--batches 1,2,8,64,512]

Times one pass over every linear layer's weight (all layers, so the weights stream from DRAM as
in a real step rather than sitting in cache), in fp32 and bf16, for each batch size; prints ms
per pass, GB/s of weights read and GFLOP/s. The numbers behind kernels/cpu_gemm.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from nanoserve.kernels import cpu_gemm
from nanoserve.model import preset_config


def layer_shapes(cfg) -> list[tuple[int, int]]:
    """(out, in) of qkv, o, gate_up, down: the engine's fused layout."""
    h, d = cfg.hidden_size, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    return [(qkv, h), (h, cfg.num_attention_heads * d), (2 * cfg.intermediate_size, h),
            (h, cfg.intermediate_size)]


def time_pass(weights, fn, batch: int, dtype, shapes) -> float:
    xs = {i: torch.randn(batch, i).to(dtype) for _, i in shapes}
    def one_pass():
        for w, (_, i) in zip(weights, shapes):
            fn(xs[i], w)
    one_pass()
    times = []
    for _ in range(max(3, min(30, 1000 // batch))):
        t = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="preset:llama-120m")
    ap.add_argument("--batches", default="1,2,8,64,512")
    args = ap.parse_args(argv)
    cfg = preset_config(args.model.removeprefix("preset:"))
    shapes = layer_shapes(cfg) * cfg.num_hidden_layers
    print(f"{args.model}: {len(shapes)} matrices, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'dtype':<9}{'batch':>6}{'kernel':>10}{'ms':>9}{'GB/s':>8}{'GFLOP/s':>9}")
    for dtype in (torch.float32, torch.bfloat16):
        dense = [torch.randn(o, i).to(dtype) for o, i in shapes]
        kernels = {"F.linear": (dense, F.linear)}
        if cpu_gemm.supported(dtype):
            kernels["oneDNN"] = ([cpu_gemm.pack(w) for w in dense], cpu_gemm.linear)
        if cpu_gemm.compute_dtype(dtype) is not None:
            kernels["engine"] = ([cpu_gemm.PackedLinear(w, None) for w in dense], lambda x, m: m(x))
        nbytes = sum(w.nbytes for w in dense)
        for batch in map(int, args.batches.split(",")):
            flops = 2 * batch * sum(o * i for o, i in shapes)
            for name, (weights, fn) in kernels.items():
                s = time_pass(weights, fn, batch, dtype, [w.shape for w in dense])
                print(f"{str(dtype)[6:]:<9}{batch:>6}{name:>10}{s * 1e3:9.2f}"
                      f"{nbytes / s / 1e9:8.1f}{flops / s / 1e9:9.0f}", flush=True)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
