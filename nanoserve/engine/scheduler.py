"""The scheduler: every step, which tokens of which requests run (vLLM v1 style).

One step has a token budget (`max_num_batched_tokens`) and a cap on running requests
(`max_num_seqs`). Running requests are served first, in admission order: a decode costs
one token, an unfinished prefill continues with as many tokens as the budget allows
(chunked prefill). Then waiting requests that have arrived are admitted in arrival
order while the budget, the seat cap and free KV blocks allow; on admission the longest
cached prefix is reused and only the rest is computed. When a running request cannot
get a block, the most recently admitted running request is preempted: its blocks are
freed and it goes back to the head of the queue, to be recomputed later (its output so
far is kept).

Policies (policy.py, selected from EngineConfig's fields) order those two moves: continuous
batching (the default), whole-prompt admission without chunked prefill, prefill-first steps
(vLLM v0's default) and static batching.

With a KV connector (disaggregated prefill/decode, kv_connector.py) the scheduler asks it at
admission how many prompt tokens beyond its own prefix-cache hits arrive by transfer, reserves
blocks for them and counts them as computed; the step's SchedulerOutput carries the connector's
metadata (what to load and save) to the runner, and a finishing request's blocks are offered to
the connector before they are freed.

The scheduler never touches tensors: the runner executes its SchedulerOutput, and the
simulator drives the same class with a cost model.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from nanoserve.config import EngineConfig
from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.kv_connector import NullKVConnector
from nanoserve.engine.policy import make_policy
from nanoserve.engine.request import Request, RequestStatus


@dataclass
class ScheduledSeq:
    """What the runner needs of one request this step."""

    request_id: str
    token_ids: list[int]  # the tokens to compute, at positions start .. start+len-1
    start: int  # num_computed_tokens before this step
    block_ids: list[int]
    sample: bool  # this chunk reaches the end of the known tokens: sample the next one
    params: object  # SamplingParams
    is_decode: bool
    # speculative decoding: the last token_ids are drafts to check (logits at each of them too)
    spec_token_ids: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)  # same order as seqs
    preempted: list[str] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    kv_connector_metadata: object = None  # the KV connector's loads and saves for this step

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    def append(self, seq: ScheduledSeq, req: Request) -> None:
        self.seqs.append(seq)
        self.requests.append(req)
        if seq.is_decode:
            self.num_decode_tokens += len(seq.token_ids)  # 1, plus the drafts it checks
        else:
            self.num_prefill_tokens += len(seq.token_ids)

    def without(self, request_ids) -> SchedulerOutput:
        """This step minus the given requests (a failure took them out of it)."""
        out = SchedulerOutput(preempted=self.preempted)
        if self.kv_connector_metadata is not None:
            out.kv_connector_metadata = self.kv_connector_metadata.without(request_ids)
        for seq, req in zip(self.seqs, self.requests):
            if seq.request_id not in request_ids:
                out.append(seq, req)
        return out


@dataclass
class SchedulerStats:
    """Counters of what the scheduler decided and saw run (the engine adds its step count)."""

    prefill_tokens_computed: int = 0  # prompt (and recomputed) tokens actually run
    cached_prompt_tokens: int = 0  # tokens served from the prefix cache at admission
    transferred_prompt_tokens: int = 0  # tokens whose KV a KV connector brought at admission
    decode_tokens: int = 0  # tokens run by decodes, drafts they checked included
    preemptions: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    failed_requests: int = 0  # finished with finish_reason "error"
    # speculative decoding, as vLLM's SpecDecodingStats (vllm/v1/spec_decode/metrics.py): decodes
    # that checked drafts, drafts checked, drafts accepted, and accepted drafts by position
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.spec_decode_num_drafts += 1
        self.spec_decode_num_draft_tokens += num_draft_tokens
        self.spec_decode_num_accepted_tokens += num_accepted_tokens
        per_pos = self.spec_decode_num_accepted_tokens_per_pos
        per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted_tokens):
            per_pos[i] += 1


class SchedulerBase:
    """A scheduler without a policy: the queues, the moves a policy is made of and the bookkeeping
    after a step; `schedule` is left to subclasses (Scheduler here, a student's in exercise 4).

    State: `waiting` (a deque by arrival time; preempted requests go back to its head),
    `running` (a list in admission order), the KV cache manager `kv` and the counters `stats`.
    The public helpers `next_waiting`, `admit`, `schedule_tokens` (alias `add`) and `preempt` are
    the moves; each keeps the bookkeeping right. `connector`: a KV connector's scheduler side, set
    by the engine (a NullKVConnector: none).
    """

    def __init__(self, config: EngineConfig, kv_manager: KVCacheManager):
        self.connector = NullKVConnector()  # the engine sets its configured one
        self.config = config
        self.kv = kv_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats(
            spec_decode_num_accepted_tokens_per_pos=[0] * config.num_speculative_tokens)
        # kv_transfer_params the connector returned for requests finished since the engine's step began
        self.finished_kv_transfer_params: dict[str, dict] = {}

    # -- queue management -------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        self.connector.on_new_request(req)  # may refuse it (InvalidRequest), before it queues
        t = req.metrics.arrival_time
        if not self.waiting or self.waiting[-1].metrics.arrival_time <= t:
            self.waiting.append(req)  # the usual case: requests come in arrival order
            return
        keys = [r.metrics.arrival_time for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, t), req)

    def abort(self, request_id: str, finish_reason: str = "abort") -> Request | None:
        """Finish a queued or running request now ("abort", or "error" when running it failed)
        and free its blocks. -> the request, or None if it is not here."""
        for queue in (self.running, self.waiting):
            for req in queue:
                if req.request_id == request_id:
                    queue.remove(req)
                    req.status, req.finish_reason = RequestStatus.FINISHED, finish_reason
                    self._free(req)
                    if finish_reason == "error":
                        self.stats.failed_requests += 1
                    else:
                        self.stats.aborted_requests += 1
                    return req
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def next_arrival(self) -> float | None:
        return self.waiting[0].metrics.arrival_time if self.waiting else None

    def schedule(self, now: float) -> SchedulerOutput:
        """One step's work at engine time `now` -> SchedulerOutput (empty when nothing can run)."""
        raise NotImplementedError(f"{type(self).__name__} has no scheduling policy: write schedule(now)")

    # -- the moves a policy is made of ------------------------------------------------
    def next_waiting(self, now: float) -> Request | None:
        """The head of the waiting queue if it has arrived by `now`, else None."""
        if not self.waiting or self.waiting[0].metrics.arrival_time > now:
            return None
        return self.waiting[0]

    def admit(self, req: Request, num_cached: int, num_new_tokens: int, out: SchedulerOutput,
              now: float, num_external_tokens: int = 0) -> None:
        """Move `req`, the head of the waiting queue, to running: it reuses num_cached tokens of
        prefix cache, gets the next num_external_tokens by KV transfer (loaded before this step
        runs) and computes num_new_tokens now (slots already reserved by allocate_slots)."""
        if not self.waiting or self.waiting[0] is not req:
            raise ValueError(f"admit(): request {req.request_id} is not the head of the waiting queue")
        self.waiting.popleft()
        self.running.append(req)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_cached + num_external_tokens
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = num_cached
        if req.metrics.first_scheduled_time is None:
            req.metrics.first_scheduled_time = now
        self.stats.cached_prompt_tokens += num_cached
        self.stats.transferred_prompt_tokens += num_external_tokens
        self.schedule_tokens(req, num_new_tokens, out)

    def schedule_tokens(self, req: Request, num_new_tokens: int, out: SchedulerOutput) -> None:
        """Schedule the next num_new_tokens tokens of running request `req` (slots reserved); past
        its known tokens they are its drafts (req.spec_token_ids), checked in the same pass. Not to
        be confused with `add_request`, which queues a new request."""
        start = req.num_computed_tokens
        n = min(num_new_tokens, req.num_tokens - start)  # known tokens; the rest are drafts
        spec = req.spec_token_ids[:num_new_tokens - n]
        is_decode = bool(req.output_token_ids) and n == 1 and start == req.num_tokens - 1
        out.append(ScheduledSeq(req.request_id, req.token_slice(start, n) + spec, start,
                                self.kv.block_ids(req.request_id), start + n == req.num_tokens,
                                req.params, is_decode, spec), req)

    add = schedule_tokens  # the exercises' name for it (exercises 4 and 5 call self.add)

    def preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Take `req` out of running, free its blocks and put it at the head of the waiting queue;
        it is recomputed from scratch when admitted again (its output so far is kept)."""
        if req in self.running:
            self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req.request_id)
        self.stats.preemptions += 1

    # -- after the step ---------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int | list[int]],
                           now: float) -> list[Request]:
        """Advance progress, append sampled tokens, finish requests. -> requests with a new token.

        sampled: a token per sequence that sampled, or for one that checked drafts the accepted
        drafts and the token after them. Rejected drafts are rolled back: they do not count as
        computed and the blocks that held only them go back to the pool. Tokens are appended
        one by one up to the first that finishes the request (stop, EOS, max_tokens)."""
        progressed = []
        for seq, req in zip(out.seqs, out.requests):
            tokens = sampled.get(req.request_id, [])
            tokens = [tokens] if isinstance(tokens, int) else tokens
            num_rejected = 0
            if seq.spec_token_ids:
                num_accepted = max(len(tokens) - 1, 0)
                num_rejected = len(seq.spec_token_ids) - num_accepted
                self.stats.observe_draft(len(seq.spec_token_ids), num_accepted)
            req.spec_token_ids = []  # consumed (or never checked): the proposer drafts again
            req.num_computed_tokens += len(seq.token_ids) - num_rejected
            if seq.is_decode:
                self.stats.decode_tokens += len(seq.token_ids)
            else:
                self.stats.prefill_tokens_computed += len(seq.token_ids)
            for token in tokens:
                req.append_token(token, now)
                if req.finish_reason is not None:
                    break
            if tokens:
                progressed.append(req)
                if req.finish_reason is not None:
                    self._finish(req, now)
                    continue
            if num_rejected:
                self.kv.free_beyond(req, req.num_tokens)
        return progressed

    def _finish(self, req: Request, now: float) -> None:
        self.running.remove(req)
        req.status = RequestStatus.FINISHED
        req.metrics.finished_time = now
        self._free(req)
        self.stats.finished_requests += 1

    def _free(self, req: Request) -> None:
        """A finished request's blocks go back to the pool, offered to the connector first."""
        params = self.connector.request_finished(req, self.kv.block_ids(req.request_id))
        if params is not None:
            self.finished_kv_transfer_params[req.request_id] = params
        self.kv.free(req)

    def check_invariants(self) -> None:
        """Every request is in the queue its status says, once; the seat cap holds; running
        requests hold blocks for what they computed and waiting ones hold none."""
        assert len(self.running) <= self.config.max_num_seqs, "more running requests than seats"
        ids = [r.request_id for r in (*self.running, *self.waiting)]
        assert len(ids) == len(set(ids)), "a request is queued twice"
        for r in self.running:
            assert r.status == RequestStatus.RUNNING, f"{r.request_id} running with status {r.status}"
            held = len(self.kv.block_ids(r.request_id))
            assert held >= self.kv.blocks_needed(r.num_computed_tokens), f"{r.request_id} lost blocks"
            assert held <= self.kv.blocks_needed(r.num_tokens), \
                f"{r.request_id} holds {held} blocks for {r.num_tokens} tokens (rejected drafts kept)"
        for r in self.waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), \
                f"{r.request_id} waiting with status {r.status}"
            assert not self.kv.block_ids(r.request_id), f"waiting {r.request_id} holds blocks"


class Scheduler(SchedulerBase):
    """Decides, every step, which tokens of which requests run (see the module docstring).

    `policy` (policy.py) makes each step out of `schedule_running` and `schedule_waiting`; those
    are made of the moves of SchedulerBase.
    """

    def __init__(self, config: EngineConfig, kv_manager: KVCacheManager):
        super().__init__(config, kv_manager)
        self.policy = make_policy(config)  # the order of the moves in a step (policy.py)

    # -- one step -----------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """One step's work at engine time `now`, in the order `self.policy` gives the two moves
        below: serve running requests (decodes and unfinished prefills, preempting the newest when
        blocks run out) and admit arrived waiting requests while the token budget, the seat cap and
        free blocks allow. -> SchedulerOutput (empty when nothing can run)."""
        out = SchedulerOutput()
        self.policy.schedule(self, now, out)
        out.kv_connector_metadata = self.connector.build_connector_meta(out)
        return out

    def schedule_running(self, budget: int, out: SchedulerOutput) -> int:
        """Serve running requests in admission order within `budget`. -> the budget left."""
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = req.num_tokens - req.num_computed_tokens
            num_drafts = 0
            if n == 1:  # a decode checks its drafts in the same pass, as many as the budget takes
                num_drafts = min(len(req.spec_token_ids), budget - 1)
                n += num_drafts
            if self.config.enable_chunked_prefill:
                n = min(n, budget)
            elif n > budget:
                i += 1
                continue
            while not self.kv.allocate_slots(req, n):
                if num_drafts:  # drafts never cost another request its blocks: drop them first
                    n, num_drafts = n - num_drafts, 0
                    continue
                victim = self.running[-1]  # the most recently admitted
                self.preempt(victim, out)
                if victim is req:
                    return budget
            self.schedule_tokens(req, n, out)
            budget -= n
            i += 1
        return budget

    def schedule_waiting(self, now: float, budget: int, out: SchedulerOutput,
                         alone: bool = False) -> int:
        """Admit arrived waiting requests in arrival order within `budget` (with `alone`: only the
        head, even past the budget, in a step of its own). -> the budget left."""
        cfg = self.config
        cap = cfg.max_num_partial_prefills
        while budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.next_waiting(now)
            if req is None:
                break
            if cap and sum(r.is_prefilling for r in self.running) >= cap:
                break
            blocks, num_cached = self.kv.get_computed_blocks(req)
            # tokens past the local hits whose KV arrives by transfer
            num_external, _ = self.connector.get_num_new_matched_tokens(req, num_cached)
            n = req.num_tokens - num_cached - num_external
            if cfg.enable_chunked_prefill:
                n = min(n, budget)
            elif n > budget and not (alone and not out.seqs):
                break  # admitted whole or not at all
            if not self.kv.allocate_slots(req, num_external + n, blocks):
                break
            self.connector.update_state_after_alloc(req, self.kv.block_ids(req.request_id),
                                                    num_external)
            self.admit(req, num_cached, n, out, now, num_external)
            budget -= n
            if alone:
                break
        return budget
