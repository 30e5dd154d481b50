"""Speculative decoding: the proposers that draft tokens between steps (the drafts are checked by
the scheduler's next step and engine/rejection_sampler.py).

    Proposer, NullProposer   the bookkeeping every method shares; speculation off   (proposer.py)
    NgramProposer            prompt lookup in the request's own tokens               (ngram.py)
    DraftModelProposer       a smaller model of the same vocabulary, greedy          (draft_model.py)
"""

from __future__ import annotations

from nanoserve.config import EngineConfig
from nanoserve.engine.spec_decode.draft_model import DraftModelProposer
from nanoserve.engine.spec_decode.ngram import NgramProposer, ngram_lookup
from nanoserve.engine.spec_decode.proposer import NullProposer, Proposer


def make_proposer(config: EngineConfig, executor, num_kv_blocks: int) -> Proposer:
    """The proposer of config.speculative_config (None: the NullProposer). A draft model is
    loaded beside the executor's target model, on its device and in its dtype, with a KV cache
    of num_kv_blocks blocks."""
    spec = config.speculative_config
    if spec is None:
        return NullProposer()
    if spec.method == "ngram":
        return NgramProposer(spec)
    return DraftModelProposer(spec, executor, config, num_kv_blocks)


__all__ = ["DraftModelProposer", "NgramProposer", "NullProposer", "Proposer", "make_proposer", "ngram_lookup"]
