"""Speculative decoding: the proposers that draft tokens between steps (the drafts are checked by
the scheduler's next step and engine/rejection_sampler.py).

    Proposer, NullProposer   the bookkeeping every method shares; speculation off   (proposer.py)
    NgramProposer            prompt lookup in the request's own tokens               (ngram.py)
"""

from __future__ import annotations

from nanoserve.config import SpeculativeConfig
from nanoserve.engine.spec_decode.ngram import NgramProposer, ngram_lookup
from nanoserve.engine.spec_decode.proposer import NullProposer, Proposer


def make_proposer(config: SpeculativeConfig | None, executor=None) -> Proposer:
    """The proposer of a speculative config (None: the NullProposer). `executor` runs the target
    model: a draft model is loaded beside it, on its device and in its dtype."""
    if config is None:
        return NullProposer()
    if config.method == "ngram":
        return NgramProposer(config)
    raise NotImplementedError(f"speculative method {config.method!r}")


__all__ = ["NgramProposer", "NullProposer", "Proposer", "make_proposer", "ngram_lookup"]
