"""Prompt lookup: the vectorised search equals the plain definition (longest n in [min, max] first,
its latest earlier occurrence, up to k following tokens), on random token lists (hypothesis)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.engine.spec_decode import ngram_lookup


def lookup_by_definition(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest first, before the suffix itself
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), min_n=st.integers(1, 4),
       extra=st.integers(0, 3), k=st.integers(1, 6))
def test_lookup_equals_its_definition(tokens, min_n, extra, k):
    max_n = min_n + extra
    assert ngram_lookup(np.asarray(tokens), min_n, max_n, k) == \
        lookup_by_definition(tokens, min_n, max_n, k)


def test_examples():
    # vLLM's docstring example: [4,2,3] has no earlier match, [2,3] does: what followed it
    assert ngram_lookup(np.array([1, 2, 3, 4, 2, 3]), 2, 3, 4) == [4, 2, 3]
    assert ngram_lookup(np.array([1, 2, 9, 1, 2, 7, 1, 2]), 2, 2, 1) == [7]  # the latest occurrence
    assert ngram_lookup(np.array([5, 1, 2, 8, 6, 1, 2]), 1, 3, 2) == [8, 6]  # longest n wins
    assert ngram_lookup(np.array([1, 2, 3]), 1, 3, 2) == []
    assert ngram_lookup(np.array([7, 7, 7]), 1, 2, 3) == [7]  # overlapping match
