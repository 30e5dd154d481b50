"""Verify drafted tokens: keep the longest run the target model agrees with, plus one token of its own.

A sequence that checks n drafts d_1..d_n has n + 1 rows of logits: row j is the target's
distribution p_j for the token after d_1..d_j (row 0: after the last known token).

- Greedy: d_j is accepted while it is the argmax of row j-1; the first disagreement is replaced
  by that argmax, and when all n agree the argmax of row n is the bonus token. The output is
  the tokens non-speculative greedy decoding would give, one step per accepted run.
- Sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
  Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling"): d_j, drawn from a
  draft distribution q, is accepted with probability min(1, p(d_j) / q(d_j)); on rejection the
  token is drawn from the residual max(0, p - q), normalised. Each output token is then
  distributed exactly as p. nanoserve's proposers are deterministic (prompt lookup, a greedy
  draft model), so q is a point mass on d_j: accept with probability p(d_j), else draw from p
  with d_j removed. p is the distribution the ordinary sampler draws from (temperature, top-k,
  top-p, as vLLM's rejection sampler computes the target probabilities,
  vllm/v1/sample/rejection_sampler.py).

A seeded request draws its uniforms and its noise from its own generator, so its output does not
depend on what shares its batch.
"""

from __future__ import annotations

import torch

from nanoserve.engine.executor import RequestFailed
from nanoserve.engine.sampler import Sampler
from nanoserve.sampling_params import SamplingParams


class RejectionSampler:
    """Checks drafts against the target's logits; draws from the Sampler's generators."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def __call__(self, logits: torch.Tensor, drafts: list[list[int]], params: list[SamplingParams],
                 request_ids: list[str]) -> list[list[int]]:
        """logits: (sum(len(d) + 1 for d in drafts), vocab) fp32, each sequence's rows in order.
        -> per sequence, its accepted drafts followed by one token of the target's. Raises
        RequestFailed naming the requests whose draw failed, with the others' tokens."""
        starts = [0]
        for d in drafts:
            starts.append(starts[-1] + len(d) + 1)
        greedy = self.sampler.argmax(logits).tolist()  # (rows,) every row's argmax: greedy rows use these
        out, errors = [], {}
        for i, (d, p) in enumerate(zip(drafts, params)):
            rows = slice(starts[i], starts[i + 1])
            try:
                out.append(accept_greedy(greedy[rows], d) if p.greedy else
                           self._accept_sampled(logits[rows], d, p, request_ids[i]))
            except Exception as exc:  # this request's draw only: the others keep theirs
                errors[request_ids[i]] = f"sampling failed: {type(exc).__name__}: {exc}"
                out.append(None)
        if errors:
            raise RequestFailed(errors, {rid: t for rid, t in zip(request_ids, out) if t is not None})
        return out

    def _accept_sampled(self, logits: torch.Tensor, draft: list[int], p: SamplingParams,
                        request_id: str) -> list[int]:
        n = len(draft)
        probs = self.sampler.probs(logits, [p] * (n + 1))  # (n + 1, vocab) the target's p_j
        gen = self.sampler.generator_for(request_id, p)
        u = torch.rand(n, generator=gen, device=probs.device).tolist()  # (n,)
        # exponential race: argmax(w / E), E ~ Exp(1), draws from w normalised
        noise = torch.empty_like(probs).exponential_(generator=gen)  # (n + 1, vocab)
        accepted = accept_sampled(probs[:n, :], draft, u)
        j = len(accepted)
        w = probs[j].clone()  # (vocab,)
        if j < n:
            w[draft[j]] = 0.0  # the residual max(0, p - q) of a point-mass draft
        return accepted + [int((w / noise[j]).argmax())]


def accept_greedy(argmaxes: list[int], draft: list[int]) -> list[int]:
    """argmaxes: the n + 1 rows' argmax. -> the drafts that match, then the target's next token."""
    j = 0
    while j < len(draft) and draft[j] == argmaxes[j]:
        j += 1
    return draft[:j] + [argmaxes[j]]


def accept_sampled(probs: torch.Tensor, draft: list[int], u: list[float]) -> list[int]:
    """probs: (n, vocab) the target's p_j at the drafts; u: n uniforms in [0, 1). -> the accepted
    run: d_j stays while u_j < p_j(d_j), i.e. with probability p_j(d_j) / q_j(d_j), q_j(d_j) = 1."""
    rows = torch.arange(len(draft), device=probs.device)
    at_drafts = probs[rows, torch.tensor(draft, dtype=torch.long, device=probs.device)].tolist()
    j = 0
    while j < len(draft) and u[j] < at_drafts[j]:
        j += 1
    return draft[:j]
