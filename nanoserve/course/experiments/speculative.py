"""Lesson 12: speculative decoding measured. What a verify step of 1 + k positions costs against a
one-token decode, how often the real model accepts prompt-lookup (ngram) drafts on a task that
quotes its context and on free text, the speedup that follows, and where it stops paying.

Every run is the engine's own: `setup.fresh_engine` engines over the loaded model, with and without
`speculative_config`; acceptance and draft counts are the engine's SpecDecodingStats (vLLM's
names), times its step trace and wall clock. `verify_cost` makes every decode check exactly k
drafts by giving the engine a proposer that always drafts k tokens (nearly all rejected: the cost
of a check does not depend on whether it passes).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.config import SpeculativeConfig
from nanoserve.course.setup import Table, engine_of, fresh_engine, generate, model_dtype, random_prompt
from nanoserve.engine.spec_decode.proposer import Proposer
from nanoserve.measure import roofline
from nanoserve.measure.metrics import tpot
from nanoserve.measure.workload import greedy_params

# quote-back: the answer repeats text of the prompt, as when a model quotes, edits or extracts
PASSAGES = (
    "The engine keeps a queue of waiting requests and a list of running ones. Every step it gives "
    "each running request one token, admits waiting requests while the token budget and the KV "
    "cache allow, and frees the blocks of the requests that finished.",
    "A decode step reads every weight of the model once to produce one token per sequence. At a "
    "small batch the step is bound by that read, so the arithmetic units wait for memory most of "
    "the time.",
    "The prefix cache keeps the KV blocks of prompts that were already computed. A new request "
    "whose prompt starts with the same tokens reuses those blocks instead of computing them again.",
    "Chunked prefill splits a long prompt into pieces that fit the token budget of a step, so the "
    "requests that are decoding keep getting a token every step while the long prompt is read.",
)
QUOTE_INSTRUCTION = "Repeat this text exactly, word for word:\n\n"


def task_prompts(chat, task: str, n: int) -> list[list[int]]:
    """n prompt token ids of `task` rendered by the chat model's template (course.scenarios.chat):
    "quote-back" asks to repeat a passage; "free" asks a question (little for a lookup to find)."""
    from nanoserve.course.scenarios.chat import QUESTIONS
    if task == "quote-back":
        texts = [QUOTE_INSTRUCTION + PASSAGES[i % len(PASSAGES)] for i in range(n)]
    elif task == "free":
        texts = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
    else:
        raise ValueError(f"task={task!r}; choose 'quote-back' or 'free'")
    return [engine_of(chat.llm).encode(chat.prompt(t)) for t in texts]


def ngram(k: int, **extra) -> dict:
    """The lesson's speculative_config: prompt lookup of 2..4 tokens, k drafts."""
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4, **extra}


# -- the verify step's cost ------------------------------------------------------------------

class FixedDrafts(Proposer):
    """Drafts as many copies of one token as allowed, so every decode checks k drafts."""

    token = 10  # any id of the vocabulary: accepted or not, the check costs the same

    def draft(self, requests, num_tokens):
        return [[self.token] * n for n in num_tokens]


@dataclass
class VerifyPoint:
    batch: int
    positions: int  # query positions per sequence: 1 + drafts checked
    step_seconds: float  # median step of exactly that shape
    floor_seconds: float  # roofline floor of the same step (modelled)


def verify_cost(llm, batches: Sequence[int], positions: Sequence[int], context: int, steps: int = 4,
                seed: int = 0) -> list[VerifyPoint]:
    """Step time of `batch` sequences at `context` tokens each scoring `positions` query positions
    (1: a plain decode; 1 + k: a decode that checks k drafts), against the roofline floor."""
    from nanoserve.course.experiments.device import device_ceilings
    engine0 = engine_of(llm)
    ceilings, nbytes = device_ceilings(str(engine0.device)), roofline.dtype_bytes(model_dtype(llm))
    rng, out = np.random.default_rng(seed), []
    for b in batches:
        for q in positions:
            engine = fresh_engine(llm, enable_prefix_caching=False, max_num_seqs=b,
                                  max_num_batched_tokens=max(b * context, b * q))
            if q > 1:  # every decode checks q - 1 drafts
                engine.proposer = FixedDrafts(SpeculativeConfig(method="ngram", num_speculative_tokens=q - 1))
            generate(engine, [random_prompt(engine, context, rng) for _ in range(b)],
                     greedy_params(steps + q + 1))
            times = [r.duration for r in engine.trace
                     if not r.num_prefill_tokens and r.num_decode_tokens == b * q]
            cost = roofline.step_cost(engine.model_config, [(q, context + q, True)] * b, nbytes)
            out.append(VerifyPoint(b, q, statistics.median(times[1:] or times),
                                   roofline.roofline_time(cost, ceilings, model_dtype(llm))))
    return out


def verify_ratio(points: Sequence[VerifyPoint], batch: int, positions: int) -> float:
    """Measured step time at `positions` over the plain decode's (1 position), at `batch`."""
    at = {p.positions: p.step_seconds for p in points if p.batch == batch}
    return at[positions] / at[1]


def verify_table(points: Sequence[VerifyPoint]) -> Table:
    base = {p.batch: p for p in points if p.positions == 1}
    rows = [{"batch": p.batch, "positions per sequence": p.positions,
             "step ms": round(1e3 * p.step_seconds, 1),
             "vs 1 position": f"{p.step_seconds / base[p.batch].step_seconds:.2f}x",
             "floor ms (modelled)": round(1e3 * p.floor_seconds, 2),
             "floor vs 1 position": f"{p.floor_seconds / base[p.batch].floor_seconds:.2f}x"} for p in points]
    return Table(rows, "A step that checks drafts: step time against query positions, measured")


# -- acceptance and speedup --------------------------------------------------------------------

@dataclass
class SpecRun:
    """One batch of greedy requests through a fresh engine, with or without speculation."""

    label: str
    batch: int
    seconds: float  # wall time to finish them all, prefill included
    tpot: float  # median over the requests of the time per output token after the first
    tokens: int  # tokens generated
    decode_steps: int  # steps that ran no prefill
    verify_steps: int  # of those, steps in which some request checked drafts
    drafts: int  # decodes that checked drafts (vLLM's num_drafts)
    draft_tokens: int
    accepted: int
    accepted_per_pos: list[int] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens/s of the batch: batch / TPOT (the prefill is the same with and without)."""
        return self.batch / self.tpot

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafts checked (vLLM's "draft acceptance rate")."""
        return self.accepted / self.draft_tokens if self.draft_tokens else float("nan")

    @property
    def acceptance_length(self) -> float:
        """Tokens per verify step: 1 + accepted drafts per decode that checked some (vLLM's)."""
        return 1 + self.accepted / self.drafts if self.drafts else 1.0

    def per_position(self) -> list[float]:
        """Fraction of the verify steps whose draft j (1-based) was accepted."""
        return [n / self.drafts for n in self.accepted_per_pos] if self.drafts else []


def run_batch(llm, prompts: Sequence[list[int]], max_tokens: int, spec: dict | None, label: str,
              **config) -> SpecRun:
    """Greedy `prompts` together on a fresh engine with speculative_config `spec` (None: off)."""
    engine = fresh_engine(llm, enable_prefix_caching=False, max_num_seqs=max(len(prompts), 1),
                          speculative_config=spec, **config)
    t = time.perf_counter()
    outs = generate(engine, list(prompts), greedy_params(max_tokens))
    seconds, s = time.perf_counter() - t, engine.stats
    return SpecRun(label, len(prompts), seconds, statistics.median(tpot(o) for o in outs),
                   sum(len(o.token_ids) for o in outs),
                   sum(1 for r in engine.trace if not r.num_prefill_tokens),
                   sum(1 for r in engine.trace if not r.num_prefill_tokens
                       and any(e.num_draft_tokens for e in r.entries)), s.spec_decode_num_drafts,
                   s.spec_decode_num_draft_tokens, s.spec_decode_num_accepted_tokens,
                   list(s.spec_decode_num_accepted_tokens_per_pos), [list(o.token_ids) for o in outs])


@dataclass
class Comparison:
    """The same prompts without and with speculation, `reps` alternating runs of each."""

    task: str
    off: list[SpecRun]
    on: list[SpecRun]

    @property
    def speedup(self) -> float:
        """Decode speedup: median TPOT without speculation over median TPOT with (the wall time
        between a request's tokens, the proposer's work included)."""
        return statistics.median(r.tpot for r in self.off) / statistics.median(r.tpot for r in self.on)

    @property
    def identical(self) -> bool:
        """Greedy tokens the same with and without, in every run."""
        return all(r.token_ids == self.off[0].token_ids for r in self.off + self.on)

    def predicted_speedup(self, ratio: float) -> float:
        """The simple model: each plain decode step costs 1, each verify step `ratio` (its measured
        cost over a plain step's, every sequence checking k drafts); the tokens are the same, so
        speedup = steps off / cost on. Leaves out the proposer's own time and the prefill (the
        same with and without)."""
        on, off = self.on[0], self.off[0]
        return off.decode_steps / (on.verify_steps * ratio + (on.decode_steps - on.verify_steps))


def compare(llm, prompts: Sequence[list[int]], task: str, max_tokens: int, spec: dict, reps: int = 1,
            label: str = "ngram", **config) -> Comparison:
    run_batch(llm, prompts[:1], 2, spec, "warm-up", **config)  # first-touch allocation, kernel builds
    off, on = [], []
    for _ in range(max(1, reps)):
        off.append(run_batch(llm, prompts, max_tokens, None, "off", **config))
        on.append(run_batch(llm, prompts, max_tokens, spec, label, **config))
    return Comparison(task, off, on)


def speculation_grid(llm, prompts: dict[str, Sequence[list[int]]], ks: Sequence[int],
                     batches: Sequence[int], max_tokens: int, reps: int = 1,
                     **config) -> dict[tuple[str, int, int], Comparison]:
    """{(task, batch, k): Comparison} over every task's prompts, batch size and k. Per (task,
    batch), each round runs the plain engine, then ngram at every k, so one plain run serves every
    k's comparison and a burst of other work lands in one round, not on one k."""
    run_batch(llm, next(iter(prompts.values()))[:1], 2, ngram(max(ks)), "warm-up", **config)
    grid = {}
    for task, ps in prompts.items():
        for b in batches:
            off, on = [], {k: [] for k in ks}
            for _ in range(max(1, reps)):
                off.append(run_batch(llm, ps[:b], max_tokens, None, "off", **config))
                for k in ks:
                    on[k].append(run_batch(llm, ps[:b], max_tokens, ngram(k), f"k={k}", **config))
            grid.update({(task, b, k): Comparison(task, off, on[k]) for k in ks})
    return grid


def expected_length(alpha: float, k: int) -> float:
    """Tokens per verify step if each draft is accepted with probability alpha, independently
    (Leviathan et al. 2023): 1 + alpha + ... + alpha^k."""
    return float(sum(alpha ** i for i in range(k + 1)))


def comparison_table(comps: Sequence[Comparison], ratios: dict[int, float] | None = None) -> Table:
    """ratios: batch -> measured verify cost over a plain step (adds the simple model's column)."""
    rows = []
    for c in comps:
        on, off = c.on[0], c.off[0]
        row = {"task": c.task, "batch": on.batch, "run": on.label,
               "TPOT ms off": round(1e3 * statistics.median(r.tpot for r in c.off), 1),
               "TPOT ms on": round(1e3 * statistics.median(r.tpot for r in c.on), 1),
               "decode tok/s on": round(statistics.median(r.tokens_per_s for r in c.on), 1),
               "speedup": f"{c.speedup:.2f}x", "decode steps off/on": f"{off.decode_steps}/{on.decode_steps}",
               "acceptance": "-" if not on.draft_tokens else f"{on.acceptance_rate:.0%}",
               "mean length": round(on.acceptance_length, 2), "greedy identical": c.identical}
        if ratios and on.batch in ratios:
            row["predicted (model)"] = f"{c.predicted_speedup(ratios[on.batch]):.2f}x"
        rows.append(row)
    return Table(rows, "Speculative decoding (ngram) on the real model, measured")


# -- sampling keeps the distribution -------------------------------------------------------------

@dataclass
class SamplingCheck:
    """First tokens drawn by the engine's RejectionSampler after a point-mass draft, against the
    target distribution p (both with temperature 1 on the same logits)."""

    target: np.ndarray  # (V,) p
    draft: int  # the drafted token
    counts: np.ndarray  # (V,) how often each token came first out of the rejection sampler
    mistake: np.ndarray  # (V,) computed: rejection resampled from p itself, not the residual

    @property
    def samples(self) -> int:
        return int(self.counts.sum())

    @property
    def chi_square(self) -> float:
        expected = self.samples * self.target
        return float(((self.counts - expected) ** 2 / expected).sum())

    @property
    def critical(self) -> float:
        """The chi-square value exceeded with probability 0.1% by chance, len(p) - 1 degrees of
        freedom (Wilson-Hilferty approximation)."""
        dof = len(self.target) - 1
        return float(dof * (1 - 2 / (9 * dof) + 3.090 * (2 / (9 * dof)) ** 0.5) ** 3)

    def table(self) -> Table:
        rows = [{"token": i, "target p": round(float(p), 3), "rejection sampler (measured)":
                 round(float(c) / self.samples, 3), "resampling from p (computed)": round(float(m), 3)}
                for i, (p, c, m) in enumerate(zip(self.target, self.counts, self.mistake))]
        return Table(rows, f"The first token after draft {self.draft}, {self.samples} draws: chi-square "
                           f"{self.chi_square:.1f} (0.1% critical value {self.critical:.1f})")


def sampling_check(logits: Sequence[float], draft: int, samples: int, seed: int = 0) -> SamplingCheck:
    """Draw `samples` first tokens through the engine's RejectionSampler: each is one sequence
    that checks the one draft `draft` against target logits `logits` (the bonus row, used when the
    draft is accepted, has the same logits)."""
    import torch

    from nanoserve.engine.rejection_sampler import RejectionSampler
    from nanoserve.engine.sampler import Sampler
    from nanoserve.sampling_params import SamplingParams
    row = torch.tensor([list(logits)], dtype=torch.float32)
    sampler = RejectionSampler(Sampler("cpu", seed))
    params = SamplingParams(max_tokens=1, temperature=1.0)
    counts = np.zeros(row.shape[1], dtype=np.int64)
    chunk = 1000
    for start in range(0, samples, chunk):
        n = min(chunk, samples - start)
        out = sampler(row.repeat(2 * n, 1), [[draft]] * n, [params] * n, [str(i) for i in range(n)])
        np.add.at(counts, [toks[0] for toks in out], 1)
    p = row[0].softmax(-1).numpy().astype(np.float64)
    mistake = (1 - p[draft]) * p  # accept with p(d); else draw from p again, d included
    mistake[draft] += p[draft]
    return SamplingCheck(p, draft, counts, mistake)
