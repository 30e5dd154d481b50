"""LLMEngine (add_request / step / abort) and LLM (generate, stream), as in vLLM.

The engine owns the clock, the requests, the scheduler and the runner. One `step()` is
one scheduler iteration: schedule -> execute -> update; it returns one cumulative
RequestOutput per request that got a new token. Requests carry an arrival time and are
only scheduled once the engine clock passes it, so a workload can be replayed in real
time (bench.py) or on a simulated clock (sim.py, which swaps the runner for a cost model).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from itertools import count
from typing import Callable, Iterable, Iterator

import torch

from nanoserve.config import EngineConfig, ModelConfig, default_device
from nanoserve.kv_cache import KVCacheManager
from nanoserve.outputs import RequestOutput
from nanoserve.request import Request
from nanoserve.sampling_params import SamplingParams
from nanoserve.scheduler import Scheduler, SchedulerOutput


@dataclass
class StepRecord:
    """One step of the trace: when it ran and what it computed."""

    step: int
    start: float
    end: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    kv_usage: float
    preempted: list[str]
    entries: list[tuple[str, str, int]] = field(default_factory=list)  # (request_id, "prefill"|"decode", tokens)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


class LLMEngine:
    """The serving loop over a model (or, in the simulator, over a cost model).

    `executor(SchedulerOutput) -> {request_id: token}` runs a step; by default a ModelRunner.
    `scheduler_cls` lets a student's scheduler replace ours (same constructor and methods).
    """

    def __init__(self, model: str | ModelConfig | None = None, device: str | None = None,
                 dtype: str | None = None, seed: int = 0, config: EngineConfig | None = None,
                 scheduler_cls=None,
                 clock: Callable[[], float] = time.perf_counter, *, model_config: ModelConfig | None = None,
                 executor=None, tokenizer=None):
        self.config = config = config or EngineConfig()
        self.clock = clock
        self.tokenizer = tokenizer
        if executor is None:  # a real model
            from nanoserve.model import load_model
            from nanoserve.model.loader import resolve_dtype
            from nanoserve.runner import ModelRunner, num_kv_blocks_for
            device = device or default_device()
            dtype = resolve_dtype(dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
            torch.manual_seed(seed)
            model, model_config, folder = load_model(model or default_model(), device, dtype, seed)
            if self.tokenizer is None and folder is not None:
                self.tokenizer = load_tokenizer(folder)
            self.max_model_len = self._max_model_len(model_config)
            num_blocks = num_kv_blocks_for(config, model_config, dtype, device, self.max_model_len)
            executor = ModelRunner(model, model_config, config, device, dtype, num_blocks, seed)
            self.model = model
        else:
            self.max_model_len = self._max_model_len(model_config)
            num_blocks = config.num_kv_blocks
            if num_blocks is None:
                raise ValueError("an engine with a custom executor needs EngineConfig.num_kv_blocks")
        self.model_config, self.device, self.dtype = model_config, device, dtype
        self.executor = executor
        self.num_kv_blocks = num_blocks
        self.kv_manager = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = (scheduler_cls or Scheduler)(config, self.kv_manager)
        self.requests: dict[str, Request] = {}
        self.trace: list[StepRecord] = []
        self._ids = count()

    def _max_model_len(self, mcfg: ModelConfig) -> int:
        limit = mcfg.max_position_embeddings
        if self.config.max_model_len is not None and self.config.max_model_len > limit:
            raise ValueError(f"max_model_len={self.config.max_model_len} exceeds the model's "
                             f"max_position_embeddings={limit}")
        return self.config.max_model_len or limit

    @property
    def stats(self):
        return self.scheduler.stats

    # -- requests -----------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None, request_id: str | None = None) -> str:
        params = params or SamplingParams()
        prompt_token_ids = list(prompt_token_ids)
        if not prompt_token_ids:
            raise ValueError("prompt is empty: a request needs at least one prompt token")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        n = len(prompt_token_ids)
        if n > self.max_model_len:
            raise ValueError(f"prompt of {n} tokens is longer than max_model_len={self.max_model_len}")
        need = self.kv_manager.blocks_needed(min(n + params.max_tokens, self.max_model_len))
        if need > self.num_kv_blocks:
            raise ValueError(
                f"request needs {need} KV blocks ({n} prompt + up to {params.max_tokens} output "
                f"tokens, block_size={self.config.block_size}) but the cache has only "
                f"num_kv_blocks={self.num_kv_blocks}")
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        req = Request(request_id, prompt_token_ids, params,
                      self.clock() if arrival_time is None else arrival_time, self.max_model_len,
                      self.model_config.eos_token_ids)
        self.requests[request_id] = req
        self.scheduler.add_request(req)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks. -> its final output (None if unknown/finished)."""
        req = self.scheduler.abort(request_id)
        if req is None:
            return None
        req.metrics.finished_time = self.clock()
        self._forget(req)
        return req.to_output(self._text(req))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def next_arrival(self) -> float | None:
        """Arrival time of the first request still waiting (for idle waits in replays)."""
        return self.scheduler.next_arrival()

    # -- the loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start = self.clock()
        out = self.scheduler.schedule(start)
        if out.is_empty:
            return []
        sampled = self.executor.execute(out) if hasattr(self.executor, "execute") else self.executor(out)
        end = self.clock()
        progressed = self.scheduler.update_from_output(out, sampled, end)
        if self.config.record_trace:
            self.trace.append(self._record(out, start, end))
        outputs = []
        for req in progressed:
            if req.is_finished:
                self._forget(req)
            outputs.append(req.to_output(self._text(req) if req.is_finished else None))
        return outputs

    def _record(self, out: SchedulerOutput, start: float, end: float) -> StepRecord:
        return StepRecord(
            step=self.stats.steps - 1, start=start, end=end, num_prefill_tokens=out.num_prefill_tokens,
            num_decode_tokens=out.num_decode_tokens, num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting), kv_usage=self.kv_manager.usage,
            preempted=out.preempted,
            entries=[(s.request_id, "decode" if s.is_decode else "prefill", len(s.token_ids))
                     for s in out.seqs])

    def _forget(self, req: Request) -> None:
        self.requests.pop(req.request_id, None)
        sampler = getattr(self.executor, "sampler", None)
        if sampler is not None:
            sampler.forget(req.request_id)

    def _text(self, req: Request) -> str | None:
        return self.tokenizer.decode(req.output_token_ids) if self.tokenizer else None

    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a model with a tokenizer; pass token ids instead")
            return self.tokenizer.encode(prompt)
        return list(prompt)


class Tokenizer:
    """A thin wrapper over a `tokenizers` tokenizer.json (what HF fast tokenizers save)."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer as HFTokenizer
        self.tok = HFTokenizer.from_file(path)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(folder: str) -> Tokenizer | None:
    path = os.path.join(folder, "tokenizer.json")
    return Tokenizer(path) if os.path.isfile(path) else None


def default_model() -> str:
    """The embedded demo model when it is installed, else a tiny random preset."""
    from nanoserve.model import DEMO_MODEL_DIR
    return DEMO_MODEL_DIR if os.path.isfile(os.path.join(DEMO_MODEL_DIR, "config.json")) else "preset:tiny"


class LLM:
    """Offline batch inference over an LLMEngine: `generate` and `stream`."""

    def __init__(self, model: str | None = None, device: str | None = None, dtype: str | None = None,
                 seed: int = 0, config: EngineConfig | None = None, scheduler=None, **kwargs):
        self.engine = LLMEngine(model, device, dtype, seed, config, scheduler_cls=scheduler, **kwargs)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def _add(self, prompts, params) -> list[str]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        token_lists = [self.engine.encode(p) for p in prompts]  # validate all before adding any
        return [self.engine.add_request(t, p or SamplingParams()) for t, p in zip(token_lists, params_list)]

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts (strings or token-id lists) to completion. -> outputs in prompt order."""
        ids = self._add(prompts, params)
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(ids), desc="generate", unit="req")
        while len(final) < len(ids):
            steps = self.engine.stats.steps
            outs = self.engine.step()
            if self.engine.stats.steps == steps and not outs:
                self._check_progress()
            for o in outs:
                if o.finished:
                    final[o.request_id] = o
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [final[i] for i in ids]

    def _check_progress(self) -> None:
        """A step that scheduled nothing while arrived requests wait can only repeat forever."""
        nxt = self.engine.next_arrival()
        if nxt is None or nxt <= self.engine.clock():
            stuck = [r.request_id for r in self.engine.scheduler.waiting]
            raise RuntimeError(f"the scheduler scheduled nothing while requests {stuck[:5]} wait "
                               "(is a prompt larger than max_num_batched_tokens without chunking?)")

    def stream(self, prompts, params: SamplingParams | list[SamplingParams] | None = None
               ) -> Iterator[RequestOutput]:
        """Yield an output each time a request gets tokens; `new_token_ids` holds the delta and
        `metrics.token_times[-len(new_token_ids):]` their timestamps. Closing the iterator
        aborts what is left."""
        ids = set(self._add(prompts, params))
        try:
            while ids:
                steps = self.engine.stats.steps
                outs = self.engine.step()
                if self.engine.stats.steps == steps and not outs:
                    self._check_progress()
                for o in outs:
                    if o.request_id in ids:
                        if o.finished:
                            ids.discard(o.request_id)
                        yield o
        finally:
            for rid in ids:
                self.engine.abort(rid)

    def decode(self, token_ids: Iterable[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, token_ids))
        return self.tokenizer.decode(list(token_ids))
