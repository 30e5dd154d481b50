"""On rejection the replacement is drawn from the target's p again, not from the residual max(0, p - q)."""
import torch

from solutions.ex11_speculative import *  # noqa: F401,F403


def rejection_sample(p, q, draft, generator):
    out = []
    for j, d in enumerate(draft):
        u = torch.rand(1, generator=generator).item()
        if u < p[j, d].item() / q[j, d].item():
            out.append(d)
            continue
        return out + [int(torch.multinomial(p[j], 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(draft)], 1, generator=generator))]
