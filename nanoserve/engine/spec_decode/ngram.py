"""Prompt lookup (the "ngram" method): guess that the text goes on as it did the last time.

For the longest n in [prompt_lookup_min, prompt_lookup_max] such that the request's last n tokens
occurred earlier in its prompt + output, the draft is the tokens that followed their latest
earlier occurrence (up to k of them). No model runs: it pays off on text that repeats its
context (quoting, editing, code, extraction) and costs a lookup when it does not.

vLLM's NgramProposer (vllm/v1/spec_decode/ngram_proposer.py) finds the same longest n with a
KMP-style scan; among equally long matches it takes the earliest, this one the latest (the most
recent context, as the lookup decoding this method is named after).
"""

from __future__ import annotations

import numpy as np

from nanoserve.config import SpeculativeConfig
from nanoserve.engine.request import Request
from nanoserve.engine.spec_decode.proposer import Proposer


class NgramProposer(Proposer):
    def __init__(self, config: SpeculativeConfig):
        super().__init__(config)
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def draft(self, requests: list[Request], num_tokens: list[int]) -> list[list[int]]:
        return [ngram_lookup(np.asarray(r.all_token_ids), self.min_n, self.max_n, k)
                for r, k in zip(requests, num_tokens)]


def ngram_lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """tokens (L,): up to k tokens that followed the latest earlier occurrence of the longest
    suffix of length n in [min_n, max_n] found earlier; [] when there is none."""
    last = len(tokens) - 1
    if last < min_n:  # an earlier occurrence needs at least one token before the suffix
        return []
    ends = np.flatnonzero(tokens[:last] == tokens[last])  # (C,) where an earlier match can end
    if not len(ends):
        return []
    alive = np.ones(len(ends), dtype=bool)  # (C,) still matching, going back one token at a time
    length = np.ones(len(ends), dtype=np.int64)  # (C,) matched suffix length, capped at max_n
    for j in range(1, max_n):
        ok = ends - j >= 0
        alive &= ok & (tokens[np.where(ok, ends - j, 0)] == tokens[last - j])
        if not alive.any():
            break
        length += alive
    n = int(length.max())
    if n < min_n:
        return []
    end = int(ends[np.flatnonzero(length >= n)[-1]])  # the latest match of that length
    return tokens[end + 1:end + 1 + k].tolist()
