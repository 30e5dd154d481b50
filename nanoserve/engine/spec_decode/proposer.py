"""A proposer drafts, between steps, the tokens that may follow each running request's known ones.

The engine asks it after every step for the requests that got a token; the drafts wait on the
request (`spec_token_ids`) and the next step that runs it checks them all in one pass
(scheduler.py counts and places them, the rejection sampler keeps the agreed run). A draft never
asks for more than the request can still use: its max_tokens less the token the check adds, and
the room left before max_model_len. With `disable_by_batch_size`, a step with that many running
requests or more drafts nothing (vLLM's rule: batching has spent the spare compute already).

Speculative decoding off is the NullProposer, which drafts nothing: the engine calls it all the
same, so no other file asks whether speculation is on.
"""

from __future__ import annotations

from collections.abc import Iterable

from nanoserve.config import SpeculativeConfig
from nanoserve.engine.request import Request


class Proposer:
    """Base of the drafting methods: `draft` is the method, `propose` the bookkeeping around it."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self.num_speculative_tokens = config.num_speculative_tokens

    def propose(self, running: list[Request], progressed: Iterable[Request]) -> None:
        """Set spec_token_ids of the requests of `progressed` that still run and decode next."""
        limit = self.config.disable_by_batch_size
        if limit is not None and len(running) >= limit:
            for req in running:
                req.spec_token_ids = []
            return
        reqs, room = [], []
        for req in progressed:
            if req.is_finished or req.num_computed_tokens != req.num_tokens - 1:
                continue
            n = min(self.num_speculative_tokens,
                    req.params.max_tokens - len(req.output_token_ids) - 1,  # the check adds one
                    req.max_len - req.num_tokens)  # the last draft's position stays in the model
            if n > 0:
                reqs.append(req)
                room.append(n)
        if reqs:
            for req, n, draft in zip(reqs, room, self.draft(reqs, room)):
                req.spec_token_ids = list(draft[:n])

    def draft(self, requests: list[Request], num_tokens: list[int]) -> list[list[int]]:
        """Up to num_tokens[i] guessed tokens to follow requests[i]'s known tokens (may be [])."""
        raise NotImplementedError

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop what is kept for requests that left the engine. Default: nothing kept."""


class NullProposer(Proposer):
    """Speculative decoding off: drafts nothing."""

    num_speculative_tokens = 0

    def __init__(self):
        pass

    def propose(self, running: list[Request], progressed: Iterable[Request]) -> None:
        pass
