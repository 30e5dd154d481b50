"""Rejection sampling keeps the target distribution (chi-square over many seeded draws, on a small
vocabulary, with top-k and top-p applied to the target); greedy verification is decoding's argmax;
a seeded request's draws are reproducible; the engine's samples with drafts follow the model's own
distribution. An accept-everything mutant must fail the same test."""

import pytest
import torch

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.engine import rejection_sampler as rs
from nanoserve.engine.rejection_sampler import RejectionSampler, accept_greedy
from nanoserve.engine.sampler import Sampler

V = 6
# chi-square quantiles at 0.999 (a fixed table: scipy is not a dependency), by degrees of freedom
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124,
            9: 27.877, 10: 29.588, 26: 54.052}


def chi_square(counts: dict, probs: dict) -> tuple[float, int]:
    """Pearson's statistic of observed counts against probabilities (cells with p > 0), and the
    degrees of freedom. A count on a cell of probability 0 is an outright failure."""
    n = sum(counts.values())
    assert all(probs.get(c, 0) > 0 for c in counts), "a token of probability 0 was drawn"
    cells = [c for c, p in probs.items() if p > 0]
    return sum((counts.get(c, 0) - n * probs[c]) ** 2 / (n * probs[c]) for c in cells), len(cells) - 1


def target(logits, p: SamplingParams):
    return Sampler("cpu").probs(logits, [p] * len(logits))


LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0],  # p_0: the draft d_1 = 1 is likely
                       [0.0, 0.3, 1.5, 0.2, -1.0, 0.8],  # p_1: d_2 = 4 is unlikely
                       [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])  # p_2: the bonus row
DRAFT = [1, 4]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
])
def test_rejection_sampling_keeps_the_target_distribution(params):
    p = target(LOGITS, params)  # (3, V)
    sampler = RejectionSampler(Sampler("cpu", seed=0))
    n = 2000
    outs = sampler(LOGITS.repeat(n, 1), [DRAFT] * n, [params] * n, [str(i) for i in range(n)])
    first = {}
    second = {}  # the second token, where the first draft was accepted: drawn from p_1
    for o in outs:
        first[o[0]] = first.get(o[0], 0) + 1
        if o[0] == DRAFT[0]:
            assert len(o) >= 2
            second[o[1]] = second.get(o[1], 0) + 1
        else:
            assert len(o) == 1, "a token after the first rejection"
    for counts, probs in ((first, p[0]), (second, p[1])):
        stat, df = chi_square(counts, dict(enumerate(probs.tolist())))
        assert stat < CHI2_999[df], f"chi-square {stat:.1f} >= {CHI2_999[df]} ({df} dof): {counts}"
    assert second, "the first draft was never accepted"


def test_an_accept_everything_mutant_fails_the_chi_square(monkeypatch):
    monkeypatch.setattr(rs, "accept_sampled", lambda probs, draft, u: list(draft))
    p = target(LOGITS, SamplingParams(temperature=1.0))
    n = 2000
    outs = RejectionSampler(Sampler("cpu", seed=0))(LOGITS.repeat(n, 1), [DRAFT] * n,
                                                     [SamplingParams()] * n, [str(i) for i in range(n)])
    counts = {}
    for o in outs:
        counts[o[0]] = counts.get(o[0], 0) + 1
    stat, df = chi_square(counts, dict(enumerate(p[0].tolist())))
    assert stat > CHI2_999[df]


def test_a_draft_outside_top_k_is_never_accepted():
    params = SamplingParams(temperature=1.0, top_k=2)
    n = 500
    outs = RejectionSampler(Sampler("cpu", seed=3))(LOGITS[:2].repeat(n, 1), [[5]] * n, [params] * n,
                                                    [str(i) for i in range(n)])
    assert all(len(o) == 1 and o[0] in (0, 1) for o in outs)


def test_greedy_verification_is_the_argmax_run():
    assert accept_greedy([3, 1, 4, 1], [3, 1, 5]) == [3, 1, 4]
    assert accept_greedy([3, 1, 4, 1], [3, 1, 4]) == [3, 1, 4, 1]  # all agree: the bonus token
    assert accept_greedy([3, 1], [2]) == [3]
    greedy = SamplingParams(temperature=0)
    out = RejectionSampler(Sampler("cpu"))(LOGITS, [DRAFT], [greedy], ["a"])
    assert out == [[0]]  # argmax of row 0 is 0, not the draft 1
    out = RejectionSampler(Sampler("cpu"))(LOGITS, [[0, 2]], [greedy], ["a"])
    assert out == [[0, 2, 0]]


def test_seeded_draws_are_reproducible_whatever_shares_the_batch():
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = RejectionSampler(Sampler("cpu", seed=0))(LOGITS, [DRAFT], [params], ["x"])
    other = SamplingParams(temperature=1.0)
    mixed = RejectionSampler(Sampler("cpu", seed=9))(
        torch.cat([LOGITS[:2], LOGITS]), [[3], DRAFT], [other, params], ["y", "x"])
    assert mixed[1] == alone[0]


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory):
    """A random HF Llama with an 8-token vocabulary: few enough outcomes to count."""
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   eos_token_id=None, bos_token_id=None)
    torch.manual_seed(5)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(8.0)  # peakier distributions: drafts are accepted at times
    folder = str(tmp_path_factory.mktemp("vocab8"))
    hf.save_pretrained(folder, safe_serialization=True)
    return hf, folder


@pytest.mark.slow
def test_engine_samples_with_drafts_follow_the_models_distribution(small_vocab_model):
    """3-token continuations of one prompt, top_k=3: 27 outcomes, their probabilities from HF."""
    hf, folder = small_vocab_model
    prompt = list(range(8))  # every token once: prompt lookup always finds the last token
    params = dict(max_tokens=3, temperature=1.0, top_k=3)
    probs = {}
    with torch.no_grad():
        def step(ctx):
            return target(hf(torch.tensor([ctx])).logits[0, -1:].float(), SamplingParams(**params))[0]
        p1 = step(prompt)
        for a in p1.nonzero().flatten().tolist():
            p2 = step(prompt + [a])
            for b in p2.nonzero().flatten().tolist():
                p3 = step(prompt + [a, b])
                for c in p3.nonzero().flatten().tolist():
                    probs[(a, b, c)] = (p1[a] * p2[b] * p3[c]).item()
    llm = LLM(folder, config=EngineConfig(num_kv_blocks=512, max_num_seqs=128, max_num_batched_tokens=1024),
              speculative_config=dict(method="ngram", num_speculative_tokens=2, prompt_lookup_min=1,
                                      prompt_lookup_max=1))
    n = 3000
    outs = llm.generate([prompt] * n, [SamplingParams(**params, seed=i) for i in range(n)])
    counts = {}
    for o in outs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    st = llm.engine.stats
    assert st.spec_decode_num_accepted_tokens > n // 100, st  # the accept path ran
    stat, df = chi_square(counts, probs)
    assert stat < CHI2_999[df], f"chi-square {stat:.1f} ({df} dof)"
