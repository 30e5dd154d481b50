"""Greedy acceptance keeps every draft that matches its argmax, also after the first disagreement."""
from solutions.ex11_speculative import *  # noqa: F401,F403


def accept_greedy(argmaxes, draft):
    kept = [d for j, d in enumerate(draft) if d == argmaxes[j]]
    return kept + [argmaxes[len(kept)]]
