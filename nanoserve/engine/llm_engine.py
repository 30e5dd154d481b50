"""LLMEngine: add_request / step / abort, as vLLM's engine.

The engine owns the clock, the requests, the scheduler and an executor. One `step()` is one
scheduler iteration: schedule -> execute -> update; it returns one cumulative RequestOutput
per request that got a new token. Requests carry an arrival time and are only scheduled once
the engine clock passes it, so a workload can be replayed in real time (measure.bench) or on a
simulated clock (nanoserve.sim, whose executor is a cost model instead of a ModelRunner).

One bad request never harms another: add_request checks everything it is given (InvalidRequest
naming the field) before anything is queued, and a failure while running a step finishes only
the requests it is tied to (finish_reason "error", `error` says what failed, blocks freed; see
executor.py); the engine stays usable.

With `kv_transfer_config` (kv_connector.py) the engine is one half of a disaggregated pair: a
request's `kv_transfer_params` ask it to hand its prompt's KV to a decode instance, or to go on
from KV a prefill instance handed over. vLLM returns the params of a hand-off on
RequestOutput.kv_transfer_params; here they are in `finished_kv_transfer_params` after the step
that finished the request. `shutdown()` releases what the connector holds.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from dataclasses import asdict, dataclass
from itertools import count
from typing import Callable

from nanoserve.config import EngineConfig, ModelConfig
from nanoserve.engine.executor import Executor, RequestFailed
from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.kv_connector import KVConnectorRole, KVTransferConfig, NullKVConnector
from nanoserve.engine.model_runner import ModelRunner
from nanoserve.engine.request import Request, check_prompt
from nanoserve.engine.scheduler import Scheduler, SchedulerOutput, SchedulerStats
from nanoserve.engine.shm_connector import make_kv_connector
from nanoserve.engine.spec_decode import make_proposer
from nanoserve.engine.trace import StepRecord, TraceEntry
from nanoserve.errors import InvalidRequest, as_real
from nanoserve.outputs import RequestOutput
from nanoserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class EngineStats(SchedulerStats):
    """The scheduler's counters and the engine's step count, as of the moment it was read."""

    steps: int = 0  # steps that ran something


@dataclass
class StepTimes:
    """Wall-clock seconds of the last step's phases (measure/bench.scheduler_overhead reads them)."""

    schedule: float  # scheduler.schedule
    execute: float  # the executor's step (a ModelRunner's `prepare_time` is part of it)
    update: float  # scheduler.update_from_output: append tokens, finish, free blocks
    num_prefill_tokens: int
    num_decode_tokens: int


class LLMEngine:
    """The serving loop over a model (or, in the simulator, over a cost model).

    LLMEngine(model, ...) loads a model and runs it with a ModelRunner;
    LLMEngine.from_executor(executor, config) builds an engine over an executor that already
    exists (a loaded ModelRunner, with a fresh scheduler and KV bookkeeping; a simulator's cost
    model). `scheduler_cls` lets a student's scheduler replace ours, `kv_manager_cls` a student's
    KV cache manager (each with the same constructor and methods as ours).
    """

    def __init__(self, model: str | ModelConfig | None = None, device: str | None = None,
                 dtype: str | None = None, seed: int = 0, config: EngineConfig | None = None,
                 scheduler_cls=None, clock: Callable[[], float] = time.perf_counter,
                 kv_transfer_config=None, kv_manager_cls=None, speculative_config=None,
                 quantization=None, kv_cache_dtype=None):
        config = _with_options(EngineConfig() if config is None else config,
                               speculative_config=speculative_config, quantization=quantization,
                               kv_cache_dtype=kv_cache_dtype)
        _check_options(config, scheduler_cls, clock, kv_manager_cls)  # before the model loads
        kv_transfer_config = _kv_transfer_config(kv_transfer_config)
        self._setup(ModelRunner.load(model, device, dtype, seed, config), config, scheduler_cls,
                    clock, kv_transfer_config, kv_manager_cls)

    @classmethod
    def from_executor(cls, executor: Executor, config: EngineConfig | None = None,
                      scheduler_cls=None, clock: Callable[[], float] = time.perf_counter,
                      kv_transfer_config=None, kv_manager_cls=None,
                      speculative_config=None) -> LLMEngine:
        """An engine over an existing executor. KV blocks: config.num_kv_blocks, else all the
        executor holds; never more than it holds (a simulator's executor holds no memory, so
        config.num_kv_blocks is required there)."""
        config = _with_options(EngineConfig() if config is None else config,
                               speculative_config=speculative_config)
        _check_options(config, scheduler_cls, clock, kv_manager_cls)
        engine = cls.__new__(cls)
        engine._setup(executor, config, scheduler_cls, clock, _kv_transfer_config(kv_transfer_config),
                      kv_manager_cls)
        return engine

    def _setup(self, executor: Executor, config: EngineConfig, scheduler_cls, clock,
               kv_transfer_config: KVTransferConfig | None = None, kv_manager_cls=None) -> None:
        if not isinstance(executor, Executor):
            raise TypeError(f"executor {executor!r} is not a nanoserve.engine.Executor (it needs "
                            "execute_model(scheduler_output) and finish_requests(request_ids))")
        held = getattr(executor, "num_kv_blocks", None)
        num_blocks = config.num_kv_blocks or held
        if num_blocks is None:
            raise ValueError("an engine over an executor that holds no KV memory (a simulation) "
                             "needs EngineConfig.num_kv_blocks")
        if held is not None and num_blocks > held:
            raise ValueError(f"num_kv_blocks={num_blocks} exceeds the {held} blocks the executor "
                             "allocated; load the model with a larger cache")
        self.config, self.clock, self.executor = config, clock, executor
        executor.compile_or_warm_up_model(config)
        self.model_config = executor.model_config
        self.max_model_len = config.max_model_len_for(self.model_config)
        self.num_kv_blocks = num_blocks
        self.kv_manager = (kv_manager_cls or KVCacheManager)(num_blocks, config.block_size,
                                                             config.enable_prefix_caching)
        self.scheduler = (scheduler_cls or Scheduler)(config, self.kv_manager)
        # the scheduler side; the worker side is executor.kv_connector
        self.kv_connector = NullKVConnector()
        if kv_transfer_config is not None:
            executor.init_kv_connector(kv_transfer_config)
            self.kv_connector = make_kv_connector(
                kv_transfer_config, KVConnectorRole.SCHEDULER, executor.kv_connector.layout,
                config.block_size, self.model_config.vocab_size)
        self.scheduler.connector = self.kv_connector
        # drafts tokens between steps (speculative decoding; the NullProposer drafts none)
        self.proposer = make_proposer(config, executor, num_blocks)
        self.requests: dict[str, Request] = {}
        self.trace: list[StepRecord] = []
        self.num_steps = 0
        self.last_step_times: StepTimes | None = None  # of the last step that ran something
        self._ids = count()

    # what the executor runs on: None in a simulation
    @property
    def model(self):
        return self.executor.model

    @property
    def device(self) -> str | None:
        return None if self.executor.device is None else str(self.executor.device)

    @property
    def dtype(self):
        return self.executor.dtype

    @property
    def kv_cache_dtype(self):
        """The torch dtype the KV cache stores (EngineConfig.kv_cache_dtype resolved): the
        model's dtype, or torch.float8_e4m3fn for "fp8"."""
        return getattr(self.executor, "kv_cache_dtype", self.dtype)

    @property
    def tokenizer(self):
        return self.executor.tokenizer

    @property
    def model_name(self) -> str | None:
        return self.executor.model_name

    @property
    def model_path(self) -> str | None:
        """The checkpoint folder the model was loaded from (None: a preset or a cost model)."""
        return self.executor.model_path

    @property
    def finished_kv_transfer_params(self) -> dict[str, dict]:
        """{request_id: kv_transfer_params} of hand-offs finished by the last step() (a prefill
        instance's answer to do_remote_decode: what the decode instance needs)."""
        return self.scheduler.finished_kv_transfer_params

    @property
    def stats(self) -> EngineStats:
        return EngineStats(**asdict(self.scheduler.stats), steps=self.num_steps)

    # -- requests -----------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None, request_id: str | None = None,
                    kv_transfer_params: dict | None = None) -> str:
        """Queue a request. It is scheduled once the engine clock reaches arrival_time (default:
        now). -> its request id. Bad input raises InvalidRequest (a ValueError) naming the field
        and the value; nothing already queued or running is touched. The engine keeps its own
        checked copy of `params`: changing the caller's object later changes nothing here.
        kv_transfer_params: vLLM's, for a KV connector (see the module docstring)."""
        if params is None:
            params = SamplingParams()
        elif isinstance(params, SamplingParams):
            params = dataclasses.replace(params)  # a copy, checked again by __post_init__
        else:
            raise InvalidRequest("sampling_params", f"params={params!r} must be a SamplingParams")
        prompt = check_prompt(prompt_token_ids, self.model_config.vocab_size, self.max_model_len)
        vocab, n = self.model_config.vocab_size, len(prompt)
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:  # as vLLM's _validate_stop_token_ids
            raise InvalidRequest("stop_token_ids", f"stop_token_ids entry {bad[0]} is outside the "
                                                   f"vocabulary [0, {vocab})")
        need = self.kv_manager.blocks_needed(min(n + params.max_tokens, self.max_model_len))
        if need > self.num_kv_blocks:
            raise InvalidRequest(
                "prompt" if self.kv_manager.blocks_needed(n + 1) > self.num_kv_blocks else "max_tokens",
                f"request needs {need} KV blocks ({n} prompt + up to {params.max_tokens} output "
                f"tokens, block_size={self.config.block_size}) but the cache has only "
                f"num_kv_blocks={self.num_kv_blocks}")
        if arrival_time is None:
            arrival_time = self.clock()
        else:
            arrival_time = as_real("arrival_time", arrival_time)
        if request_id is None:
            request_id = next(i for i in map(str, self._ids) if i not in self.requests)
        elif not isinstance(request_id, str) or not request_id:
            raise InvalidRequest("request_id", f"request_id={request_id!r} must be a non-empty string")
        elif request_id in self.requests:
            raise InvalidRequest("request_id", f"request_id {request_id!r} is already in use")
        if kv_transfer_params is not None and not isinstance(kv_transfer_params, dict):
            raise InvalidRequest("kv_transfer_params", f"kv_transfer_params={kv_transfer_params!r} "
                                                       "must be a dict")
        req = Request(request_id, prompt, params, arrival_time, self.max_model_len,
                      self.model_config.eos_token_ids, kv_transfer_params)
        self.scheduler.add_request(req)  # the connector may refuse it: then nothing is kept
        self.requests[request_id] = req
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks. -> its final output (None if unknown/finished)."""
        req = self.scheduler.abort(request_id)
        if req is None:
            return None
        req.metrics.finished_time = self.clock()
        self._forget([req])
        return req.to_output(self._text(req))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def waiting_request_ids(self) -> list[str]:
        """The requests queued for admission, in the order they will be admitted."""
        return [r.request_id for r in self.scheduler.waiting]

    def next_arrival(self) -> float | None:
        """Arrival time of the first request still waiting (for idle waits in replays)."""
        return self.scheduler.next_arrival()

    # -- the loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler iteration: schedule what runs at the current clock, execute it, append
        the sampled tokens. -> one cumulative RequestOutput per request that got a token or
        failed (finish_reason "error"); empty when nothing could run: no request has arrived,
        or all are blocked."""
        start = self.clock()
        self.scheduler.finished_kv_transfer_params.clear()
        t0 = time.perf_counter()
        out = self.scheduler.schedule(start)
        if out.is_empty:
            return []
        t1 = time.perf_counter()
        ran, sampled, errors = self._execute(out)
        end = self.clock()
        self.num_steps += 1
        t2 = time.perf_counter()
        progressed = self.scheduler.update_from_output(ran, sampled, end)
        self.last_step_times = StepTimes(t1 - t0, t2 - t1, time.perf_counter() - t2,
                                         out.num_prefill_tokens, out.num_decode_tokens)
        failed = [self._fail(rid, message, end) for rid, message in errors.items()]
        self.proposer.propose(self.scheduler.running, progressed)
        if self.config.record_trace and not ran.is_empty:
            self.trace.append(self._record(ran, sampled, start, end))
        self._forget([r for r in progressed if r.is_finished] + failed)
        return [r.to_output(self._text(r) if r.is_finished else None) for r in progressed + failed]

    def _execute(self, out: SchedulerOutput) -> tuple[SchedulerOutput, dict[str, int], dict[str, str]]:
        """Run the step; a failure takes out only the requests it is tied to (RequestFailed),
        or, tied to nobody, the step's requests. -> (the part of the step that ran, its
        sampled tokens, {request_id: error} of the requests that failed)."""
        errors: dict[str, str] = {}
        while not out.is_empty:
            try:
                return out, self.executor.execute_model(out), errors
            except Exception as exc:
                ids = {s.request_id for s in out.seqs}
                tied = {rid: msg for rid, msg in exc.errors.items() if rid in ids} \
                    if isinstance(exc, RequestFailed) else {}
                if not tied:
                    logger.error("step %d failed, failing its %d requests", self.num_steps,
                                 len(ids), exc_info=exc)
                    errors.update(dict.fromkeys(ids, f"the step failed: {type(exc).__name__}: {exc}"))
                    return out.without(ids), {}, errors
                logger.warning("step %d: %s", self.num_steps, exc)
                errors.update(tied)
                if exc.sampled is not None:  # the step ran for the others: keep their tokens
                    return out.without(tied), {r: t for r, t in exc.sampled.items()
                                               if r not in tied}, errors
                out = self._drop(out, set(tied), exc.invalid_block_ids)
        return out, {}, errors

    def _drop(self, out: SchedulerOutput, ids: set[str], invalid_block_ids=()) -> SchedulerOutput:
        """The step without `ids`, to run again. A request that took a prefix-cache hit this
        step on a block only a dropped request was to write (or to receive by a KV transfer
        that failed: invalid_block_ids) would read KV nobody writes: it is preempted
        (recomputed later) and dropped as well, and so on."""
        kv = self.kv_manager
        unwritten = set(kv.uncache_blocks(invalid_block_ids))
        for req in out.requests:
            if req.request_id in ids:
                unwritten.update(kv.uncache_uncomputed(req))
        while ids:
            out = out.without(ids)
            readers = [r for r in out.requests if unwritten.intersection(kv.block_ids(r.request_id))]
            for req in readers:
                unwritten.update(kv.uncache_uncomputed(req))
                self.scheduler.preempt(req, out)
            ids = {r.request_id for r in readers}
        return out

    def _fail(self, request_id: str, message: str, now: float) -> Request:
        """Finish a request whose step failed: its blocks from that step leave the prefix cache
        (their KV may be half written), the others are freed."""
        req = self.requests[request_id]
        self.kv_manager.uncache_uncomputed(req)
        self.scheduler.abort(request_id, "error")
        req.error, req.metrics.finished_time = message, now
        return req

    def _record(self, out: SchedulerOutput, sampled: dict, start: float, end: float) -> StepRecord:
        return StepRecord(
            step=self.num_steps - 1, start=start, end=end, num_prefill_tokens=out.num_prefill_tokens,
            num_decode_tokens=out.num_decode_tokens, num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting), kv_usage=self.kv_manager.usage,
            preempted=out.preempted,
            entries=[TraceEntry(s.request_id, "decode" if s.is_decode else "prefill",
                                len(s.token_ids), s.start, s.sample, len(s.spec_token_ids),
                                _num_accepted(s, sampled)) for s in out.seqs])

    def _forget(self, reqs: list[Request]) -> None:
        if reqs:
            for req in reqs:
                self.requests.pop(req.request_id, None)
            self.executor.finish_requests([r.request_id for r in reqs])
            self.proposer.forget([r.request_id for r in reqs])

    def shutdown(self) -> None:
        """Release what the KV connector holds (saved KV nobody fetched, hand-offs never loaded)."""
        self.kv_connector.shutdown()
        if self.executor.kv_connector is not None:  # the worker side, where the runner has one
            self.executor.kv_connector.shutdown()

    def _text(self, req: Request) -> str | None:
        return self.tokenizer.decode(req.output_token_ids) if self.tokenizer else None

    def encode(self, prompt):
        """Text -> token ids with the model's tokenizer; token ids are returned as they are
        (add_request checks them)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequest("prompt", "text prompts need a model with a tokenizer; pass "
                                               "token ids instead")
            return self.tokenizer.encode(prompt)
        return prompt


def _with_options(config, **options):
    """config with the EngineConfig fields given as keyword arguments (those not None), validated
    as EngineConfig validates them: LLM(model, speculative_config=..., quantization="int8")."""
    given = {name: value for name, value in options.items() if value is not None}
    if not given or not isinstance(config, EngineConfig):
        return config
    return dataclasses.replace(config, **given)


def _num_accepted(seq, sampled: dict) -> int:
    """Drafts of `seq` the step accepted (0 when it checked none)."""
    tokens = sampled.get(seq.request_id)
    return max(len(tokens) - 1, 0) if seq.spec_token_ids and isinstance(tokens, list) else 0


def _kv_transfer_config(value) -> KVTransferConfig | None:
    """Parsed, with an engine_id both sides of the connector share."""
    if value is None:
        return None
    config = KVTransferConfig.parse(value)
    return config if config.engine_id else dataclasses.replace(config, engine_id=secrets.token_hex(4))


def _check_options(config, scheduler_cls, clock, kv_manager_cls=None) -> None:
    if not isinstance(config, EngineConfig):
        raise InvalidRequest("config", f"config={config!r} must be an EngineConfig")
    if scheduler_cls is not None and not isinstance(scheduler_cls, type):
        raise InvalidRequest("scheduler", f"scheduler={scheduler_cls!r} must be a Scheduler class")
    if kv_manager_cls is not None and not isinstance(kv_manager_cls, type):
        raise InvalidRequest("kv_manager_cls", f"kv_manager_cls={kv_manager_cls!r} must be a class "
                             "with KVCacheManager's constructor and methods")
    if not callable(clock):
        raise InvalidRequest("clock", f"clock={clock!r} must be a function returning seconds")
