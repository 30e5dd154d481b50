"""Turn the last position's logits into next tokens: greedy, temperature, top-k, top-p.

Rows are filtered together; a request with a `seed` draws from its own generator so its
samples do not depend on which other requests share the batch.
"""

from __future__ import annotations

import torch

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
        """logits: (N, vocab) fp32, one row per sampling request. -> N token ids."""
        greedy = logits.argmax(-1)  # (N,)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return greedy.tolist()
        out = greedy.clone()
        x = logits[rows] / torch.tensor([params[i].temperature for i in rows],
                                        device=logits.device)[:, None]  # (S, vocab)
        x = self._top_k_top_p(x, [params[i] for i in rows])
        probs = x.softmax(-1)
        for j, i in enumerate(rows):
            # exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p
            noise = torch.empty_like(probs[j]).exponential_(generator=self._gen(request_ids[i], params[i]))
            out[i] = (probs[j] / noise).argmax()
        return out.tolist()

    def _gen(self, request_id: str, p: SamplingParams) -> torch.Generator:
        if p.seed is None:
            return self.generator
        g = self.request_generators.get(request_id)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(p.seed)
            self.request_generators[request_id] = g
        return g

    @staticmethod
    def _top_k_top_p(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        ks = [p.top_k if p.top_k > 0 else x.shape[-1] for p in params]
        ps = [p.top_p for p in params]
        if all(k >= x.shape[-1] for k in ks) and all(p >= 1 for p in ps):
            return x
        sorted_x, order = x.sort(-1, descending=True)  # (S, vocab)
        rank = torch.arange(x.shape[-1], device=x.device)[None, :]
        sorted_x = sorted_x.masked_fill(rank >= torch.tensor(ks, device=x.device)[:, None],
                                        float("-inf"))
        probs = sorted_x.softmax(-1)  # renormalised after top-k, as vLLM does
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (probs.cumsum(-1) - probs) >= torch.tensor(ps, device=x.device)[:, None]
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        return torch.empty_like(x).scatter_(-1, order, sorted_x)
