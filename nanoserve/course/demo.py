"""`python -m nanoserve demo`: stream text from a few prompts, then print their latencies.

Requests are added together, so the streams interleave: every step emits one token for
each running request (continuous batching, visible on screen).
"""

from __future__ import annotations

import sys

from nanoserve.engine import LLM
from nanoserve.measure.metrics import itls, ttft
from nanoserve.sampling_params import SamplingParams

DEMO_PROMPTS = [  # the demo model was trained on the plays, where speakers are "NAME." lines
    "ROMEO.\nBut soft, what light",
    "KING HENRY.\nOnce more unto the breach,",
    "HAMLET.\nTo be, or not",
    "FIRST CITIZEN.\nBefore we proceed any further,",
]


def run_demo(model: str | None = None, max_tokens: int = 48, device: str | None = None,
             out=sys.stdout) -> list:
    llm = LLM(model, device=device, seed=0)
    if llm.tokenizer is not None:
        prompts = DEMO_PROMPTS
    else:  # a random-weight preset has no tokenizer: use token ids
        prompts = [[1 + i, 2 + i, 3 + i, 4 + i] for i in range(len(DEMO_PROMPTS))]
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=i)
              for i in range(len(prompts))]
    print(f"model: {model or 'default'} on {llm.engine.device}, {len(prompts)} requests "
          f"streaming together\n", file=out)
    finals = {}
    for o in llm.stream(prompts, params):
        idx = int(o.request_id)
        print(f"[{idx}] {llm.decode(o.new_token_ids)!r}", file=out, flush=True)
        if o.finished:
            finals[idx] = o
    print("\n--- full texts ---", file=out)
    for i in sorted(finals):
        o = finals[i]
        print(f"[{i}] {prompts[i] if isinstance(prompts[i], str) else prompts[i]}"
              f"{llm.decode(o.token_ids)}\n", file=out)
    print(f"{'req':>3} {'prompt':>6} {'output':>6} {'TTFT ms':>8} {'mean ITL ms':>11} {'tok/s':>7}",
          file=out)
    for i in sorted(finals):
        o = finals[i]
        gaps = itls(o)
        mean_itl = sum(gaps) / len(gaps) if gaps else float("nan")
        span = o.metrics.finished_time - o.metrics.arrival_time
        print(f"{i:>3} {len(o.prompt_token_ids):>6} {len(o.token_ids):>6} {ttft(o) * 1e3:>8.1f} "
              f"{mean_itl * 1e3:>11.2f} {len(o.token_ids) / span:>7.1f}", file=out)
    return [finals[i] for i in sorted(finals)]
