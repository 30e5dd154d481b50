"""What an fp8 KV cache buys on this machine: capacity, goodput at a fixed SLO, and decode step time.

    python benchmarks/kv_cache_dtype.py [--model preset:llama-120m] [--dtype bfloat16]
        [--kv-memory-mib 24] [--requests 24] [--input-len 192] [--output-len 64] [--rate 2]
        [--slo 'ttft<=2s,tpot<=150ms'] [--quality]

Every engine gets the same KV memory and differs only in EngineConfig.kv_cache_dtype ("auto":
the model's dtype; "fp8": e4m3). Prints: blocks and the largest batch of input+output-token
requests that fit; the goodput (lesson 07's: requests/s completed within every SLO) of one
Poisson workload replayed in real time on each; the median decode step at a batch that fits
both; the largest |K|, |V| written (what the fp8 scale of 1.0 must hold). --quality adds the
real model's teacher-forced argmax agreement and perplexity (measure/quality.py). Ratios come
from one run on one machine: quote them, with the load printed first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from peers import cpu_facts, other_cpu_load  # noqa: E402

from nanoserve.course.experiments import kv_dtype as X  # noqa: E402
from nanoserve.measure.workload import synthetic  # noqa: E402


def header(args) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    print(f"machine: {cpu_facts()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"nanoserve {commit}")
    print(f"load: os.getloadavg() {tuple(round(x, 1) for x in os.getloadavg())}, other processes "
          f"{other_cpu_load():.2f} cores busy")
    print(f"model {args.model} in {args.dtype}; KV memory {args.kv_memory_mib} MiB; "
          f"{args.requests} requests of {args.input_len} -> {args.output_len} tokens at {args.rate} "
          f"req/s; SLO {args.slo}\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="preset:llama-120m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-memory-mib", type=float, default=24)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--input-len", type=int, default=192)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--slo", default="ttft<=2s,tpot<=150ms")
    ap.add_argument("--also-slo", nargs="*", default=["ttft<=8s"], help="more SLOs to score the same runs at")
    ap.add_argument("--decode-batch", type=int, default=8)
    ap.add_argument("--quality", action="store_true", help="also the real model's quality")
    args = ap.parse_args(argv)
    header(args)
    memory = int(args.kv_memory_mib * 2**20)
    request_len = args.input_len + args.output_len

    llms = {kv: X.kv_engine(args.model, args.dtype, kv, memory) for kv in X.KV_DTYPES}
    rows = [X.capacity(llm, request_len) for llm in llms.values()]
    print(X.capacity_table(rows, memory, request_len))
    print(f"fp8 / auto blocks: {rows[1].num_kv_blocks / rows[0].num_kv_blocks:.2f}x\n")

    runs = [X.serve_workload(llm, args.requests, args.input_len, args.output_len, args.rate,
                             args.slo) for llm in llms.values()]
    print(X.goodput_table(runs, args.slo))
    for slo in (args.slo, *args.also_slo):
        g = [r.goodput_at(slo) for r in runs]
        print(f"goodput at {slo}: auto {g[0]:.3g}, fp8 {g[1]:.3g} req/s"
              + (f"; fp8 / auto {g[1] / g[0]:.2f}x" if g[0] else ""))
    print()

    batch, context = args.decode_batch, args.input_len
    steps = {kv: X.decode_step_time(llm, batch, context) for kv, llm in llms.items()}
    print(f"decode step, batch {batch} x ~{context} context: "
          + ", ".join(f"{kv} {1e3 * t:.1f} ms" for kv, t in steps.items())
          + f"; fp8 / auto {steps['fp8'] / steps['auto']:.2f}x\n")

    vocab = llms["auto"].engine.model_config.vocab_size
    prompts = [r.prompt_token_ids for r in synthetic(4, args.input_len, 1, vocab_size=vocab)]
    k_max, v_max = X.kv_magnitudes(llms["auto"], prompts)
    print(f"largest |K| {k_max:.3g}, |V| {v_max:.3g} written by {args.model} (e4m3: 2^-6 .. 448)\n")
    del llms
    if args.quality:
        quality(args.dtype)


def quality(dtype: str) -> None:
    """The real model (SmolLM2-135M): fp8 KV against auto, teacher-forced on auto's greedy
    continuations and on the demo model's held-out plays; the largest |K|, |V|; generations."""
    from nanoserve import LLM, EngineConfig, SamplingParams
    from nanoserve.measure.quality import compare
    from nanoserve.model import DEMO_MODEL_DIR, fetch
    folder = fetch.fetch_named("smollm2-135m")
    make = lambda kv: LLM(folder, "cpu", dtype, config=EngineConfig(  # noqa: E731
        num_kv_blocks=160, kv_cache_dtype=kv))
    auto, fp8 = make("auto"), make("fp8")
    prompts = ["What is the capital of France?", "Write a haiku about the sea.",
               "Explain what a KV cache is in one sentence.", "List three prime numbers.",
               "The history of the printing press begins", "def fibonacci(n):\n    "]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    outs = {kv: llm.generate(prompts, params) for kv, llm in (("auto", auto), ("fp8", fp8))}
    a = compare(fp8, auto, [o.prompt_token_ids + o.token_ids for o in outs["auto"]])
    print(f"smollm2-135m {dtype}, fp8 KV vs auto on auto's greedy continuations: {a}")
    text = open(os.path.join(DEMO_MODEL_DIR, "heldout.txt")).read()
    ids = auto.tokenizer.encode(text)[:2048]
    b = compare(fp8, auto, [ids[i:i + 512] for i in range(0, len(ids), 512)])
    print(f"smollm2-135m {dtype}, fp8 KV vs auto on heldout.txt (2048 tokens): {b}")
    same = sum(x == y for p, q in zip(outs["auto"], outs["fp8"]) for x, y in zip(p.token_ids, q.token_ids))
    print(f"free-running greedy: {same} of {len(prompts) * 48} tokens equal position by position")
    for p, x, y in zip(prompts, outs["auto"], outs["fp8"]):
        print(f"--- {p!r}\n auto: {x.text!r}\n fp8:  {y.text!r}")
    print("largest |K|, |V|:", X.kv_magnitudes(auto, [o.prompt_token_ids for o in outs["auto"]]))


if __name__ == "__main__":
    main()
