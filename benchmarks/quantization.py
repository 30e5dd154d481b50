"""Fewer bytes per step: batch-1 decode with fp32, bf16, int8 and fp8 weights, on the roofline.

    python benchmarks/quantization.py [--models preset:llama-120m,smollm2-135m] [--tokens 96]
                                      [--rounds 3] [--groups 32] [--decode-batches 16,32]

In one run: one pass over llama-120m's linears at batch 1 per kernel variant (the engine's fp32
and bf16 GEMV, the int8 and fp8 GEMV over codes with a scale per channel and per group of each of
`groups` input values, bf16 activations for the 8-bit ones), as GB/s of
weight bytes read and as a share of the weight-read bandwidth (nanoserve.measure's batch-1 fp32
GEMV ceiling) measured in the same round; then, per model, batch-1 decode of every variant (int8
and fp8: weight-only codes, bf16 activations and KV cache) in interleaved rounds: each round's
median inter-token latency, the bytes one step reads (nanoserve.measure.step_cost, the 8-bit
linears, and the lm_head where it is quantized too, at 1 byte a weight plus their scales) and the
floor those bytes take at the measured
bandwidth. Prints tables and the ratios int8/bf16 and fp8/bf16 of tokens/s (median of rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.kernels import cpu_gemm, cpu_quant_gemm
from nanoserve.kernels.cpu_huge_pages import to_huge_pages
from nanoserve.kernels.quantization import quantize_weight
from nanoserve.measure.ceilings import _weight_read_bandwidth
from nanoserve.measure.roofline import decode_batch, stored_step_cost
from nanoserve.model import preset_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_linear import layer_shapes  # noqa: E402

# name -> (dtype, quantization, quantization_group_size, quantization_lm_head)
VARIANTS = {"fp32": ("float32", None, None, False), "bf16": ("bfloat16", None, None, False),
            "int8": ("bfloat16", "int8", None, False), "fp8": ("bfloat16", "fp8", None, False),
            "int8, lm_head int8": ("bfloat16", "int8", None, True),
            "fp8, lm_head fp8": ("bfloat16", "fp8", None, True)}


def machine() -> str:
    name = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        text = f.read()
    for line in text.splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
            break
    flags = set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split())
    has = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "f16c") if f in flags]
    return f"{name}, {os.cpu_count()} CPUs, flags {' '.join(has)}"


def gemv_pass(mods, shapes, dtype, reps: int = 20, rows: int = 1) -> float:
    """Median seconds of one pass of `rows` rows over every layer (the weights stream from DRAM)."""
    xs = {i: torch.randn(rows, i).to(dtype) for _, i in shapes}

    def one():
        for m, (_, i) in zip(mods, shapes):
            m(xs[i])
    for _ in range(3):
        one()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gemv_table(rounds: int, groups: list[int]) -> float:
    """The GEMV table, the 8-bit codes per channel and per group of each of `groups` input values;
    -> the weight-read bandwidth (median of rounds), measured between its passes."""
    cfg = preset_config("llama-120m")
    shapes = layer_shapes(cfg) * cfg.num_hidden_layers
    dense = [torch.randn(o, i) * 0.02 for o, i in shapes]
    # each variant's weights on huge pages, as the engine holds them (cpu_huge_pages)
    variants = {"fp32 GEMV": ([cpu_gemm.PackedLinear(w, None) for w in to_huge_pages(dense)], torch.float32),
                "bf16 GEMV": ([cpu_gemm.PackedLinear(w, None)
                               for w in to_huge_pages([w.bfloat16() for w in dense])], torch.bfloat16)}
    for method in ("int8", "fp8"):
        for group in (None, *groups):
            buffer = cpu_quant_gemm.DequantBuffer(max(w.numel() for w in dense))
            codes = [quantize_weight(w, method, group) for w in dense]
            mods = [cpu_quant_gemm.QuantizedCpuLinear(q, sc, None, buffer)
                    for q, (_, sc) in zip(to_huge_pages([q for q, _ in codes]), codes)]
            variants[f"{method} GEMV" + (f", groups of {group}" if group else "")] = (mods, torch.bfloat16)
    nbytes = {name: sum(m.qweight.nbytes + m.weight_scale.nbytes if hasattr(m, "qweight")
                        else m.dense_weight().nbytes for m in mods) for name, (mods, _) in variants.items()}
    seconds, bandwidths = {name: [] for name in variants}, []
    for _ in range(rounds):  # interleaved with the ceiling: a burst of load elsewhere hits all alike
        bandwidths.append(_weight_read_bandwidth(torch.device("cpu"), 8192, 7))
        for name, (mods, dtype) in variants.items():
            seconds[name].append(gemv_pass(mods, shapes, dtype))
    bandwidth = statistics.median(bandwidths)
    print(f"\nGEMV, one batch-1 pass over llama-120m's {len(shapes)} linears (bf16 activations for "
          f"the 8-bit codes), median of {rounds} rounds; weight reads (fp32 8192x8192 GEMV, measured "
          f"in each round): {', '.join(f'{b / 1e9:.1f}' for b in bandwidths)} GB/s")
    print("| kernel | MB read | ms | GB/s | share of weight-read bandwidth (per round) |\n"
          "|---|---|---|---|---|")
    for name in variants:
        s = statistics.median(seconds[name])
        shares = [nbytes[name] / t / b for t, b in zip(seconds[name], bandwidths)]
        print(f"| {name} | {nbytes[name] / 1e6:.1f} | {s * 1e3:.2f} | {nbytes[name] / s / 1e9:.1f} | "
              f"{statistics.median(shares):.0%} ({', '.join(f'{x:.0%}' for x in shares)}) |", flush=True)
    return bandwidth


def without_amx(layer: cpu_quant_gemm.QuantizedCpuLinear) -> cpu_quant_gemm.QuantizedCpuLinear:
    layer.amx = False
    return layer


def batch_table(batches: list[int], rounds: int, dtype: torch.dtype) -> None:
    """More rows than one or two: the dtype on the engine's oneDNN linear against the 8-bit layers'
    engine path (QuantizedCpuLinear: the GEMV, on an AMX CPU the tile matmul for bf16, else
    torch._weight_int8pack_mm for bf16 int8, or dequantize into a buffer + F.linear; on an AMX CPU
    also the path without it), and torch's int8 weight-only matmul at every size."""
    cfg = preset_config("llama-120m")
    shapes = layer_shapes(cfg) * cfg.num_hidden_layers
    dense = [torch.randn(o, i) * 0.02 for o, i in shapes]
    buffer = cpu_quant_gemm.DequantBuffer(max(w.numel() for w in dense))
    codes = {m: [quantize_weight(w, m) for w in dense] for m in ("int8", "fp8")}
    name = "bf16" if dtype == torch.bfloat16 else "fp32"
    variants = {f"{name} oneDNN": [cpu_gemm.PackedLinear(w.to(dtype), None) for w in dense],
                **{f"{m} engine": [cpu_quant_gemm.QuantizedCpuLinear(q, sc, None, buffer)
                                   for q, sc in codes[m]] for m in codes},
                **{f"{m} engine without AMX": [
                    without_amx(cpu_quant_gemm.QuantizedCpuLinear(q, sc, None, buffer)) for q, sc in codes[m]]
                   for m in codes if dtype == torch.bfloat16 and cpu_quant_gemm.amx_available()},
                "int8 _weight_int8pack_mm": [
                    (lambda x, q=q, sc=sc[:, 0].to(dtype): torch._weight_int8pack_mm(x, q, sc))
                    for q, sc in codes["int8"]]}
    print(f"\nOne pass over llama-120m's linears, {name} activations, ms (median of {rounds} rounds)")
    print("| rows | " + " | ".join(variants) + " |\n|---|" + "---|" * len(variants))
    for rows in batches:
        seconds = {v: [] for v in variants}
        for _ in range(rounds):
            for v, mods in variants.items():
                seconds[v].append(gemv_pass(mods, shapes, dtype, max(3, 200 // rows), rows))
        print(f"| {rows} | " + " | ".join(f"{statistics.median(t) * 1e3:.1f}" for t in seconds.values())
              + " |", flush=True)


def step_bytes(llm, context: int) -> float:
    """Bytes one batch-1 decode step reads: step_cost with the linears' weights at their real size."""
    act = torch.finfo(llm.engine.dtype).bits // 8
    return stored_step_cost(llm.engine.model, llm.engine.model_config, decode_batch(1, context),
                            act).total_bytes


def decode_itl(llm, prompt: list[int], tokens: int) -> float:
    out = llm.generate([prompt], SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))[0]
    times = out.metrics.token_times
    return statistics.median(b - a for a, b in zip(times[1:], times[2:]))  # steps after the first decode


def decode_table(model: str, tokens: int, rounds: int, bandwidth: float,
                 groups: list[int]) -> dict[str, float]:
    """Batch-1 decode of VARIANTS and int8 with a scale per group of each of `groups` inputs."""
    prompt = list(range(100, 132))
    variants = {**VARIANTS, **{f"int8, groups of {g}": ("bfloat16", "int8", g, False) for g in groups}}
    llms = {name: LLM(model, device="cpu", dtype=dtype, config=EngineConfig(
                num_kv_blocks=64, max_num_seqs=4, quantization=q, quantization_group_size=g,
                quantization_lm_head=head))
            for name, (dtype, q, g, head) in variants.items()}
    for llm in llms.values():
        decode_itl(llm, prompt, 8)  # warm-up
    itl = {name: [] for name in llms}
    for _ in range(rounds):  # interleaved: a burst of load elsewhere hits every variant alike
        for name, llm in llms.items():
            itl[name].append(decode_itl(llm, prompt, tokens))
    context = len(prompt) + tokens // 2
    print(f"\n{model}: batch-1 decode, {len(prompt)}-token prompt, {tokens} tokens, median of {rounds} "
          f"interleaved rounds; floor = bytes per step / {bandwidth / 1e9:.1f} GB/s")
    print("| weights | activations | MB per step | ITL ms | floor ms | share of floor | tok/s |\n"
          "|---|---|---|---|---|---|---|")
    tok_s = {}
    for name, llm in llms.items():
        nbytes = step_bytes(llm, context)
        ms = statistics.median(itl[name]) * 1e3
        floor = nbytes / bandwidth * 1e3
        tok_s[name] = 1e3 / ms
        act = variants[name][0].replace("float32", "fp32").replace("bfloat16", "bf16")
        print(f"| {name} | {act} | {nbytes / 1e6:.1f} | {ms:.2f} | {floor:.2f} | {floor / ms:.0%} | "
              f"{tok_s[name]:.1f} |", flush=True)
    for name in [n for n in llms if variants[n][1]]:
        per_round = [b / q for b, q in zip(itl["bf16"], itl[name])]
        print(f"{name}/bf16 tokens/s: {tok_s[name] / tok_s['bf16']:.2f}x "
              f"(rounds: {', '.join(f'{r:.2f}' for r in per_round)}); bytes per step "
              f"{step_bytes(llms['bf16'], context) / step_bytes(llms[name], context):.2f}x fewer")
    return tok_s


def batch_decode_table(model: str, batches: list[int], tokens: int, rounds: int) -> None:
    """Decode at `batches` sequences at once, where the 8-bit linears' rows pass the GEMV's: bf16,
    int8 and fp8 weights (bf16 activations), and on an AMX CPU the 8-bit ones without its tile
    matmul (what runs there otherwise), in interleaved rounds."""
    def engine(q: str | None, amx: bool = True) -> LLM:
        blocks = max(batches) * ((32 + tokens) // 16 + 2)
        llm = LLM(model, device="cpu", dtype="bfloat16",
                  config=EngineConfig(num_kv_blocks=blocks, max_num_seqs=max(batches), quantization=q))
        for m in llm.engine.model.modules():
            if isinstance(m, cpu_quant_gemm.QuantizedCpuLinear) and not amx:
                without_amx(m)
        return llm
    llms = {"bf16": engine(None), "int8": engine("int8"), "fp8": engine("fp8")}
    if cpu_quant_gemm.amx_available():
        llms |= {f"{q} without AMX": engine(q, amx=False) for q in ("int8", "fp8")}
    print(f"\n{model}: decode at batch B, 32-token prompts, {tokens} tokens each, step ms (median of "
          f"{rounds} interleaved rounds; tok/s = B / step)")
    print("| B | " + " | ".join(llms) + " |\n|---|" + "---|" * len(llms))
    for b in batches:
        prompts = [list(range(100 + i, 132 + i)) for i in range(b)]
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        steps = {name: [] for name in llms}
        for llm in llms.values():
            llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
        for _ in range(rounds):
            for name, llm in llms.items():
                times = [o.metrics.token_times for o in llm.generate(prompts, params)]
                gaps = [t1 - t0 for t in times for t0, t1 in zip(t[1:], t[2:])]  # after the first decode
                steps[name].append(statistics.median(gaps))
        step = [statistics.median(t) for t in steps.values()]
        cells = [f"{s * 1e3:.1f} ({b / s:.0f} tok/s)" for s in step]
        print(f"| {b} | " + " | ".join(cells) + " |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="preset:llama-120m,smollm2-135m")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="3,16,64,512", help="rows of the larger-batch table ('' skips it)")
    ap.add_argument("--decode-batches", default="", help="batch sizes of a decode table per model ('' none)")
    ap.add_argument("--groups", default="32", help="scale group sizes besides per channel of the GEMV "
                    "table's 8-bit codes and the decode table's int8 ('' none)")
    args = ap.parse_args(argv)
    groups = [int(g) for g in args.groups.split(",") if g]
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} at the start; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        bandwidth = gemv_table(args.rounds, groups)
        if args.batches:
            for dtype in (torch.bfloat16, torch.float32):
                batch_table([int(b) for b in args.batches.split(",")], args.rounds, dtype)
    for model in filter(None, args.models.split(",")):
        decode_table(model, args.tokens, args.rounds, bandwidth, groups)
        if args.decode_batches:
            batch_decode_table(model, [int(b) for b in args.decode_batches.split(",")], args.tokens,
                               args.rounds)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
