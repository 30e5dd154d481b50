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
from nanoserve.kernels import argmax_for
from nanoserve.sampling_params import SamplingParams


class Sampler:
    def __init__(self, device, seed: int = 0):
        self.device = device
        self.argmax = argmax_for(device)  # greedy rows' argmax, chosen once as the model's kernels are
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}
        self._host: torch.Tensor | None = None  # pinned buffer the sampled ids arrive in (CUDA)
        self._arrived = torch.cuda.Event() if torch.device(device).type == "cuda" else None

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 request_ids: list[str]) -> list[int]:
        """logits: (N, vocab) fp32, one row per sampling request. -> N token ids. Raises
        RequestFailed naming the requests whose draw failed, with the others' tokens."""
        tokens = self.argmax(logits)  # (N,) greedy rows keep these
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return self._to_host(tokens)
        probs = self.probs(logits[rows], [params[i] for i in rows])  # (S, vocab)
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
        tokens[torch.tensor(rows, device=tokens.device)] = (probs / noise).argmax(-1)
        tokens = self._to_host(tokens)
        if errors:
            raise RequestFailed(errors, {rid: t for rid, t in zip(request_ids, tokens)
                                         if rid not in errors})
        return tokens

    def _to_host(self, tokens: torch.Tensor) -> list[int]:
        """The step's one device-to-host transfer: on CUDA an asynchronous copy into pinned
        memory, waited for by an event; on a CPU the ids are already here."""
        if self._arrived is None:
            return tokens.tolist()
        n = tokens.numel()
        if self._host is None or self._host.numel() < n:
            self._host = torch.empty(max(n, 256), dtype=torch.long, pin_memory=True)
        host = self._host[:n]
        host.copy_(tokens, non_blocking=True)
        self._arrived.record()
        self._arrived.synchronize()
        return host.tolist()

    def probs(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """logits (S, vocab) of sampling (non-greedy) rows -> the distributions drawn from:
        temperature, then top-k, then top-p, then softmax. (S, vocab)"""
        x = logits / torch.tensor([p.temperature for p in params], device=logits.device)[:, None]
        return self._top_k_top_p(x, params).softmax(-1)

    def generator_for(self, request_id: str, p: SamplingParams) -> torch.Generator:
        """The generator a request draws from: its own when it has a seed, else the engine's."""
        return self.generator if p.seed is None else self._gen(request_id, p)

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
