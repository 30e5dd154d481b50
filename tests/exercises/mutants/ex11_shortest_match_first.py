"""Prompt lookup tries the shortest n-gram first, not the longest."""
from solutions.ex11_speculative import *  # noqa: F401,F403


def propose_ngram(tokens, min_n, max_n, k):
    last = len(tokens)
    for n in range(min_n, min(max_n, last - 1) + 1):
        suffix = tokens[last - n:]
        for start in range(last - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []
