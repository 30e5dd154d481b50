"""Seeded synthetic workloads: when requests arrive, how long their prompts and outputs are.

Arrivals follow vLLM's serving benchmark: rate=inf sends everything at t=0; otherwise gaps are
gamma-distributed with shape=burstiness and scale=1/(rate*burstiness), so the mean gap is
1/rate for every burstiness, burstiness=1 is a Poisson process, and the gaps' coefficient of
variation is 1/sqrt(burstiness) (<1 smoother, >1 burstier). The first request arrives at t=0.

Prompts are random token ids in [token_low, vocab_size), so special ids (BOS, EOS, pad) below
token_low never appear. Output lengths are enforced with max_tokens and ignore_eos, greedy by
default. One seed gives the same workload on every machine; arrivals, lengths and token ids
draw from separate child streams of it, so sweeping the rate leaves the prompts unchanged.
Deliberately left out: real datasets (ShareGPT) and tokenizers; these workloads are ids only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.sampling_params import SamplingParams


@dataclass
class WorkloadRequest:
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float  # seconds after the workload starts


@dataclass
class Workload:
    name: str
    description: str
    requests: list[WorkloadRequest] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)

    @property
    def arrival_times(self) -> list[float]:
        return [r.arrival_time for r in self.requests]

    @property
    def input_lens(self) -> list[int]:
        return [len(r.prompt_token_ids) for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.params.max_tokens for r in self.requests]


# ---- arrival processes -----------------------------------------------------------------

def arrival_times(n: int, rate: float = math.inf, burstiness: float = 1.0,
                  rng: np.random.Generator | int | None = 0) -> np.ndarray:
    """n sorted arrival times (s): all 0 at rate=inf, else cumulative gamma gaps from t=0."""
    if rate <= 0:
        raise ValueError(f"rate={rate!r} must be > 0 requests/s (math.inf: all at t=0)")
    if burstiness <= 0:
        raise ValueError(f"burstiness={burstiness!r} must be > 0 (1 = Poisson)")
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    gaps = np.random.default_rng(rng).gamma(burstiness, 1.0 / (rate * burstiness), n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def poisson_arrivals(n: int, rate: float, rng=0) -> np.ndarray:
    return arrival_times(n, rate, 1.0, rng)


# ---- length distributions ----------------------------------------------------------------

@dataclass
class Fixed:
    n: int

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"Fixed length n={self.n} must be >= 1")

    def sample(self, k: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(k, self.n, dtype=int)


@dataclass
class Uniform:
    lo: int
    hi: int  # inclusive

    def __post_init__(self):
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"Uniform({self.lo}, {self.hi}) needs 1 <= lo <= hi")

    def sample(self, k, rng):
        return rng.integers(self.lo, self.hi + 1, k)


@dataclass
class LogNormal:
    """Long-tailed lengths like real chat traffic: median, log-space sigma, clipped to [lo, hi]."""

    median: float
    sigma: float = 1.0
    lo: int = 1
    hi: int = 4096

    def __post_init__(self):
        if self.median <= 0 or self.sigma < 0 or not 1 <= self.lo <= self.hi:
            raise ValueError(f"{self!r}: needs median > 0, sigma >= 0, 1 <= lo <= hi")

    def sample(self, k, rng):
        x = rng.lognormal(math.log(self.median), self.sigma, k)
        return np.clip(np.rint(x), self.lo, self.hi).astype(int)


@dataclass
class Choice:
    """Lengths drawn (with replacement) from a list, e.g. lengths measured from a real trace."""

    values: Sequence[int]

    def __post_init__(self):
        if len(self.values) == 0:
            raise ValueError("Choice needs at least one length")

    def sample(self, k, rng):
        return rng.choice(np.asarray(self.values, dtype=int), k)


def _dist(d):
    """An int means a fixed length."""
    d = Fixed(d) if isinstance(d, (int, np.integer)) else d
    if not hasattr(d, "sample"):
        raise ValueError(f"length distribution {d!r} must be an int or have .sample(k, rng)")
    return d


def _lengths(d, k: int, rng) -> np.ndarray:
    out = _dist(d).sample(k, rng)
    if k and out.min() < 1:
        raise ValueError(f"length distribution {d!r} produced a length < 1")
    return out


# ---- building blocks ---------------------------------------------------------------------

def random_tokens(n: int, rng: np.random.Generator, vocab_size: int = 32000,
                  token_low: int = 10) -> list[int]:
    if not 0 <= token_low < vocab_size:
        raise ValueError(f"token_low={token_low} must be in [0, vocab_size={vocab_size})")
    return rng.integers(token_low, vocab_size, n).tolist()


def greedy_params(max_tokens: int) -> SamplingParams:
    """Exactly max_tokens greedy tokens: ignore_eos makes output length a workload choice."""
    return SamplingParams(max_tokens=int(max_tokens), temperature=0.0, ignore_eos=True)


def _streams(seed: int):
    """Independent generators for arrivals, lengths and tokens."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)]


# ---- workloads ---------------------------------------------------------------------------

def synthetic(num_requests: int, input_len=128, output_len=128, rate: float = math.inf,
              burstiness: float = 1.0, seed: int = 0, vocab_size: int = 32000,
              token_low: int = 10, name: str = "synthetic") -> Workload:
    """Random prompts; input_len/output_len are ints or length distributions."""
    r_arr, r_len, r_tok = _streams(seed)
    times = arrival_times(num_requests, rate, burstiness, r_arr)
    ins = _lengths(input_len, num_requests, r_len)
    outs = _lengths(output_len, num_requests, r_len)
    reqs = [WorkloadRequest(random_tokens(int(i), r_tok, vocab_size, token_low),
                            greedy_params(o), float(t)) for i, o, t in zip(ins, outs, times)]
    desc = (f"{num_requests} requests, input {input_len}, output {output_len}, "
            f"rate {rate} req/s, burstiness {burstiness}, seed {seed}")
    return Workload(name, desc, reqs)


def shared_prefix(num_groups: int, requests_per_group: int, prefix_len: int, suffix_len=32,
                  output_len=32, rate: float = math.inf, burstiness: float = 1.0,
                  shuffle: bool = True, seed: int = 0, vocab_size: int = 32000,
                  token_low: int = 10) -> Workload:
    """num_groups system prompts of prefix_len tokens, each shared by requests_per_group
    requests with their own suffix: what prefix caching saves. shuffle interleaves groups in
    arrival order (as real traffic); otherwise each group arrives together."""
    r_arr, r_len, r_tok = _streams(seed)
    n = num_groups * requests_per_group
    prefixes = [random_tokens(prefix_len, r_tok, vocab_size, token_low) for _ in range(num_groups)]
    groups = np.repeat(np.arange(num_groups), requests_per_group)
    if shuffle:
        groups = r_arr.permutation(groups)
    times = arrival_times(n, rate, burstiness, r_arr)
    sufs, outs = _lengths(suffix_len, n, r_len), _lengths(output_len, n, r_len)
    reqs = [WorkloadRequest(prefixes[g] + random_tokens(int(s), r_tok, vocab_size, token_low),
                            greedy_params(o), float(t))
            for g, s, o, t in zip(groups, sufs, outs, times)]
    desc = (f"{num_groups} groups x {requests_per_group} requests sharing a {prefix_len}-token "
            f"prefix, suffix {suffix_len}, output {output_len}, rate {rate}, seed {seed}")
    return Workload("shared_prefix", desc, reqs)


def interference(num_decoders: int = 8, decoder_prompt_len: int = 16,
                 decoder_output_len: int = 256, long_prompt_len: int = 2048,
                 long_arrival_time: float = 1.0, long_output_len: int = 8, seed: int = 0,
                 vocab_size: int = 32000, token_low: int = 10) -> Workload:
    """Steady decoders (short prompts, long outputs, all at t=0) and one long prompt arriving
    at long_arrival_time: its prefill stalls the decoders' ITL unless prefill is chunked.
    The long request is last in the list."""
    _, _, r_tok = _streams(seed)
    reqs = [WorkloadRequest(random_tokens(decoder_prompt_len, r_tok, vocab_size, token_low),
                            greedy_params(decoder_output_len), 0.0) for _ in range(num_decoders)]
    reqs.append(WorkloadRequest(random_tokens(long_prompt_len, r_tok, vocab_size, token_low),
                                greedy_params(long_output_len), float(long_arrival_time)))
    desc = (f"{num_decoders} decoders ({decoder_prompt_len} in, {decoder_output_len} out) at "
            f"t=0, one {long_prompt_len}-token prompt at t={long_arrival_time}s, seed {seed}")
    return Workload("interference", desc, reqs)
