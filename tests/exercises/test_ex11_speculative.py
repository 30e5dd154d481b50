"""Exercise 11 (speculative decoding): prompt lookup and greedy acceptance checked against the
engine's own (engine/spec_decode/ngram.py, engine/rejection_sampler.py) on random inputs, then
plugged into the engine: greedy output token for token as without speculation, the same drafts
and acceptances as the engine's own; rejection sampling checked by the distribution it draws
(chi-square on a small vocabulary) and on cases whose answer is certain."""

import numpy as np
import pytest
import torch
from exercise_checks import MODEL, graded, make_engine
from hypothesis import given
from hypothesis import strategies as st

from nanoserve import SamplingParams
from nanoserve.engine import rejection_sampler
from nanoserve.engine.spec_decode import NgramProposer, ngram_lookup

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def ex(load):
    return load("ex11_speculative")


def test_worked_examples(ex):
    got = ex.propose_ngram([5, 6, 7, 8, 5, 6], 1, 3, 3)
    assert got == [7, 8, 5], f"propose_ngram([5, 6, 7, 8, 5, 6], 1, 3, k=3): got {got}, expected [7, 8, 5]"
    got = ex.accept_greedy([4, 9, 2], [4, 7])
    assert got == [4, 9], f"accept_greedy(argmaxes [4, 9, 2], draft [4, 7]): got {got}, expected [4, 9] " \
                          "(d_1 agrees, d_2 does not: the target's 9 replaces it)"
    got = ex.accept_greedy([4, 7, 2], [4, 7])
    assert got == [4, 7, 2], f"accept_greedy(argmaxes [4, 7, 2], draft [4, 7]): got {got}, expected " \
                             "[4, 7, 2] (both agree: the bonus token argmaxes[2] follows)"


@graded(120)
@given(tokens=st.lists(st.integers(0, 4), max_size=30), min_n=st.integers(1, 3), extra=st.integers(0, 2),
       k=st.integers(1, 5))
def test_propose_ngram_matches_nanoserve(ex, tokens, min_n, extra, k):
    want = ngram_lookup(np.asarray(tokens, dtype=np.int64), min_n, min_n + extra, k)
    got = ex.propose_ngram(list(tokens), min_n, min_n + extra, k)
    assert list(got) == want, (f"propose_ngram({tokens}, min_n={min_n}, max_n={min_n + extra}, k={k}): got "
                               f"{list(got)}, expected {want} (longest n first, then its latest earlier "
                               "occurrence)")


@st.composite
def verify_steps(draw):
    n = draw(st.integers(0, 6))
    argmaxes = draw(st.lists(st.integers(0, 5), min_size=n + 1, max_size=n + 1))
    agree = draw(st.integers(0, n))  # drafts that start by agreeing, then anything
    draft = argmaxes[:agree] + draw(st.lists(st.integers(0, 5), min_size=n - agree, max_size=n - agree))
    return argmaxes, draft


@graded(120)
@given(step=verify_steps())
def test_accept_greedy_matches_nanoserve(ex, step):
    argmaxes, draft = step
    want = rejection_sampler.accept_greedy(argmaxes, draft)
    got = ex.accept_greedy(list(argmaxes), list(draft))
    assert list(got) == want, \
        f"accept_greedy(argmaxes {argmaxes}, draft {draft}): got {list(got)}, expected {want}"


# prompts that repeat themselves, so prompt lookup finds something; the tiny model's greedy text
# falls into loops too
PROMPTS = [[(3 * j) % 11 + 20 for j in range(40)], [7, 8, 9, 10] * 6 + [50, 51, 52],
           list(range(100, 130))]


def run(engine, max_tokens=24):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(list(p), params) for p in PROMPTS]
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    return [list(final[i].token_ids) for i in ids], engine.stats


@pytest.fixture(scope="module")
def reference():
    """Greedy tokens without speculation, and the engine's own ngram run (tokens, stats)."""
    plain, _ = run(make_engine(model=MODEL))
    return plain, run(make_engine(model=MODEL, speculative_config=SPEC))


def counts(stats):
    return (stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens,
            stats.spec_decode_num_accepted_tokens)


def test_your_proposer_in_the_engine(ex, reference):
    ex.propose_ngram([1, 2, 1], 1, 1, 1)  # a skeleton fails here, saying so
    plain, (_, want) = reference
    engine = make_engine(model=MODEL, speculative_config=SPEC)

    class Yours(NgramProposer):
        def draft(self, requests, num_tokens):
            return [list(ex.propose_ngram(list(r.all_token_ids), self.min_n, self.max_n, k))
                    for r, k in zip(requests, num_tokens)]
    engine.proposer = Yours(engine.config.speculative_config)
    tokens, stats = run(engine)
    assert tokens == plain, "greedy output with your proposer differs from decoding without speculation"
    assert counts(stats) == counts(want), (
        f"(verify steps, drafts, accepted) with your proposer {counts(stats)}, with nanoserve's "
        f"{counts(want)}: it proposes different tokens")
    assert want.spec_decode_num_accepted_tokens > 0  # the check means something: drafts were accepted


def test_your_greedy_acceptance_in_the_engine(ex, reference, monkeypatch):
    ex.accept_greedy([1], [])
    plain, (_, want) = reference
    monkeypatch.setattr(rejection_sampler, "accept_greedy",
                        lambda a, d: list(ex.accept_greedy(list(a), list(d))))
    tokens, stats = run(make_engine(model=MODEL, speculative_config=SPEC))
    assert tokens == plain, ("greedy output with your accept_greedy in the engine's verify step differs "
                             "from decoding without speculation")
    assert counts(stats) == counts(want), (
        f"(verify steps, drafts, accepted) with your accept_greedy {counts(stats)}, "
        f"nanoserve's {counts(want)}")


def one_hot(v, i):
    x = torch.zeros(v)
    x[i] = 1.0
    return x


def test_rejection_sample_certain_cases(ex):
    g = torch.Generator().manual_seed(0)
    p = torch.stack([one_hot(5, 1), one_hot(5, 2), one_hot(5, 4)])
    got = ex.rejection_sample(p, p[:2].clone(), [1, 2], g)
    assert list(got) == [1, 2, 4], (f"p = q, both drafts certain under p: got {list(got)}, expected "
                                    "[1, 2, 4] (both accepted, then the bonus token drawn from p[2])")
    q = torch.stack([one_hot(5, 3), one_hot(5, 2)])
    got = ex.rejection_sample(p, q, [3, 2], g)
    assert list(got) == [1], (f"d_1 = 3 has p[0, 3] = 0: it must be rejected and replaced from the residual "
                              f"max(0, p[0] - q[0]), which is all on token 1; got {list(got)}, expected [1] "
                              "(nothing after a rejection)")


def chi_square(counts, probs):
    expected = counts.sum() * probs
    keep = expected > 0
    assert (counts[~keep] == 0).all(), f"drew tokens of probability 0: counts {counts.tolist()}"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


CRITICAL_01 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}  # chi-square at p = 0.001


@pytest.mark.parametrize("case", range(3))
def test_rejection_sample_keeps_the_target_distribution(ex, case):
    rng = torch.Generator().manual_seed(100 + case)
    p = torch.rand(2, 6, generator=rng).pow(2)
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(1, 6, generator=rng)
    q = q / q.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(case)
    first, second = np.zeros(6, dtype=np.int64), np.zeros(6, dtype=np.int64)
    for _ in range(4000):
        d = int(torch.multinomial(q[0], 1, generator=g))  # the draft is drawn from q
        out = list(ex.rejection_sample(p, q, [d], g))
        assert len(out) in (1, 2), f"one draft: 1 or 2 tokens come out, got {out}"
        first[out[0]] += 1
        if len(out) == 2:
            second[out[1]] += 1
    stat, dof = chi_square(first, p[0].double().numpy())
    assert stat < CRITICAL_01[dof], (
        f"the first token's distribution is not the target's p[0] (chi-square {stat:.1f} on {dof} degrees of "
        f"freedom, p < 0.001): drew {(first / first.sum()).round(3).tolist()}, p[0] = "
        f"{p[0].numpy().round(3).tolist()}; on rejection draw from max(0, p - q), normalised")
    stat, dof = chi_square(second, p[1].double().numpy())
    assert stat < CRITICAL_01[dof], (
        f"after an accepted draft the bonus token should follow p[1] (chi-square {stat:.1f}, p < 0.001): "
        f"drew {(second / second.sum()).round(3).tolist()}, p[1] = {p[1].numpy().round(3).tolist()}")
