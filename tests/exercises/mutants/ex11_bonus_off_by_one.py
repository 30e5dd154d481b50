"""When every draft is accepted, the bonus token is drawn from p[n - 1], the last draft's row, not p[n]."""
import torch

from solutions.ex11_speculative import *  # noqa: F401,F403


def rejection_sample(p, q, draft, generator):
    out = []
    for j, d in enumerate(draft):
        u = torch.rand(1, generator=generator).item()
        if u < p[j, d].item() / q[j, d].item():
            out.append(d)
            continue
        residual = (p[j] - q[j]).clamp(min=0)
        return out + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    return out + [int(torch.multinomial(p[max(len(draft) - 1, 0)], 1, generator=generator))]
