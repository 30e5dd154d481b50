"""The price of fewer bytes in quality: what a quantized engine predicts against a reference one.

`prompt_logits(llm, token_ids)` runs one sequence through an engine's model as a single prefill,
over a KV cache of the engine's own cache dtype (an fp8 engine's attention reads fp8 K/V, as its
decode steps do) allocated for this call, so the engine's blocks and its prefix cache are left
alone. From the logits at every position:

- argmax agreement: the share of positions whose most likely next token is the same in both
  engines, each fed the same tokens (teacher forcing, so one early difference does not decide
  every later position, as it does when each generates freely);
- perplexity: exp of the mean negative log-likelihood of each next token of a text;
- the largest logit error against the reference.

Left out: sampled outputs (temperature > 0), task accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nanoserve.engine.kv_cache import allocate_kv_cache
from nanoserve.engine.llm import engine_of
from nanoserve.kernels import AttentionMetadata


@torch.inference_mode()
def prompt_logits(llm, token_ids: list[int]) -> torch.Tensor:
    """fp32 logits (len(token_ids), vocab) of `llm` (an LLM or LLMEngine of a real model) at
    every position of token_ids: row i predicts token i + 1."""
    engine = engine_of(llm)
    runner, bs = engine.executor, engine.config.block_size
    n, device = len(token_ids), runner.device
    if not 1 <= n <= engine.max_model_len:
        raise ValueError(f"{n} tokens: prompt_logits takes 1 to max_model_len="
                         f"{engine.max_model_len} tokens")
    blocks = -(-n // bs)
    caches = allocate_kv_cache(engine.model_config, blocks, bs, engine.kv_cache_dtype, device)
    i32 = dict(dtype=torch.int32, device=device)
    attn = AttentionMetadata(torch.tensor([0, n], **i32), torch.tensor([n], **i32),
                             torch.arange(blocks, **i32)[None],
                             torch.arange(n, dtype=torch.int64, device=device), [0, n], [n], 0)
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    hidden = runner.model(ids, torch.arange(n, device=device), caches, attn)  # (n, hidden)
    return runner.model.compute_logits(hidden).float()


@dataclass
class Agreement:
    """One engine against a reference on the same token sequences."""

    positions: int
    argmax_agreement: float  # share of positions with the reference's most likely next token
    max_logit_error: float  # largest |logit - reference logit|
    perplexity: float  # of the sequences' own next tokens
    reference_perplexity: float

    @property
    def perplexity_change(self) -> float:
        """Relative change of perplexity against the reference (0.01: 1% higher)."""
        return self.perplexity / self.reference_perplexity - 1


def _nll(logits: torch.Tensor, token_ids: list[int]) -> tuple[float, int]:
    """Summed negative log-likelihood of tokens 1.. under rows 0..n-2, and how many."""
    targets = torch.tensor(token_ids[1:], device=logits.device)
    logp = torch.log_softmax(logits[:-1], -1)
    return float(-logp.gather(1, targets[:, None]).sum()), len(targets)


def compare(llm, reference, sequences: list[list[int]]) -> Agreement:
    """`llm` against `reference` (both LLMs or engines of the same vocabulary) on each token
    sequence (a text's tokens, or a prompt with one engine's generation), teacher-forced."""
    same = total = 0
    worst = 0.0
    nll = [0.0, 0.0]
    for seq in sequences:
        if len(seq) < 2:
            raise ValueError("each sequence needs at least 2 tokens (one to predict)")
        got, want = prompt_logits(llm, seq), prompt_logits(reference, seq)
        same += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += len(seq)
        worst = max(worst, float((got - want).abs().max()))
        for i, logits in enumerate((got, want)):
            nll[i] += _nll(logits, seq)[0]
    predicted = sum(len(s) - 1 for s in sequences)
    return Agreement(total, same / total, worst, math.exp(nll[0] / predicted),
                     math.exp(nll[1] / predicted))
