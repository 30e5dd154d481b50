"""Turn the last position's logits into next tokens: greedy, temperature, top-k, top-p.

vLLM's semantics (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py, vLLM 0.32): temperature
scales the logits, then top-k keeps the k largest (and any tied with the k-th), then top-p keeps,
of what is left and renormalised, the smallest set of most likely tokens whose mass reaches p.
Rows are filtered together; each request then draws its token with an exponential race, from its
own generator when it has a `seed`, so its samples do not depend on what shares its batch. A
failure drawing one request's token is reported for that request alone (RequestFailed).
"""

from __future__ import annotations

import torch

from nanoserve.engine.executor import RequestFailed
from nanoserve.kernels import argmax
from nanoserve.sampling_params import SamplingParams


class Sampler:
    def __init__(self, device, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 request_ids: list[str]) -> list[int]:
        """logits: (N, vocab) fp32, one row per sampling request. -> N token ids. Raises
        RequestFailed naming the requests whose draw failed, with the others' tokens."""
        tokens = argmax(logits).tolist()  # greedy rows keep these
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return tokens
        x = logits[rows] / torch.tensor([params[i].temperature for i in rows],
                                        device=logits.device)[:, None]  # (S, vocab)
        probs = self._top_k_top_p(x, [params[i] for i in rows]).softmax(-1)  # (S, vocab)
        # exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p; a seeded request's
        # row of E comes from its own generator
        noise = torch.empty_like(probs).exponential_(generator=self.generator)  # (S, vocab)
        errors = {}
        for j, i in enumerate(rows):
            if params[i].seed is not None:
                try:
                    noise[j].exponential_(generator=self._gen(request_ids[i], params[i]))
                except Exception as exc:  # this request's draw only: the others keep theirs
                    errors[request_ids[i]] = f"sampling failed: {type(exc).__name__}: {exc}"
        for i, t in zip(rows, (probs / noise).argmax(-1).tolist()):
            tokens[i] = t
        if errors:
            raise RequestFailed(errors, {rid: t for rid, t in zip(request_ids, tokens)
                                         if rid not in errors})
        return tokens

    def _gen(self, request_id: str, p: SamplingParams) -> torch.Generator:
        """The generator of a seeded request, made from its seed on its first draw."""
        g = self.request_generators.get(request_id)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(p.seed)
            self.request_generators[request_id] = g
        return g

    @staticmethod
    def _top_k_top_p(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """x: (S, vocab) temperature-scaled logits -> the same with filtered tokens at -inf."""
        vocab = x.shape[-1]
        ks = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]
        ps = [p.top_p for p in params]
        if all(k == vocab for k in ks) and all(p >= 1 for p in ps):
            return x
        sorted_x, order = x.sort(-1, descending=True)  # (S, vocab)
        kth = sorted_x.gather(1, torch.tensor(ks, device=x.device)[:, None] - 1)  # (S, 1)
        sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))  # ties with the k-th stay
        probs = sorted_x.softmax(-1)  # renormalised after top-k, as vLLM does
        # drop a token once the mass above it reaches top_p (the first token always stays)
        drop = (probs.cumsum(-1) - probs) >= torch.tensor(ps, device=x.device)[:, None]
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        return torch.empty_like(x).scatter_(-1, order, sorted_x)
