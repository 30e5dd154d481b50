"""The "draft_model" method: a smaller model with the target's vocabulary guesses k tokens greedily.

It runs in the same process as a second ModelRunner with a KV cache of its own (as many blocks as
the target's, no prefix cache) and its own block bookkeeping, so the target's scheduler never sees
it. Drafting for a batch of requests is k passes of the draft model over one flattened batch:
the first catches each request up on the tokens it has not seen (the prompt the first time, then
the tokens accepted since) and guesses d_1; each further pass feeds d_j and guesses d_j+1. The
draft's KV is kept for the known tokens only: positions holding guesses are recomputed next time,
when it is known which were accepted. Greedy guesses make the draft a point mass, which the
rejection sampler's residual assumes. A request the draft cache has no room for is not drafted.
"""

from __future__ import annotations

import dataclasses

from nanoserve.config import EngineConfig, SpeculativeConfig
from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from nanoserve.engine.spec_decode.proposer import Proposer
from nanoserve.errors import InvalidRequest
from nanoserve.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=1, temperature=0.0)


@dataclasses.dataclass
class DraftState:
    """What the draft model holds of one request: its KV covers tokens 0..num_computed_tokens-1."""

    request_id: str
    num_computed_tokens: int = 0


class DraftModelProposer(Proposer):
    def __init__(self, config: SpeculativeConfig, target, engine_config: EngineConfig, num_blocks: int):
        super().__init__(config)
        from nanoserve.engine.model_runner import ModelRunner
        if getattr(target, "device", None) is None:
            raise InvalidRequest("speculative_config", "method 'draft_model' needs a real target model "
                                                       f"(a ModelRunner), not {type(target).__name__}")
        # on a CPU the draft's layers run in one call as the target's do (enforce_eager is
        # what turns that off, and does for both); on CUDA the draft stays eager, as it was built
        cuda = str(target.device).startswith("cuda")
        draft_config = dataclasses.replace(
            engine_config, num_kv_blocks=num_blocks, enable_prefix_caching=False, record_trace=False,
            enforce_eager=cuda or engine_config.enforce_eager, max_model_len=None, speculative_config=None)
        self.runner = ModelRunner.load(config.model, str(target.device), target.dtype, 0, draft_config)
        draft_vocab, vocab = self.runner.model_config.vocab_size, target.model_config.vocab_size
        if draft_vocab != vocab:
            raise InvalidRequest("speculative_config", f"draft model {config.model!r} has vocab_size="
                                                       f"{draft_vocab}, the target model {vocab}: a "
                                                       "draft model needs the target's vocabulary")
        self.max_len = draft_config.max_model_len_for(self.runner.model_config)
        self.kv = KVCacheManager(num_blocks, engine_config.block_size, enable_caching=False)
        self.states: dict[str, DraftState] = {}

    def draft(self, requests: list[Request], num_tokens: list[int]) -> list[list[int]]:
        drafts: dict[str, list[int]] = {r.request_id: [] for r in requests}
        live, pending = [], {}  # requests with draft KV reserved; their tokens to feed next
        for req, k in zip(requests, num_tokens):
            k = min(k, self.max_len - req.num_tokens)  # the draft model's positions stay in range
            st = self.states.setdefault(req.request_id, DraftState(req.request_id))
            new = req.num_tokens - st.num_computed_tokens  # unseen known tokens, the last included
            if k > 0 and self.kv.allocate_slots(st, new + k - 1):
                live.append((req, st, k))
                pending[req.request_id] = req.token_slice(st.num_computed_tokens, new)
        for j in range(max((k for _, _, k in live), default=0)):
            active = [(req, st) for req, st, k in live if j < k]
            seqs = [ScheduledSeq(req.request_id, pending[req.request_id], st.num_computed_tokens,
                                 self.kv.block_ids(req.request_id), True, GREEDY, j > 0)
                    for req, st in active]
            sampled = self.runner.execute_model(SchedulerOutput(seqs=seqs))
            for seq, (req, st) in zip(seqs, active):
                token = sampled[req.request_id]
                drafts[req.request_id].append(token)
                st.num_computed_tokens += len(seq.token_ids)
                pending[req.request_id] = [token]
        for req, st, _ in live:  # keep the KV of the known tokens only
            st.num_computed_tokens = req.num_tokens
            self.kv.free_beyond(st, req.num_tokens)
        return [drafts[r.request_id] for r in requests]

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            st = self.states.pop(rid, None)
            if st is not None:
                self.kv.free(st)
