"""Lesson 02: generating with and without a KV cache; its bytes per token, per request and per
GPU, checked against the engine's allocator; paged blocks against contiguous reservations."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from nanoserve.course.setup import Table, engine_of, fresh_engine, generate, progress_bar
from nanoserve.engine.kv_cache import kv_bytes_per_block, kv_bytes_per_token, num_blocks_in
from nanoserve.measure.metrics import itls, prefill_time
from nanoserve.measure.roofline import dtype_bytes, dtype_name, step_cost
from nanoserve.measure.workload import Uniform, Workload, greedy_params, synthetic
from nanoserve.presets import preset_config


@dataclass
class Generation:
    """Greedy generation timed token by token. `positions` are the generated tokens timed
    (0 = the first, whose time includes the prompt's prefill) and `seconds` the median time of
    each over repeats; `total` is the whole measured generation (the first repeat)."""

    token_ids: list[int]
    positions: list[int]
    seconds: list[float]
    total: float


def generate_with_cache(llm, prompt_ids: Sequence[int], max_tokens: int, reps: int = 3) -> Generation:
    """Greedy generation the engine's way: prefill once, then one cached decode step per token.
    After a warm-up, `reps` runs; each token's time is its median over them."""
    engine = fresh_engine(llm, enable_prefix_caching=False, enable_chunked_prefill=False,
                          max_num_batched_tokens=len(prompt_ids) + max_tokens)
    generate(engine, [list(prompt_ids)], greedy_params(2))  # warm-up
    runs = [generate(engine, [list(prompt_ids)], greedy_params(max_tokens))[0] for _ in range(max(1, reps))]
    times = [[prefill_time(o), *itls(o)] for o in runs]
    return Generation(list(runs[0].token_ids), list(range(max_tokens)),
                      [statistics.median(t) for t in zip(*times)], sum(times[0]))


def generate_without_cache(llm, prompt_ids: Sequence[int], max_tokens: int, reps: int = 3, every: int = 4,
                           progress: bool = True) -> Generation:
    """Greedy generation with no KV cache kept between tokens: every token recomputes the whole
    sequence so far (a fresh one-step prefill of prompt + generated tokens), timed once in full
    (the total). Every `every`-th token (and the last) is timed `reps` times in all, on the same
    sequence, and the median kept: the recompute is the expensive path, so repeating it at every
    token would cost `reps` times as much for the same curve."""
    ids = list(prompt_ids)
    engine = fresh_engine(llm, enable_prefix_caching=False, enable_chunked_prefill=False,
                          max_num_batched_tokens=len(ids) + max_tokens)
    generate(engine, [ids], greedy_params(1))  # warm-up
    out, positions, secs, total = [], [], [], 0.0
    with progress_bar(max_tokens, "recompute every token", progress) as bar:
        for i in range(max_tokens):
            o, = generate(engine, [ids], greedy_params(1))
            times = [prefill_time(o)]
            total += times[0]
            if i % every == 0 or i == max_tokens - 1:
                times += [prefill_time(generate(engine, [ids], greedy_params(1))[0]) for _ in range(reps - 1)]
                positions.append(i)
                secs.append(statistics.median(times))
            out.append(o.token_ids[0])
            ids.append(o.token_ids[0])
            bar.update(1)
    return Generation(out, positions, secs, total)


def cache_table(llm, prompt_len: int, with_cache: Generation, without: Generation) -> Table:
    """Measured totals beside the FLOPs each way would do (counted)."""
    cfg, n = engine_of(llm).model_config, len(with_cache.token_ids)
    flops_with = step_cost(cfg, [(prompt_len, prompt_len)]).total_flops + sum(
        step_cost(cfg, [(1, prompt_len + i + 1)]).total_flops for i in range(n - 1))
    flops_without = sum(step_cost(cfg, [(prompt_len + i, prompt_len + i)]).total_flops for i in range(n))
    rows = [{"": "with KV cache", "seconds (measured)": with_cache.total,
             "GFLOP (counted)": flops_with / 1e9},
            {"": "recompute, no cache", "seconds (measured)": without.total,
             "GFLOP (counted)": flops_without / 1e9},
            {"": "ratio", "seconds (measured)": without.total / with_cache.total,
             "GFLOP (counted)": flops_without / flops_with}]
    return Table(rows, f"{n} tokens after a {prompt_len}-token prompt; same tokens: "
                 f"{with_cache.token_ids == without.token_ids}")


def kv_budget_table(models: Sequence[str] = ("llama-120m", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3-8b"),
                    dtype: str = "bfloat16", context: int = 4096, gpu_memory: float = 80e9,
                    utilization: float = 0.92) -> Table:
    """KV bytes per token, per request of `context` tokens, and how many fit on one GPU of
    gpu_memory bytes after the weights, as vLLM sizes its cache: `utilization` of the memory for
    weights and cache (vLLM 0.32.0's default gpu_memory_utilization, vllm/config/cache.py).
    Formula only: modelled."""
    rows = []
    for name in models:
        cfg = preset_config(name)
        per_tok = kv_bytes_per_token(cfg, dtype_name(dtype))
        weights = cfg.num_params() * dtype_bytes(dtype)
        tokens = num_blocks_in(gpu_memory * utilization - weights, cfg, dtype_name(dtype), 1)
        rows.append({"model": name, "layers x kv heads x head dim":
                     f"{cfg.num_hidden_layers} x {cfg.num_key_value_heads} x {cfg.head_dim}",
                     "KiB/token": per_tok / 1024, f"MiB/request ({context})": per_tok * context / 2**20,
                     "weights GB": round(weights / 1e9, 2), "tokens/GPU": tokens,
                     "requests/GPU": tokens // context})
    return Table(rows, f"KV cache in {dtype_name(dtype)} on a {gpu_memory / 1e9:.0f} GB GPU at "
                 f"{utilization:.0%} utilization (formula, modelled)", ".4g")


@dataclass
class AllocatorCheck:
    num_blocks: int
    block_size: int
    bytes_per_block: int  # formula
    allocated_bytes: int  # sum of the cache tensors' nbytes
    tensor_shape: tuple
    num_tensors: int

    @property
    def formula_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def matches(self) -> bool:
        return self.formula_bytes == self.allocated_bytes

    def table(self) -> Table:
        rows = [{"": "blocks x tokens/block", "value": f"{self.num_blocks} x {self.block_size}"},
                {"": "formula: bytes/block", "value": self.bytes_per_block},
                {"": "formula: total bytes", "value": self.formula_bytes},
                {"": f"allocator: {self.num_tensors} tensors of {list(self.tensor_shape)}",
                 "value": self.allocated_bytes},
                {"": "equal", "value": self.matches}]
        return Table(rows, "The formula against the engine's KV tensors")


def check_kv_allocator(llm) -> AllocatorCheck:
    """The formula's bytes for the engine's num_kv_blocks against the tensors it allocated."""
    engine = engine_of(llm)
    caches = engine.executor.kv_caches  # per layer (k_cache, v_cache)
    tensors = [t for kv in caches for t in kv]
    per_block = kv_bytes_per_block(engine.model_config, engine.config.block_size, engine.kv_cache_dtype)
    return AllocatorCheck(engine.num_kv_blocks, engine.config.block_size, per_block,
                          sum(t.nbytes for t in tensors), tuple(tensors[0].shape), len(tensors))


@dataclass
class FragmentationRun:
    """KV slots over a run: tokens stored, slots held by the paged allocator, and what two
    contiguous schemes would have reserved for the same running requests: room for the longest
    output the server allows (`max_tokens_cap`; it can't know which request stops early), or
    for max_model_len."""

    block_size: int
    max_model_len: int
    max_tokens_cap: int
    tokens: list[int] = field(default_factory=list)  # KV entries written, per step
    paged: list[int] = field(default_factory=list)  # blocks held * block_size
    reserve_request: list[int] = field(default_factory=list)  # sum of prompt + max_tokens_cap
    reserve_max_len: list[int] = field(default_factory=list)  # running requests * max_model_len
    running: list[int] = field(default_factory=list)
    snapshot: dict[str, tuple[list[int], int]] = field(default_factory=dict)  # at peak: blocks, tokens

    def table(self) -> Table:
        """Share of reserved slots that hold a token, and how many requests each scheme fits
        in the memory the paged allocator needed at its peak (average reservation per request)."""
        used, memory = sum(self.tokens), max(self.paged)
        rows = []
        for name, slots in (("paged blocks", self.paged),
                            (f"contiguous, prompt + {self.max_tokens_cap}", self.reserve_request),
                            ("contiguous, max_model_len", self.reserve_max_len)):
            per_request = sum(slots) / sum(self.running)
            rows.append({"allocation": name, "slots holding a token": f"{100 * used / sum(slots):.1f}%",
                         "slots per request": round(per_request, 1),
                         f"requests in {memory} slots": round(memory / per_request, 1)})
        return Table(rows, f"KV slots over the run (block_size={self.block_size}, "
                     f"max_model_len={self.max_model_len}), read from the allocator")


def fragmentation_run(llm, workload: Workload, max_num_seqs: int, max_tokens_cap: int | None = None,
                      progress: bool = True) -> FragmentationRun:
    """Serve `workload` (all at once) and read the allocator after every step.
    max_tokens_cap: the output room a contiguous cache reserves (default: the longest output)."""
    cap = max_tokens_cap or max(workload.output_lens)
    engine = fresh_engine(llm, enable_prefix_caching=False, max_num_seqs=max_num_seqs)
    for r in workload:
        engine.add_request(r.prompt_token_ids, r.params)
    run = FragmentationRun(engine.config.block_size, engine.max_model_len, cap)
    kv, bs = engine.kv_manager, engine.config.block_size
    with progress_bar(len(workload), "serving", progress) as bar:
        while engine.has_unfinished():
            bar.update(sum(o.finished for o in engine.step()))
            running = engine.scheduler.running
            tokens = sum(r.num_computed_tokens for r in running)
            run.tokens.append(tokens)
            run.paged.append(sum(len(kv.req_to_blocks.get(r.request_id, ())) for r in running) * bs)
            run.reserve_request.append(sum(min(r.num_prompt_tokens + cap, r.max_len) for r in running))
            run.reserve_max_len.append(len(running) * engine.max_model_len)
            run.running.append(len(running))
            if tokens >= max(run.tokens):
                run.snapshot = {r.request_id: (kv.block_ids(r.request_id), r.num_computed_tokens)
                                for r in running}
    return run


def fragmentation_workload(llm, num_requests: int, input_median: int, output_median: int,
                           seed: int = 0) -> Workload:
    """Requests of varied lengths (uniform from a quarter to twice each median), all at t=0."""
    vocab = engine_of(llm).model_config.vocab_size
    return synthetic(num_requests, Uniform(max(1, input_median // 4), 2 * input_median),
                     Uniform(max(1, output_median // 4), 2 * output_median), seed=seed,
                     vocab_size=vocab, token_low=min(10, vocab - 1), name="varied lengths")
