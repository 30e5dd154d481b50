"""Exercise 11: speculative decoding. Guess tokens by prompt lookup, then keep what the target
model agrees with: greedily, and by rejection sampling, which keeps the target's distribution.

1. `propose_ngram(tokens, min_n, max_n, k)`: prompt lookup (vLLM's "ngram" method). Find the
   longest n in [min_n, max_n] such that the last n tokens also occur earlier in `tokens` (the
   occurrence must end before the last token); among the earlier occurrences of that n-gram take
   the latest, and propose the up to k tokens that followed it. None found: [].
   Example: tokens [5, 6, 7, 8, 5, 6], min_n 1, max_n 3: the last 2 tokens [5, 6] occurred at
   positions 0-1 ([8, 5, 6] did not occur earlier), so with k=3 the proposal is [7, 8, 5].
2. `accept_greedy(argmaxes, draft)`: a verify step scored the last known token and the n drafted
   tokens d_1..d_n in one pass; argmaxes[j] is the target's greedy token after d_1..d_j (argmaxes[0]
   after the last known token), n + 1 of them. Keep d_j while it equals argmaxes[j - 1]; at the
   first disagreement output argmaxes' token there instead and stop; when all n agree, add the
   bonus token argmaxes[n]. The result is always accepted drafts + exactly one target token, and
   equals what n + 1 steps of plain greedy decoding would produce as far as it goes.
3. `rejection_sample(p, q, draft, generator)`: the same with sampling (Leviathan et al. 2023;
   Chen et al. 2023). p: (n + 1, V) the target's probabilities at each position, q: (n, V) the
   draft's, draft: the n tokens drawn from q. For j = 1..n: draw u ~ U[0, 1) (torch.rand(1,
   generator=generator)); accept d_j if u < p[j-1, d_j] / q[j-1, d_j]; on the first rejection draw
   the replacement from the residual max(0, p[j-1] - q[j-1]), normalised, and stop. If all n were
   accepted, draw the bonus token from p[n]. Draw tokens with torch.multinomial(probs, 1,
   generator=generator). Every output token is then distributed exactly as the target's p.

The grader plugs your functions into nanoserve's engine (its ngram proposer and its verify step)
and checks greedy output token for token against decoding without speculation. Write them
yourself: a module that imports nanoserve's spec_decode or rejection_sampler scores 0.
"""

from __future__ import annotations

import torch


def propose_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` of length n in [min_n, max_n]; [] when none occurred earlier."""
    last = len(tokens)
    for n in range(min(max_n, last - 1), min_n - 1, -1):
        suffix = tokens[last - n:]
        for start in range(last - n - 1, -1, -1):  # latest first; it ends before the last token
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def accept_greedy(argmaxes: list[int], draft: list[int]) -> list[int]:
    """The accepted drafts, then the target's own next token (len(argmaxes) == len(draft) + 1)."""
    out = []
    for j, d in enumerate(draft):
        if d != argmaxes[j]:
            return out + [argmaxes[j]]
        out.append(d)
    return out + [argmaxes[len(draft)]]


def rejection_sample(p: torch.Tensor, q: torch.Tensor, draft: list[int],
                     generator: torch.Generator) -> list[int]:
    """p: (n + 1, V), q: (n, V) probabilities; draft: n tokens. -> accepted drafts + one token."""
    out = []
    for j, d in enumerate(draft):
        u = torch.rand(1, generator=generator).item()
        if u < p[j, d].item() / q[j, d].item():
            out.append(d)
            continue
        residual = (p[j] - q[j]).clamp(min=0)
        return out + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(draft)], 1, generator=generator))]
