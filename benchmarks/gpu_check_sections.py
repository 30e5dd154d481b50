"""gpu_check's sections on the lessons, on prefill attention and on HF's fair baseline.

  lesson_00 .. lesson_03  each lesson's experiment at the sizes it picks on this device, through
                   the calls its cells make (scripts/reference_results.measure); the series are kept
                   in the section's info and written as the lessons' reference data of this GPU;
                   the decode steps that ran without a CUDA graph are counted
  prefill_attention  the attention of one prompt of 128 to 8192 tokens (the preset's heads, bf16):
                   the flash prefill kernel (Triton), the torch reference (SDPA through the paged
                   cache) and SDPA on contiguous K/V; TFLOP/s of the causal half
  nanoserve_prefill_sdpa  nanoserve's prefill sweep with the reference attention (SDPA) in place
                   of the flash kernel: the same model, one kernel swapped
  hf_decode_static, hf_decode_compiled  HF generate with a static KV cache (cache_implementation
                   "static"), then with its forward in torch.compile (mode "reduce-overhead": CUDA
                   graphs): HF's own fast path, the fair peer of a graph-replaying engine
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


@contextlib.contextmanager
def eager_decode_steps(ctx):
    """Count the decode-only steps run inside, and those of them that ran eagerly where an engine
    had CUDA graphs (a batch past the captured sizes, a block table past the graphs' width):
    figures decode_steps and eager_decode_steps of the section."""
    from nanoserve.engine.cuda_graphs import CudaGraphRunner
    can_run, counts = CudaGraphRunner.can_run, {"decode": 0, "eager": 0}

    def counted(self, seqs):
        ok = can_run(self, seqs)
        if self.enabled and all(s.is_decode and len(s.token_ids) == 1 for s in seqs):
            counts["decode"] += 1
            counts["eager"] += not ok
        return ok
    CudaGraphRunner.can_run = counted
    try:
        yield
    finally:
        CudaGraphRunner.can_run = can_run
        ctx.fig("decode_steps", counts["decode"], "decode-only steps of engines with CUDA graphs")
        ctx.fig("eager_decode_steps", counts["eager"], "of them run without a graph")


def sec_lesson(ctx, lesson: str) -> None:
    """The lesson's experiment at its size here (quick sizes in a dry run)."""
    import reference_results
    t = time.perf_counter()
    with eager_decode_steps(ctx):
        entry = reference_results.measure(lesson, quick=ctx.dry)
    for key, points in entry["series"].items():
        n = len(points) if isinstance(points, list) else sum(len(v) for v in points.values())
        ctx.fig(f"{key}_points", n, "points")
    ctx.info(reference=entry)
    ctx.fig("lesson_seconds", time.perf_counter() - t, "s (load and every measurement)")


def lesson_05_reference(ctx, sizes: dict, runs) -> None:
    """Lesson 05's series, as reference_results measures them, from gpu_check's own run."""
    import reference_results
    ctx.info(reference={"sizes": sizes, "series": {"budget": reference_results.budget_series(runs)}})


def write_lesson_references(sections: dict, gpu: str, out_json: str, dry: bool) -> str | None:
    """The lessons' series of this run as a reference-data file beside the JSON
    (reference_data/<gpu>.json: copy it into nanoserve/course/reference_data/). -> its path."""
    import re
    from pathlib import Path

    import reference_results
    lessons = {name.removeprefix("lesson_"): sec["info"]["reference"] for name, sec in sections.items()
               if name.startswith("lesson_") and sec["status"] == "ok" and "reference" in sec["info"]}
    if not lessons:
        return None
    import torch
    ref = reference_results.reference_file(gpu, {"quick" if dry else "full": {
        lesson: {**entry, "torch_threads": torch.get_num_threads()} for lesson, entry in lessons.items()}},
        {"note": "measured by benchmarks/gpu_check.py, one section after another"})
    key = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    path = Path(os.path.dirname(os.path.abspath(out_json))) / "reference_data" / f"{key}.json"
    reference_results.write_reference(path, ref)
    return str(path)


def sec_prefill_attention(ctx) -> None:
    import torch
    import torch.nn.functional as F

    from nanoserve.kernels import AttentionMetadata, reference
    cfg, dtype, dev = ctx.config(), getattr(torch, ctx.S["dtype"]), ctx.dev
    H, KVH, D, bs = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, 16
    flash = None
    if dev == "cuda":
        from nanoserve.kernels import triton_ops
        flash = triton_ops.paged_attention
    ctx.info(heads=H, kv_heads=KVH, head_dim=D, block_size=bs,
             flash="triton_ops.paged_attention (flash prefill kernel)" if flash else "needs CUDA: skipped")
    for L in ctx.S["attn_lens"]:
        if ctx.left() < 5:
            return ctx.info(skipped_lengths=[n for n in ctx.S["attn_lens"] if n >= L])
        nb = -(-L // bs)
        g = torch.Generator(device=dev).manual_seed(L)
        q = torch.randn(L, H, D, device=dev, dtype=dtype, generator=g)
        k_cache = torch.randn(nb, bs, KVH, D, device=dev, dtype=dtype, generator=g)
        v_cache = torch.randn_like(k_cache)
        attn = AttentionMetadata(torch.tensor([0, L], dtype=torch.int32, device=dev),
                                 torch.tensor([L], dtype=torch.int32, device=dev),
                                 torch.randperm(nb, device=dev).int()[None], query_start_loc_cpu=[0, L],
                                 seq_lens_cpu=[L], num_decodes=0)
        k, v = (reference.gather_kv(c, attn.block_tables[0], L).transpose(0, 1)[None]
                for c in (k_cache, v_cache))  # (1, kv_heads, L, head_dim), contiguous for SDPA
        qs = q.transpose(0, 1)[None]
        kernels = {"reference": lambda: reference.paged_attention(q, k_cache, v_cache, attn, D ** -0.5),
                   "sdpa": lambda: F.scaled_dot_product_attention(qs, k, v, is_causal=True, enable_gqa=True)}
        if flash is not None:
            kernels["flash"] = lambda: flash(q, k_cache, v_cache, attn, D ** -0.5)
            want = kernels["sdpa"]()[0].transpose(0, 1).float()
            ctx.fig(f"attn_{L}_flash_max_abs_err", (kernels["flash"]().float() - want).abs().max(),
                    "max |flash - sdpa|")
        flops = 2 * L * L * H * D  # QK^T and PV over the causal half: 2 x (2 L^2 H D) / 2
        for name, fn in kernels.items():
            fn()  # warm-up (Triton compiles once per shape class)
            t = statistics.median(ctx.timed(fn) for _ in range(ctx.S["reps"] + 2))
            ctx.fig(f"attn_{L}_{name}_ms", t * 1e3, "ms")
            ctx.fig(f"attn_{L}_{name}_TFLOPs", flops / t / 1e12, "TFLOP/s (causal attention FLOPs / time)")


def sec_nanoserve_prefill_sdpa(ctx, prefill_sweep) -> None:
    from nanoserve import SamplingParams
    from nanoserve.kernels import reference, use_kernels
    llm, one = ctx.llm(False), SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    old = use_kernels(llm)  # the kernels in use, to put back
    use_kernels(llm, paged_attention=reference.paged_attention)
    try:
        prefill_sweep(ctx, lambda p: llm.generate([p], one),
                      "generate(one prompt, max_tokens=1), reference (SDPA) attention: TTFT, median")
    finally:
        use_kernels(llm, paged_attention=old.paged_attention)


def hf_step_timer(ctx, hf, **generate_kwargs):
    """-> step_times(prompts, n): the seconds between HF generate's steps for greedy n tokens, from
    a logits processor's stamps (called once per step)."""
    import torch
    from transformers import LogitsProcessorList
    stamps = []

    def stamp(input_ids, scores):
        ctx.sync()
        stamps.append(time.perf_counter())
        return scores

    def step_times(prompts, n):
        stamps.clear()
        ids = torch.tensor(prompts, device=ctx.dev)
        with torch.no_grad():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                        do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([stamp]),
                        **generate_kwargs)
        return [b - a for a, b in zip(stamps, stamps[1:])]
    return step_times


def sec_hf_decode_static(ctx, decode_sweep, compiled: bool) -> None:
    import torch
    hf = ctx.hf()
    step_times = hf_step_timer(ctx, hf, cache_implementation="static")

    forward = hf.forward
    if compiled:  # on a CPU dry run the eager backend: the plumbing, not inductor's minutes
        hf.forward = torch.compile(forward, fullgraph=True, **(
            {"backend": "eager"} if ctx.dry else {"mode": "reduce-overhead"}))
    try:
        # compiled: batches 1 and 8 only (each batch size compiles again)
        decode_sweep(ctx, step_times, "median time between generate steps, static cache"
                     + (", torch.compile(reduce-overhead)" if compiled else ""),
                     ctx.S["decode_batches"][:1 if ctx.dry else 2] if compiled else None)
    finally:
        hf.forward = forward


QUANT_SHAPES = {"gpu": [(28672, 4096), (4096, 14336)],  # Llama-3-8B's widest and deepest: gate_up, down
                "dry": [(48, 64), (40, 96)]}
QUANT_ROWS = {"gpu": [1, 2, 4, 8, 16, 64, 128, 256, 512, 4096], "dry": [1, 4, 8, 70]}
# (block_n, block_k, split_k (None: the default's), num_warps) for the GEMV at one row
GEMV_CONFIGS = [(8, 512, 1, 4), (16, 512, None, 4), (16, 512, 4, 4), (32, 512, None, 8), (16, 512, 8, 4),
                (16, 512, 16, 4), (8, 512, 8, 4), (32, 512, 8, 8), (16, 1024, 8, 4)]
# (block_n, block_k, split_k, num_warps, num_stages, swap_ab) for the tl.dot tiles at TILED_ROWS
TILED_CONFIGS = [(32, 128, None, 4, 4, False), (64, 128, None, 4, 4, False), (32, 256, None, 4, 3, False),
                 (64, 128, None, 4, 4, True), (64, 256, None, 4, 3, True), (128, 128, None, 4, 3, True),
                 (128, 64, None, 8, 3, True), (64, 128, None, 4, 3, True), (32, 128, None, 4, 4, True)]
TILED_ROWS = {"gpu": [4, 8, 16, 64, 128], "dry": [4]}
# largest |error| / largest |output| a W8A16 path may show: 4x a bf16 output's rounding (2^-8)
W8A16_ERR_LIMIT = 2 ** -6


def w8a8_rounding(ctx, cases: int) -> None:
    """How far the card's fp8 products lie from exact arithmetic, in units of K 2^-24 S (S = |x| @
    |W|^T over the e4m3 values: fp32 sums lie within 1 of it; tests/kernels/test_fp8_w8a8.py
    allows 2^8 on a GPU), and whether its per-token codes and scales are the CPU's (they were
    not, once: CUDA divided by 448 as a product with its reciprocal). Two measures: the codes'
    bare product (unit scales, fp32 out: the accumulation alone) and the linear as it runs (its
    scales, bf16 out: less the output's rounding, 2^-8 |y|)."""
    import torch

    from nanoserve.kernels import fp8_w8a8
    from nanoserve.kernels.quantization import quantize_weight
    worst = {"bare": (0.0, None), "linear": (0.0, None)}
    codes_differ = scales_differ = 0
    one = torch.ones((), device=ctx.dev)
    for case in range(cases):
        g = torch.Generator().manual_seed(case)
        m, k, n = (3, 64, 16) if case == 0 else (int(v) * 16 for v in torch.randint(1, 41, (3,), generator=g))
        x = torch.randn(m, k, generator=g) * 2.0 ** torch.randint(-20, 21, (m, 1), generator=g).float()
        x = x.to(torch.bfloat16)
        q, s = quantize_weight(torch.randn(n, k, generator=g), "fp8")
        codes, scale = fp8_w8a8.quantize_per_token(x.to(ctx.dev))
        cpu_codes, cpu_scale = fp8_w8a8.quantize_per_token(x)
        codes_differ += int((codes.cpu().view(torch.uint8) != cpu_codes.view(torch.uint8)).sum())
        scales_differ += int((scale.cpu() != cpu_scale).sum())
        qd = q.to(ctx.dev)
        xc, wc = codes.cpu().double(), q.double()
        for name, run, xs, ws, out_round in (
                ("bare", lambda: torch._scaled_mm(codes, qd.t(), scale_a=one, scale_b=one,
                                                  out_dtype=torch.float32), 1.0, 1.0, 0.0),
                ("linear", lambda: fp8_w8a8.fp8_w8a8_linear(x.to(ctx.dev), qd, s.to(ctx.dev)),
                 scale.cpu().double(), s.double().reshape(1, -1), 2.0 ** -8)):
            try:
                y = run().cpu().double()
            except Exception as e:  # one that the card's _scaled_mm refuses leaves the other
                ctx.info(**{f"w8a8_{name}_error": f"{type(e).__name__}: {e}"[:200]})
                continue
            exact = (xc @ wc.T) * xs * ws
            S = (xc.abs() @ wc.abs().T) * xs * ws
            excess = (y - exact).abs() - out_round * exact.abs()
            units = (excess / (k * 2.0 ** -24 * S).clamp(min=1e-300)).max().item()
            if units > worst[name][0]:
                worst[name] = (units, f"m={m} k={k} n={n}")
    for name, (units, where) in worst.items():
        ctx.fig(f"w8a8_{name}_worst_error_units", units, "units of K 2^-24 S")
        ctx.info(**{f"w8a8_{name}_worst_case": where})
    ctx.info(w8a8_codes_differing_from_cpu=codes_differ, w8a8_scales_differing_from_cpu=scales_differ,
             w8a8_cases=cases)


def sec_quant_linear(ctx) -> None:
    """Each 8-bit linear path alone on 8B's shapes, bf16 activations, by the rows of x: the GEMV
    (its tiles and splits at one row), the tl.dot tiles, cuBLAS on a dequantized copy, the W8A8
    product (fp8) and bf16 cuBLAS: where each wins, which sets GEMV_ROWS and DEQUANT_ROWS
    (triton_quant_linear.py). torch's int8 matmul, which the CPU uses, took milliseconds a call
    on a GPU (benchmarks/results/gpu-*): not a GPU path, so not timed. The section fails, after
    timing all it can, where a W8A16 path errs past W8A16_ERR_LIMIT or any path raises."""
    seen = {"worst": 0.0, "failed": []}
    _time_quant_linear_paths(ctx, seen)
    if seen["worst"] > W8A16_ERR_LIMIT or seen["failed"]:
        raise AssertionError(f"worst W8A16 error {seen['worst']:.3g} (limit {W8A16_ERR_LIMIT:.3g}); "
                             f"paths that raised: {seen['failed']}")


def _time_quant_linear_paths(ctx, seen: dict) -> None:
    """sec_quant_linear's figures; `seen` gathers the worst W8A16 error and the paths that raised."""
    import torch
    import torch.nn.functional as F

    from nanoserve.kernels import fp8_w8a8
    from nanoserve.kernels import triton_quant_linear as tq
    from nanoserve.kernels.quantization import dequantize_weight, quantize_weight
    key, dev = "dry" if ctx.dry else "gpu", ctx.dev
    reps = 2 if ctx.dry else 10

    def us(fn) -> float:
        """Device time per call: on a GPU `reps` calls replayed from a CUDA graph, as a decode step
        runs them, so a Triton launch's host cost (tens of us) is not counted."""
        fn()
        run = lambda: [fn() for _ in range(reps)]
        if dev == "cuda":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            run = graph.replay
        times = [ctx.timed(run) / reps for _ in range(5)]
        return statistics.median(times) * 1e6
    ctx.info(gemv_rows=tq.GEMV_ROWS, dequant_rows=tq.DEQUANT_ROWS, gemv_configs=GEMV_CONFIGS,
             paths="gemv (<= 16 rows), tiled, dequant (dequantize + F.linear), w8a8 (fp8), "
                   "bf16 (F.linear on the bf16 weight), default",
             timing="CUDA graph of 10 calls, replayed; median of 5" if dev == "cuda" else "wall time")
    if fp8_w8a8.has_fp8_tensor_cores(dev) or ctx.dry:
        w8a8_rounding(ctx, 3 if ctx.dry else 40)
    for n, k in QUANT_SHAPES[key]:
        w = torch.randn(n, k, device=dev) * 0.02
        w16 = w.bfloat16()
        for method in ("int8", "fp8"):
            if ctx.left() < 10:
                return ctx.info(stopped_at=f"{n}x{k} {method}: time budget")
            q, s = quantize_weight(w, method)
            w_ref = dequantize_weight(q, s)  # fp32: the reference's weight
            code_bytes = n * k + 4 * n
            x1 = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
            for bn, bk, split, warps in GEMV_CONFIGS if dev == "cuda" else GEMV_CONFIGS[:2]:
                t = us(lambda: tq.gemv(x1, q, s, None, bn, bk, split, warps))
                ctx.fig(f"{n}x{k}_{method}_gemv_n{bn}_k{bk}_s{split}_w{warps}_GBps", code_bytes / t / 1e3,
                        "GB/s (codes and scales read / time, one row)")
            for m in TILED_ROWS[key]:
                if ctx.left() < 10:
                    return ctx.info(stopped_at=f"{n}x{k} {method} tiles at {m} rows: time budget")
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                configs = TILED_CONFIGS if dev == "cuda" else TILED_CONFIGS[2:4]
                for bn, bk, split, warps, stages, swap in configs:
                    t = us(lambda: tq.tiled(x, q, s, None, bk, bn, split, warps, stages, swap))
                    ctx.fig(f"{n}x{k}_{method}_M{m}_tiled_n{bn}_k{bk}_s{split}_w{warps}_p{stages}"
                            f"{'_swap' if swap else ''}_us", t, "us per call")
            for m in QUANT_ROWS[key]:
                if ctx.left() < 5:
                    return ctx.info(stopped_at=f"{n}x{k} {method} {m} rows: time budget")
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                paths = {"default": lambda: tq.quantized_linear(x, q, s), "bf16": lambda: F.linear(x, w16),
                         "tiled": lambda: tq.tiled(x, q, s, None),
                         "dequant": lambda: F.linear(x, tq.dequantize(q, s, x.dtype))}
                if m <= 16:
                    paths["gemv"] = lambda: tq.gemv(x, q, s, None)
                if method == "fp8" and fp8_w8a8.has_fp8_tensor_cores(dev):
                    paths["w8a8"] = lambda: fp8_w8a8.fp8_w8a8_linear(x, q, s)
                want = F.linear(x.float(), w_ref)
                for name, fn in paths.items():
                    try:
                        if name != "bf16":  # the others against the reference, in fp32: a bf16 output's
                            # rounding is 2^-8 of it, W8A8's rounding of x up to 2^-4 of each product
                            err = ((fn().float() - want).abs().max() / want.abs().max()).item()
                            ctx.fig(f"{n}x{k}_{method}_M{m}_{name}_rel_err", err,
                                    "largest |error| / largest |output|")
                            if name != "w8a8":  # kept current, as the budget may stop the loops
                                seen["worst"] = max(seen["worst"], err)
                                ctx.fig("w8a16_worst_rel_err", seen["worst"], "over every shape, rows "
                                        "and W8A16 path so far (bf16 output: about 2^-8 expected)")
                        ctx.fig(f"{n}x{k}_{method}_M{m}_{name}_us", us(fn), "us per call")
                    except Exception as e:  # one path that fails (or won't capture) leaves the rest
                        seen["failed"].append(f"{n}x{k}_{method}_M{m}_{name}")
                        ctx.info(**{f"{n}x{k}_{method}_M{m}_{name}_error": f"{type(e).__name__}: {e}"[:200]})
