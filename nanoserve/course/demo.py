"""`python -m nanoserve demo`: a few prompts sampled together, their texts, then their latencies.

Requests are added together, so they are batched: every engine step emits one token for each
running request (continuous batching; `--verbose` shows the tokens as they stream in).
"""

from __future__ import annotations

import sys

from nanoserve.engine import LLM
from nanoserve.engine.model_runner import default_model
from nanoserve.measure.metrics import itls, ttft
from nanoserve.model import DEMO_MODEL_DIR, DEMO_MODEL_NAME
from nanoserve.sampling_params import SamplingParams

DEMO_PROMPTS = [  # the demo model was trained on the plays, where speakers are "NAME." lines
    "ROMEO.\nBut soft, what light",
    "KING HENRY.\nOnce more unto the breach,",
    "HAMLET.\nTo be, or not",
    "FIRST CITIZEN.\nBefore we proceed any further,",
]

LEGEND = """\
prompt, output: tokens in, tokens out
TTFT: time to first token (waiting, then the prompt's prefill), in ms
ITL: inter-token latency, the mean gap between two output tokens (one decode step), in ms
tok/s: output tokens per second, from the request's arrival to its last token"""


def model_name(model: str | None) -> str:
    """`model` as given; without one, what `serve` calls the model it loads (demo-model)."""
    return model or (DEMO_MODEL_NAME if default_model() == DEMO_MODEL_DIR else default_model())


def run_demo(model: str | None = None, max_tokens: int = 48, device: str | None = None,
             verbose: bool = False, out=None) -> list:
    """Sample DEMO_PROMPTS together; print each request's text and a table of its latencies
    (and, if `verbose`, every token as it streams in). -> the final outputs, in prompt order."""
    out = out or sys.stdout
    llm = LLM(model, device=device, seed=0)
    if llm.tokenizer is not None:
        prompts = DEMO_PROMPTS
    else:  # a random-weight preset has no tokenizer: use token ids
        prompts = [[1 + i, 2 + i, 3 + i, 4 + i] for i in range(len(DEMO_PROMPTS))]
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=i)
              for i in range(len(prompts))]
    print(f"model: {model_name(model)} on {llm.engine.device}; {len(prompts)} requests sampled "
          f"together, up to {max_tokens} tokens each\n", file=out)
    finals = {}
    for o in llm.stream(prompts, params):
        idx = int(o.request_id)
        if verbose:
            print(f"[{idx}] {llm.decode(o.new_token_ids)!r}", file=out, flush=True)
        if o.finished:
            finals[idx] = o
    if verbose:
        print(file=out)
    for i in sorted(finals):
        prompt = prompts[i] if isinstance(prompts[i], str) else f"{llm.decode(prompts[i])} -> "
        print(f"[{i}] {prompt}{llm.decode(finals[i].token_ids)}\n", file=out)
    print(f"{'req':>3} {'prompt':>6} {'output':>6} {'TTFT':>7} {'ITL':>6} {'tok/s':>6}", file=out)
    for i in sorted(finals):
        o = finals[i]
        gaps = itls(o)
        mean_itl = sum(gaps) / len(gaps) if gaps else float("nan")
        span = o.metrics.finished_time - o.metrics.arrival_time
        print(f"{i:>3} {len(o.prompt_token_ids):>6} {len(o.token_ids):>6} {ttft(o) * 1e3:>7.1f} "
              f"{mean_itl * 1e3:>6.2f} {len(o.token_ids) / span:>6.1f}", file=out)
    print(f"\n{LEGEND}", file=out)
    return [finals[i] for i in sorted(finals)]
