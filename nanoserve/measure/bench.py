"""The benchmark harness: replay a workload against the engine in real time, then measure it.

`replay` submits each request of a Workload when the wall clock reaches its arrival time (the
same loop as the simulator's, `sim.drive`, on the real clock), steps the engine until every
request finishes, and returns a `BenchResult`: the final outputs in workload order, this run's
slice of the engine's step trace, serving metrics, figures (figures.py) and, given the device's
measured ceilings, how close the steps came to the roofline (MBU for decode, MFU for prefill).
`drive` is the loop that feeds a workload to an engine, on the real clock here and on the
simulator's clock in nanoserve.sim. `scheduler_overhead` measures how much of a decode step is
bookkeeping rather than model. `main` is `python -m nanoserve bench`.

Deliberately left out: comparisons with other engines (benchmarks/peers.py) and simulated
time (nanoserve.sim); everything here is measured on the device the engine runs on.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from nanoserve import cli
from nanoserve.config import EngineConfig, ModelConfig
from nanoserve.engine import LLM, LLMEngine, ModelRunner, StepRecord, engine_of
from nanoserve.engine.kv_cache import kv_cache_torch_dtype
from nanoserve.measure import figures, roofline
from nanoserve.measure.figures import device_label
from nanoserve.measure.metrics import ServingMetrics, compute_metrics
from nanoserve.measure.workload import Workload, interference, shared_prefix, synthetic
from nanoserve.outputs import RequestOutput
from nanoserve.sampling_params import SamplingParams


def drive(engine, workload: Workload, wait_until: Callable[[float], None],
          start: float = 0.0) -> list[RequestOutput]:
    """Submit each request when the engine's clock reaches start + its arrival time (request id:
    its index in the workload), step until all finish, wait for the next arrival when idle.
    -> final outputs in workload order. The same loop serves the real and the simulated clock."""
    reqs = workload.requests
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time)
    final: dict[str, RequestOutput] = {}
    k = 0
    while k < len(order) or engine.has_unfinished():
        now = engine.clock()
        while k < len(order) and start + reqs[order[k]].arrival_time <= now:
            r = reqs[order[k]]
            engine.add_request(r.prompt_token_ids, r.params, start + r.arrival_time, str(order[k]))
            k += 1
        if not engine.has_unfinished():
            wait_until(start + reqs[order[k]].arrival_time)
            continue
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    return [final[str(i)] for i in range(len(reqs))]



@dataclass
class Efficiency:
    """How close this run's steps came to the device's measured ceilings (medians over steps)."""

    decode_steps: int
    decode_batch: float  # median sequences per decode-only step
    decode_step_time: float  # seconds, median decode-only step
    decode_floor: float  # seconds, roofline floor of that median step
    decode_mbu: float  # achieved bytes/s over the weight-read bandwidth
    prefill_steps: int  # steps with any prefill token
    prefill_mfu: float  # achieved FLOP/s over the matmul peak

    def table(self) -> str:
        return "\n".join([
            f"{'Decode-only steps (median batch)':<42}{self.decode_steps:>8} ({self.decode_batch:g})",
            f"{'Decode step time / roofline floor (ms)':<42}"
            f"{1e3 * self.decode_step_time:>8.2f} / {1e3 * self.decode_floor:.2f}",
            f"{'Decode MBU (%)':<42}{100 * self.decode_mbu:>8.1f}",
            f"{'Prefill steps, MFU (%)':<42}{self.prefill_steps:>8}, {100 * self.prefill_mfu:.1f}"])


@dataclass
class BenchResult:
    """One replay: what was sent, what came back, and every step the engine took for it."""

    workload: Workload
    outputs: list[RequestOutput]  # final output per workload request, in workload order
    trace: list[StepRecord]  # this run's steps only
    start: float  # engine-clock time of the workload's t=0
    duration: float  # seconds from t=0 until the last request finished
    device_label: str
    model_config: ModelConfig
    dtype: str
    config: EngineConfig

    def metrics(self, slo: str | dict | None = None) -> ServingMetrics:
        return compute_metrics(self.outputs, slo=slo)

    def efficiency(self, ceilings: roofline.DeviceCeilings) -> Efficiency:
        """Each step's FLOPs and bytes (roofline.step_cost of its rebuilt batch) over its time."""
        nbytes = roofline.dtype_bytes(self.dtype)
        kv_bytes = kv_cache_torch_dtype(self.config.kv_cache_dtype, self.dtype).itemsize
        decode, prefill = [], []
        for rec in self.trace:
            cost = roofline.step_cost(self.model_config, rec.batch(), nbytes, kv_bytes)
            (prefill if rec.num_prefill_tokens else decode).append((rec, cost))
        nan = math.nan
        med = (lambda xs: statistics.median(xs) if xs else nan)
        mid = sorted(decode, key=lambda rc: rc[0].duration)[len(decode) // 2] if decode else None
        return Efficiency(
            decode_steps=len(decode), decode_batch=med([r.num_decode_tokens for r, _ in decode]),
            decode_step_time=mid[0].duration if mid else nan,
            decode_floor=roofline.roofline_time(mid[1], ceilings, self.dtype) if mid else nan,
            decode_mbu=med([roofline.mbu(c, r.duration, ceilings) for r, c in decode]),
            prefill_steps=len(prefill),
            prefill_mfu=med([roofline.mfu(c, r.duration, ceilings, self.dtype) for r, c in prefill]))

    def table(self, slo: str | dict | None = None,
              ceilings: roofline.DeviceCeilings | None = None) -> str:
        c = self.config
        head = [f"{self.workload.name}: {self.workload.description}",
                f"{self.device_label}; max_num_seqs={c.max_num_seqs}, "
                f"max_num_batched_tokens={c.max_num_batched_tokens}, chunked_prefill="
                f"{c.enable_chunked_prefill}, prefix_caching={c.enable_prefix_caching}, "
                f"policy={c.scheduling_policy}", ""]
        body = [self.metrics(slo).table(), f"{'Steps':<42}{len(self.trace):>12}"]
        if ceilings is not None:
            body.append(self.efficiency(ceilings).table())
        return "\n".join(head + body)

    def plot_timeline(self, ax=None):
        return figures.plot_timeline(self, ax)

    def plot_latency(self, ax=None):
        return figures.plot_latency(self, ax)

    def plot_step_times(self, ax=None):
        return figures.plot_step_times(self, ax)


class _Progress:
    """The engine, seen through a progress bar that counts finished requests."""

    def __init__(self, engine: LLMEngine, bar):
        self.engine, self.bar = engine, bar
        self.clock, self.add_request, self.has_unfinished = (
            engine.clock, engine.add_request, engine.has_unfinished)

    def step(self) -> list[RequestOutput]:
        outs = self.engine.step()
        self.bar.update(sum(o.finished for o in outs))
        return outs


def _warm_up(engine: LLMEngine, workload: Workload, n: int) -> None:
    """Run the first n requests' shapes once with fresh random prompts (no prefix-cache hits
    on the real ones), so one-time costs (allocation, lazy init) stay out of the run."""
    rng = np.random.default_rng(2**31 - 1)
    vocab = engine.model_config.vocab_size
    for r in workload.requests[:n]:
        prompt = rng.integers(min(10, vocab - 1), vocab, len(r.prompt_token_ids)).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=min(4, r.params.max_tokens),
                                                  temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()


def replay(engine_or_llm: LLMEngine | LLM, workload: Workload, realtime: bool = True,
           progress: bool = True, warmup: int = 1, label: str | None = None) -> BenchResult:
    """Serve `workload` on a real-clock engine. Request i arrives at t0 + its arrival_time;
    realtime=False sends everything at t0 (offline throughput). warmup: how many of the first
    requests' shapes to run before t0. label: the result's device_label, which figures show
    (default: device_label(engine)). The engine must be idle and record its trace."""
    from tqdm.auto import tqdm

    engine = engine_of(engine_or_llm)
    if engine.has_unfinished():
        raise ValueError("replay needs an idle engine: it still has unfinished requests")
    if warmup:
        _warm_up(engine, workload, warmup)
    if not realtime:
        workload = replace(workload, requests=[replace(r, arrival_time=0.0) for r in workload])
    first_step = len(engine.trace)
    # gone once done: a finished bar left in a lesson's output says nothing the results don't
    with tqdm(total=len(workload), desc=workload.name, unit="req", disable=not progress, leave=False) as bar:
        t0 = engine.clock()
        outputs = drive(_Progress(engine, bar), workload,
                        lambda t: time.sleep(max(0.0, t - engine.clock())), t0)
    duration = max(o.metrics.finished_time for o in outputs) - t0 if outputs else 0.0
    return BenchResult(workload, outputs, engine.trace[first_step:], t0, duration,
                       label or device_label(engine), engine.model_config,
                       roofline.dtype_name(engine.dtype), engine.config)


# --- Scheduler and batch-preparation overhead ---

@dataclass
class OverheadReport:
    """Medians over full decode steps at one batch size (seconds)."""

    batch_size: int
    num_steps: int
    step_time: float  # the whole engine.step()
    schedule: float  # scheduler.schedule
    prepare: float  # runner.prepare: the batch's tensors
    update: float  # scheduler.update_from_output: append tokens, finish, free blocks
    fraction: float  # (schedule + prepare + update) / step time, summed over the steps

    def table(self) -> str:
        return (f"batch {self.batch_size}, {self.num_steps} decode steps: step "
                f"{1e3 * self.step_time:.2f} ms, schedule {1e3 * self.schedule:.3f} ms, prepare "
                f"{1e3 * self.prepare:.3f} ms, update {1e3 * self.update:.3f} ms: "
                f"overhead {100 * self.fraction:.1f}% of step time")


def scheduler_overhead(engine_or_llm: LLMEngine | LLM, batch_size: int = 32, input_len: int = 64,
                       output_len: int = 32, seed: int = 0) -> OverheadReport:
    """Time schedule, prepare and update_from_output inside each step of batch_size requests
    decoding together, from the timings the engine and its runner keep of every step."""
    engine = engine_of(engine_or_llm)
    if engine.config.max_num_seqs < batch_size:
        raise ValueError(f"batch_size={batch_size} exceeds max_num_seqs={engine.config.max_num_seqs}")
    if not isinstance(engine.executor, ModelRunner):
        raise ValueError("scheduler_overhead needs an engine over a real model (a ModelRunner)")
    if engine.has_unfinished():
        raise ValueError("scheduler_overhead needs an idle engine: it has unfinished requests")
    wl = synthetic(batch_size, input_len, output_len, seed=seed,
                   vocab_size=engine.model_config.vocab_size)
    for r in wl:
        engine.add_request(r.prompt_token_ids, r.params)
    rows = []
    while engine.has_unfinished():
        t = time.perf_counter()
        if not engine.step():
            continue
        total, s = time.perf_counter() - t, engine.last_step_times  # the engine's own timings
        if s.num_decode_tokens == batch_size and not s.num_prefill_tokens:
            rows.append(dict(total=total, schedule=s.schedule, prepare=engine.executor.prepare_time,
                             update_from_output=s.update))
    if not rows:
        raise RuntimeError(f"no step decoded {batch_size} sequences together; raise "
                           "num_kv_blocks or output_len")
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("total", "schedule", "prepare", "update_from_output")}
    over = sum(r["schedule"] + r["prepare"] + r["update_from_output"] for r in rows)
    return OverheadReport(batch_size, len(rows), med["total"], med["schedule"], med["prepare"],
                          med["update_from_output"], over / sum(r["total"] for r in rows))


# --- `python -m nanoserve bench` ---

def make_workload(kind: str, num_requests: int, input_len: int, output_len: int,
                  rate: float = math.inf, burstiness: float = 1.0, seed: int = 0,
                  vocab_size: int = 32000, prefix_len: int = 512,
                  long_prompt_len: int = 2048) -> Workload:
    """synthetic; shared_prefix (one prefix_len prefix, input_len unique tokens each);
    interference (num_requests decoders, one long_prompt_len prompt arriving at t=1 s)."""
    if kind == "synthetic":
        return synthetic(num_requests, input_len, output_len, rate, burstiness, seed, vocab_size)
    if kind == "shared_prefix":
        return shared_prefix(1, num_requests, prefix_len, input_len, output_len, rate, burstiness,
                             seed=seed, vocab_size=vocab_size)
    if kind == "interference":
        return interference(num_requests, input_len, output_len, long_prompt_len, seed=seed,
                            vocab_size=vocab_size)
    raise ValueError(f"workload kind {kind!r}: choose synthetic, shared_prefix or interference")


def build_parser() -> argparse.ArgumentParser:
    ap = cli.parser("nanoserve bench", main.__doc__)
    a = ap.add_argument
    a("--model", default="preset:llama-120m", help="checkpoint folder, hub id or preset:NAME")
    a("--device", default=None, help="cpu or cuda (default: cuda if present)")
    a("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
      help="weights and KV cache (default: bfloat16 on CUDA, float32 on CPU)")
    a("--workload", default="synthetic", choices=["synthetic", "shared_prefix", "interference"],
      help="synthetic: random prompts; shared_prefix: one prefix, different suffixes; interference: "
      "short requests decoding while long prompts arrive")
    a("--num-requests", type=int, default=32, help="requests in the workload")
    a("--input-len", type=int, default=128, help="prompt tokens per request")
    a("--output-len", type=int, default=64, help="output tokens per request")
    a("--rate", type=float, default=math.inf, help="requests/s ('inf': all at t=0)")
    a("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1 = Poisson")
    a("--prefix-len", type=int, default=512, help="shared_prefix: the shared tokens")
    a("--long-prompt-len", type=int, default=2048, help="interference: the long prompts' tokens")
    a("--seed", type=int, default=0, help="the workload's and the sampler's")
    a("--max-num-seqs", type=int, default=64, help="requests running at once")
    a("--max-num-batched-tokens", type=int, default=512, help="tokens one step computes at most")
    a("--block-size", type=int, default=16, help="tokens per KV block")
    a("--num-kv-blocks", type=int, default=None, help="KV blocks (default: sized from memory)")
    a("--policy", default="continuous", choices=["continuous", "static"],
      help="continuous batching, or static: a batch runs to its end before the next is admitted")
    a("--no-chunked-prefill", action="store_true", help="a prompt's prefill in one step, not chunks")
    a("--no-prefix-caching", action="store_true", help="never reuse the KV of a shared prefix")
    a("--slo", default=None, help="goodput's SLOs, e.g. 'ttft<=500ms,itl_p99<=100ms'")
    a("--warmup", type=int, default=1, help="requests' shapes run before timing")
    a("--no-roofline", action="store_true", help="skip MBU/MFU (no ceilings needed)")
    a("--overhead", type=int, default=0, metavar="BATCH",
      help="also time scheduler + batch preparation at this decode batch (0: don't)")
    a("--plot", default=None, metavar="PNG", help="save timeline/latency/steps here")
    a("--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:
    """`python -m nanoserve bench ...`: replay a workload, print metrics (and MBU/MFU)."""
    args = build_parser().parse_args(argv)
    config = EngineConfig(
        block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=not args.no_prefix_caching, scheduling_policy=args.policy)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed, config=config)
    wl = make_workload(args.workload, args.num_requests, args.input_len, args.output_len,
                       args.rate, args.burstiness, args.seed, llm.engine.model_config.vocab_size,
                       args.prefix_len, args.long_prompt_len)
    result = replay(llm, wl, progress=not args.quiet, warmup=args.warmup)
    ceilings = None if args.no_roofline else roofline.load_or_measure_ceilings(llm.engine.device)
    print(result.table(args.slo, ceilings))
    if args.overhead:
        print("Scheduler + batch preparation: " + scheduler_overhead(llm, args.overhead).table())
    if args.plot:
        figures.save_bench_figure(result, args.plot)
        print(f"figure saved to {args.plot}")
    return 0
