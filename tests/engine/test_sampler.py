"""The sampler's distributions, with vLLM's semantics, on a small vocabulary with known logits.

Each test draws 20,000 seeded samples (one batch, so it is fast and deterministic) and compares
them with a float64 reference: tokens a filter drops never appear, and the kept tokens' counts
pass a chi-square goodness-of-fit test at alpha = 0.001 (p-value from the regularised upper
incomplete gamma function, torch.special.gammaincc; no scipy needed). The temperature test also
shows the chi-square test rejects the wrong distribution, so it can fail.
"""

import math

import pytest
import torch

from nanoserve import SamplingParams
from nanoserve.engine.sampler import Sampler

N = 20_000
ALPHA = 1e-3
LOGITS = [2.0, 1.2, 0.9, 0.3, 0.0, -0.4, -1.1, -2.0]  # distinct: a strict order of likelihood


def draw(logits, params: SamplingParams, n: int = N, seed: int = 0) -> torch.Tensor:
    """Counts per token of n samples of the same row (no per-request seed: the sampler's own
    seeded generator, so the draw is deterministic)."""
    rows = torch.tensor(logits, dtype=torch.float32).expand(n, -1).contiguous()  # (n, vocab)
    tokens = Sampler("cpu", seed)(rows, [params] * n, [str(i) for i in range(n)])
    return torch.bincount(torch.tensor(tokens), minlength=len(logits))


def reference(logits, temperature=1.0, top_k=-1, top_p=1.0) -> torch.Tensor:
    """vLLM's definition in float64: softmax(logits / T); keep the k largest (ties with the k-th
    too); renormalise; keep the smallest most-likely set whose mass reaches top_p."""
    z = torch.tensor(logits, dtype=torch.float64) / temperature
    keep = torch.ones_like(z, dtype=torch.bool)
    if top_k > 0:
        keep &= z >= z.sort(descending=True).values[min(top_k, len(z)) - 1]
    p = torch.where(keep, z, -math.inf).softmax(-1)
    order = p.argsort(descending=True)
    above = p[order].cumsum(0) - p[order]  # mass of the more likely tokens
    keep[order[above >= top_p]] = False
    p = torch.where(keep, p, 0.0)
    return p / p.sum()


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of counts against probs over the tokens with probs > 0."""
    kept = probs > 0
    expected = probs[kept] * counts.sum()
    stat = ((counts[kept].double() - expected) ** 2 / expected).sum()
    df = int(kept.sum()) - 1
    if df == 0:  # one possible token: nothing to fit
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2))


def assert_matches(counts, probs):
    assert counts[probs == 0].sum() == 0, f"dropped tokens were sampled: {counts.tolist()}"
    assert (counts[probs > 0] > 0).all(), f"a kept token never appeared: {counts.tolist()}"
    p = chi_square_p(counts, probs)
    assert p > ALPHA, f"counts {counts.tolist()} do not fit {probs.tolist()} (p={p:.2e})"


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_top_k_keeps_only_the_k_most_likely(k):
    counts = draw(LOGITS, SamplingParams(temperature=1.0, top_k=k))
    probs = reference(LOGITS, top_k=k)
    assert (probs > 0).sum() == k
    assert_matches(counts, probs)


def test_top_k_keeps_ties_with_the_kth_as_vllm():
    logits = [3.0, 2.0, 2.0, 1.0, 0.0]
    counts = draw(logits, SamplingParams(temperature=1.0, top_k=2))
    assert_matches(counts, reference(logits, top_k=2))
    assert (counts > 0).tolist() == [True, True, True, False, False]


@pytest.mark.parametrize("top_k", [0, -1, 100])
def test_top_k_0_or_minus_1_or_beyond_the_vocabulary_keeps_every_token(top_k):
    unfiltered = draw(LOGITS, SamplingParams(temperature=1.0), seed=3)
    assert torch.equal(draw(LOGITS, SamplingParams(temperature=1.0, top_k=top_k), seed=3), unfiltered)
    assert_matches(unfiltered, reference(LOGITS))


PROBS = [0.4, 0.25, 0.15, 0.1, 0.06, 0.04]  # cumulative mass 0.4, 0.65, 0.8, 0.9, 0.96, 1.0


@pytest.mark.parametrize("top_p, kept", [(0.39, 1), (0.41, 2), (0.64, 2), (0.66, 3), (0.95, 5),
                                         (0.97, 6), (1.0, 6)])
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p(top_p, kept):
    logits = [math.log(p) for p in PROBS]
    counts = draw(logits, SamplingParams(temperature=1.0, top_p=top_p))
    probs = reference(logits, top_p=top_p)
    assert (probs > 0).tolist() == [i < kept for i in range(len(PROBS))]
    assert_matches(counts, probs)


@pytest.mark.parametrize("top_p, kept", [(0.6, 1), (0.7, 2)])
def test_top_k_then_top_p_on_the_renormalised_mass(top_p, kept):
    """vLLM applies top-k first and top-p to what is left, renormalised: with top_k=2 the
    probabilities (0.5, 0.3, 0.2) become (0.625, 0.375), so top_p=0.6 keeps one token (top-p on
    the original mass would keep two)."""
    logits = [math.log(p) for p in (0.5, 0.3, 0.2)]
    counts = draw(logits, SamplingParams(temperature=1.0, top_k=2, top_p=top_p))
    probs = reference(logits, top_k=2, top_p=top_p)
    assert int((probs > 0).sum()) == kept
    assert_matches(counts, probs)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_temperature_scales_logits_as_softmax_of_logits_over_t(temperature):
    counts = draw(LOGITS, SamplingParams(temperature=temperature))
    assert_matches(counts, reference(LOGITS, temperature=temperature))
    if temperature != 1.0:  # the test has the power to see a wrong temperature
        assert chi_square_p(counts, reference(LOGITS, temperature=1.0)) < 1e-6


def test_temperature_0_is_argmax_and_a_tiny_one_is_raised_to_0_01():
    assert draw(LOGITS, SamplingParams(temperature=0), n=100).tolist()[0] == 100
    assert SamplingParams(temperature=1e-6).temperature == 0.01  # as vLLM: 1e-6 would overflow
    assert draw(LOGITS, SamplingParams(temperature=1e-6), n=100).tolist()[0] == 100


def test_a_seeded_request_draws_the_same_whatever_shares_its_batch():
    seeded = SamplingParams(temperature=1.0, seed=42)
    logits = torch.tensor(LOGITS).expand(5, -1)
    alone = Sampler("cpu", 0)(logits[:1], [seeded], ["r"])
    for others in (1, 4):
        sampler = Sampler("cpu", others)
        params = [SamplingParams(temperature=1.0)] * others + [seeded]
        ids = [f"o{i}" for i in range(others)] + ["r"]
        assert sampler(logits[:others + 1], params, ids)[-1] == alone[0]
