"""What a load generator sends: `vllm bench serve`'s datasets, built from measure/workload.py.

    random             random token ids of --random-input-len (+- --random-range-ratio), asking
                       for --random-output-len tokens: `workload.synthetic`, so one seed gives the
                       same prompts and arrival times as `python -m nanoserve bench`
    prefix_repetition  --prefix-repetition-num-prefixes shared prefixes, each followed by its own
                       suffix: `workload.shared_prefix`
    custom             a JSONL trace, one request a line: "prompt" (text or token ids), its output
                       length as "output_tokens" (vLLM's custom dataset) or "max_tokens", and
                       optionally "timestamp" (seconds from the start; vLLM's timed traces). With
                       timestamps the trace keeps its own timing, else requests follow
                       --request-rate / --burstiness.

Random prompts are token ids, which vLLM, SGLang and nanoserve accept on /v1/completions; chat
needs text, so ids are decoded with the model's tokenizer (vLLM's random dataset does the same).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from nanoserve.measure import workload as wl


@dataclass
class LoadRequest:
    prompt: list[int] | str
    prompt_len: int  # tokens (for a text prompt from a trace: its tokenized length, or 0 unknown)
    max_tokens: int
    arrival_time: float  # seconds after the run starts


def from_workload(w: wl.Workload) -> list[LoadRequest]:
    return [LoadRequest(r.prompt_token_ids, len(r.prompt_token_ids), r.params.max_tokens,
                        r.arrival_time) for r in w]


def _lengths(n: int, range_ratio: float):
    """vLLM's --random-range-ratio: lengths uniform in [n(1-r), n(1+r)]."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"random range ratio {range_ratio!r} must be in [0, 1)")
    lo, hi = max(1, math.floor(n * (1 - range_ratio))), math.ceil(n * (1 + range_ratio))
    return wl.Fixed(n) if lo == hi else wl.Uniform(lo, hi)


def random_dataset(num_prompts: int, input_len: int, output_len: int, vocab_size: int,
                   range_ratio: float = 0.0, rate: float = math.inf, burstiness: float = 1.0,
                   seed: int = 0) -> list[LoadRequest]:
    return from_workload(wl.synthetic(num_prompts, _lengths(input_len, range_ratio),
                                      _lengths(output_len, range_ratio), rate, burstiness, seed,
                                      vocab_size, min(10, vocab_size - 1), name="random"))


def prefix_dataset(num_prompts: int, prefix_len: int, suffix_len: int, num_prefixes: int,
                   output_len: int, vocab_size: int, rate: float = math.inf,
                   burstiness: float = 1.0, seed: int = 0) -> list[LoadRequest]:
    if num_prefixes < 1 or num_prompts % num_prefixes:
        raise ValueError(f"--num-prompts {num_prompts} must be a multiple of "
                         f"--prefix-repetition-num-prefixes {num_prefixes}")
    return from_workload(wl.shared_prefix(num_prefixes, num_prompts // num_prefixes, prefix_len,
                                          suffix_len, output_len, rate, burstiness, seed=seed,
                                          vocab_size=vocab_size, token_low=min(10, vocab_size - 1)))


def load_trace(path: str, num_prompts: int | None = None, rate: float = math.inf,
               burstiness: float = 1.0, seed: int = 0, tokenizer=None) -> list[LoadRequest]:
    """A JSONL trace (see the module docstring); the first num_prompts lines if given."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n} is not JSON: {e}") from e
            if num_prompts is not None and len(rows) == num_prompts:
                break
    stamped = [("timestamp" in r) for r in rows]
    if any(stamped) and not all(stamped):
        raise ValueError(f"{path}: either every line has a 'timestamp' or none does")
    times = ([float(r["timestamp"]) for r in rows] if rows and all(stamped)
             else wl.arrival_times(len(rows), rate, burstiness, np.random.default_rng(seed)).tolist())
    out = []
    for n, (r, t) in enumerate(zip(rows, times), 1):
        prompt, max_tokens = r.get("prompt"), r.get("output_tokens", r.get("max_tokens"))
        if not isinstance(prompt, (str, list)) or not prompt:
            raise ValueError(f"{path}:{n}: 'prompt' must be a non-empty string or list of token ids")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"{path}:{n}: 'output_tokens' (or 'max_tokens') must be an integer >= 1")
        n_in = len(prompt) if isinstance(prompt, list) else (
            len(tokenizer.encode(prompt)) if tokenizer is not None else 0)
        out.append(LoadRequest(prompt, n_in, max_tokens, t - times[0] if times else 0.0))
    return out


def resolve_vocab_size(tokenizer: str | None, vocab_size: int | None = None) -> int:
    """Random ids must be in the model's vocabulary: --vocab-size, else the config.json of the
    --tokenizer folder, else a preset's (`preset:NAME`)."""
    if vocab_size is not None:
        return vocab_size
    if tokenizer and tokenizer.startswith("preset:"):
        from nanoserve.model import preset_config
        return preset_config(tokenizer.split(":", 1)[1]).vocab_size
    if tokenizer and os.path.isfile(os.path.join(tokenizer, "config.json")):
        with open(os.path.join(tokenizer, "config.json")) as f:
            return int(json.load(f)["vocab_size"])
    if tokenizer and os.path.isfile(os.path.join(tokenizer, "tokenizer.json")):
        return load_text_tokenizer(tokenizer).tok.get_vocab_size()
    raise ValueError("random prompts need the model's vocabulary size: pass --tokenizer (the "
                     "checkpoint folder or preset:NAME) or --vocab-size")


def load_text_tokenizer(tokenizer: str | None):
    """The tokenizer of a checkpoint folder (tokenizer.json), or None."""
    if not tokenizer or tokenizer.startswith("preset:"):
        return None
    from nanoserve.engine.tokenizer import load_tokenizer
    return load_tokenizer(tokenizer)
