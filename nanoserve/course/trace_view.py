"""One step at a time: what the scheduler decided and what the KV cache did, for lessons 02-06 and 12.

`trace_requests` queues a few requests on a fresh engine (all at once, or each before a given
step) and steps it by hand. Each step's
record is the engine's own step trace (engine/trace.py: which request ran how many tokens from
which position); around every step it reads the KV cache manager (blocks each request holds,
free blocks), the scheduler's counters (prefix-cache hits, preemptions) and, with speculative
decoding, the drafts each request waits to have checked, so a lesson can show blocks allocated and
freed beside the tokens that caused them, and drafts accepted or rolled back. Nothing here changes what the
engine does: it only looks between steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.course.setup import fresh_engine, random_prompt
from nanoserve.course.table import Table
from nanoserve.engine.trace import StepRecord
from nanoserve.measure.workload import greedy_params


@dataclass
class StepView:
    """One engine step and the KV bookkeeping around it."""

    record: StepRecord
    budget: int  # max_num_batched_tokens
    free_before: int
    free_after: int
    blocks: dict[str, tuple[int, int]]  # request id -> blocks held (before, after) the step
    prefix_hits: dict[str, int] = field(default_factory=dict)  # tokens reused at admission
    finished: list[str] = field(default_factory=list)
    block_size: int = 16
    drafts: dict[str, list[int]] = field(default_factory=dict)  # request id -> drafts checked

    def shared(self, request_id: str) -> int:
        """Blocks the request took from the prefix cache at admission in this step."""
        return self.prefix_hits.get(request_id, 0) // self.block_size

    @property
    def allocated(self) -> int:
        """Blocks taken from the free pool (blocks shared from the prefix cache not counted)."""
        return sum(max(0, b - a) - self.shared(r) for r, (a, b) in self.blocks.items())

    @property
    def freed(self) -> int:
        return sum(max(0, a - b) for a, b in self.blocks.values())

    def ran(self) -> str:
        """'r0 prefill 16@0, r1 decode 1@33, r2 decode 1+4@40 (3 accepted)': request, kind,
        tokens (+ drafts checked) @ first position. Within one request's entry the spaces are
        no-break spaces, so a narrow table column wraps between requests, never inside one."""
        return ", ".join((f"r{e.request_id} {e.kind} {e.num_tokens}@{e.start}" if not e.num_draft_tokens else
                          f"r{e.request_id} {e.kind} 1+{e.num_draft_tokens}@{e.start} "
                          f"({e.num_accepted_tokens} accepted)").replace(" ", "\u00a0")
                         for e in self.record.entries)

    def describe(self, decode=None) -> str:
        """The step in sentences; decode: token ids -> text, to show drafts as text."""
        r = self.record
        lines = [f"step {r.step} ({1e3 * r.duration:.2f} ms): {len(r.entries)} requests ran, "
                 f"{r.num_tokens} of the {self.budget}-token budget "
                 f"({r.num_prefill_tokens} prefill + {r.num_decode_tokens} decode)"]
        for e in r.entries:
            what = (f"decodes 1 token at position {e.start}" if e.kind == "decode" else
                    f"prefills {e.num_tokens} tokens, positions {e.start}-{e.start + e.num_tokens - 1}")
            if e.num_draft_tokens:
                d = self.drafts.get(e.request_id, [])
                shown = repr(decode(d)) if decode and d else str(d)
                rejected = e.num_draft_tokens - e.num_accepted_tokens
                noun = "draft" if e.num_draft_tokens == 1 else "drafts"
                what += (f" and checks {e.num_draft_tokens} {noun} {shown} at positions "
                         f"{e.start + 1}-{e.start + e.num_draft_tokens}: {e.num_accepted_tokens} "
                         f"accepted, {rejected} rolled back, +{e.num_accepted_tokens + 1} tokens")
            before, after = self.blocks.get(e.request_id, (0, 0))
            change = f"{after - before:+d} blocks" if after != before else "no new block"
            if self.shared(e.request_id):
                change += f", {self.shared(e.request_id)} of them shared from the prefix cache"
            sampled = ", samples a token" if e.sample and not e.num_draft_tokens else ""
            lines.append(f"  r{e.request_id} {what}{sampled}; {change} (holds {after})")
        for rid, n in self.prefix_hits.items():
            lines.append(f"  r{rid} reused {n} prompt tokens from the prefix cache: its "
                         f"num_computed_tokens starts at {n}, not 0")
        for rid in self.finished:
            lines.append(f"  r{rid} finished: its {self.blocks.get(rid, (0, 0))[0]} blocks go back "
                         f"(a block another request still shares stays in use)")
        for rid in r.preempted:
            lines.append(f"  r{rid} was preempted: its blocks go back, it will be recomputed")
        lines.append(f"  free blocks {self.free_before} -> {self.free_after}; "
                     f"waiting after the step: {r.num_waiting}")
        return "\n".join(lines)


@dataclass
class StepTrace:
    steps: list[StepView]
    num_kv_blocks: int
    block_size: int
    decode: object = None  # the model's token ids -> text, when it has a tokenizer

    def table(self, first: int = 0, last: int | None = None) -> Table:
        rows = [{"step": v.record.step, "ms": round(1e3 * v.record.duration, 2),
                 "ran (request kind tokens@position)": v.ran(),
                 "budget used": f"{v.record.num_tokens}/{v.budget}",
                 "blocks +new/-freed": f"+{v.allocated}/-{v.freed}",
                 "free blocks": v.free_after,
                 "prefix hits": sum(v.prefix_hits.values()),
                 "preempted": ", ".join(f"r{p}" for p in v.record.preempted) or "-",
                 "finished": ", ".join(f"r{p}" for p in v.finished) or "-"}
                for v in self.steps[first:last]]
        return Table(rows, f"The engine's step trace, measured ({self.num_kv_blocks} KV blocks of "
                           f"{self.block_size} tokens)")

    def rollbacks(self) -> list[int]:
        """Indices of the steps where some request's drafts were rejected and rolled back."""
        return [i for i, v in enumerate(self.steps)
                if any(e.num_draft_tokens > e.num_accepted_tokens for e in v.record.entries)]

    def describe(self, step: int) -> str:
        """One step in sentences (its index in the trace)."""
        return self.steps[step].describe(self.decode)


def trace_requests(engine_or_llm, prompt_lens: Sequence[int] | None, max_tokens: int | Sequence[int],
                   prompts: Sequence[list[int]] | None = None, max_steps: int = 200, seed: int = 0,
                   shared_prefix: int = 0, arrival_steps: Sequence[int] | None = None,
                   **config) -> StepTrace:
    """Queue requests with these prompt lengths (random tokens, the first `shared_prefix` of them
    the same in every prompt; or `prompts`) on a fresh engine (EngineConfig overrides in `config`)
    and step it to completion or max_steps, reading the KV cache manager and the scheduler's
    counters around every step. arrival_steps: request i is added just before step
    arrival_steps[i] (default: all before the first)."""
    engine = fresh_engine(engine_or_llm, **config)
    rng = np.random.default_rng(seed)
    if prompts is None:
        if shared_prefix > min(prompt_lens):
            raise ValueError(f"shared_prefix={shared_prefix} is longer than the shortest prompt "
                             f"({min(prompt_lens)} tokens)")
        prefix = random_prompt(engine, shared_prefix, rng)
        prompts = [prefix + random_prompt(engine, n - shared_prefix, rng) for n in prompt_lens]
    prompts = list(prompts)
    outs = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(outs) != len(prompts):
        raise ValueError(f"max_tokens has {len(outs)} entries for {len(prompts)} prompts")
    arrivals = [0] * len(prompts) if arrival_steps is None else list(arrival_steps)
    if len(arrivals) != len(prompts) or min(arrivals, default=0) < 0:
        raise ValueError(f"arrival_steps={arrival_steps!r}: one step number >= 0 per prompt "
                         f"({len(prompts)})")
    pending = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    ids: list[str] = []
    kv, views = engine.kv_manager, []
    while (engine.has_unfinished() or pending) and len(views) < max_steps:
        while pending and arrivals[pending[0]] <= len(views):
            i = pending.pop(0)
            ids.append(engine.add_request(prompts[i], greedy_params(outs[i])))
        if not engine.has_unfinished():  # nobody has arrived yet: the next arrival comes now
            arrivals[pending[0]] = len(views)
            continue
        held = {rid: len(kv.block_ids(rid)) for rid in ids}
        drafts = {rid: list(engine.requests[rid].spec_token_ids) for rid in ids
                  if rid in engine.requests and engine.requests[rid].spec_token_ids}
        admitted = {rid for rid in ids if engine.requests.get(rid) is not None
                    and engine.requests[rid].num_cached_tokens < 0}
        free, traced = kv.num_free_blocks, len(engine.trace)
        outputs = engine.step()
        if len(engine.trace) == traced:
            if not outputs:
                raise RuntimeError("the engine made no progress: nothing could be scheduled")
            continue
        hits = {rid: engine.requests[rid].num_cached_tokens for rid in admitted
                if rid in engine.requests and engine.requests[rid].num_cached_tokens > 0}
        hits.update({o.request_id: o.num_cached_tokens for o in outputs
                     if o.request_id in admitted and o.finished and o.num_cached_tokens > 0})
        after = {rid: len(kv.block_ids(rid)) for rid in ids}
        views.append(StepView(engine.trace[-1], engine.config.max_num_batched_tokens, free,
                              kv.num_free_blocks, {r: (held[r], after[r]) for r in ids
                                                   if held[r] or after[r]}, hits,
                              [o.request_id for o in outputs if o.finished], engine.config.block_size,
                              drafts))
    decode = engine.tokenizer.decode if engine.tokenizer is not None else None
    return StepTrace(views, engine.num_kv_blocks, engine.config.block_size, decode)
