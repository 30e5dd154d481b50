"""Prompt lookup takes the earliest earlier occurrence of the n-gram, not the latest."""
from solutions.ex11_speculative import *  # noqa: F401,F403


def propose_ngram(tokens, min_n, max_n, k):
    last = len(tokens)
    for n in range(min(max_n, last - 1), min_n - 1, -1):
        suffix = tokens[last - n:]
        for start in range(0, last - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []
