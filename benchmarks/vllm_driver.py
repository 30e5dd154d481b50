"""Run benchmark jobs on vLLM's CPU build; started by peers.py with the vLLM venv's python.

    /path/to/vllm-venv/bin/python benchmarks/vllm_driver.py SPEC.json RESULT.json

SPEC: {"model": folder, "dtype": "float32", "engine": {LLM kwargs}, "jobs": [job, ...]} where a
job is {"kind": "offline", "prompts": [[ids]], "max_tokens": n} -> seconds until all finish,
or {"kind": "online", "prompts", "max_tokens": [n], "arrivals": [s]} -> per request
{"arrival": s, "token_times": [s]} measured from t0 (each request added when its time comes).
RESULT: {"vllm_version": ..., "results": [one per job]}.

Only vLLM and the standard library are imported: the vLLM venv need not have nanoserve. The
`__main__` guard matters: vLLM spawns worker processes that re-import this file.
"""

import json
import sys
import time


def _params(n: int):
    from vllm import SamplingParams
    # exactly n tokens, greedy; skip_tokenizer_init means there is nothing to detokenize
    return SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0,
                          detokenize=False)


def _prompt(ids):
    return {"prompt_token_ids": list(ids)}


def offline(llm, job) -> float:
    prompts = [_prompt(p) for p in job["prompts"]]
    t = time.perf_counter()
    llm.generate(prompts, _params(job["max_tokens"]), use_tqdm=False)
    return time.perf_counter() - t


def online(llm, job) -> list:
    """Add each request when its arrival time comes, step the engine, stamp every new token."""
    engine = llm.llm_engine
    order = sorted(range(len(job["prompts"])), key=lambda i: job["arrivals"][i])
    times = {str(i): [] for i in order}
    k = 0
    t0 = time.perf_counter()
    while k < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while k < len(order) and job["arrivals"][order[k]] <= now:
            i = order[k]
            engine.add_request(str(i), _prompt(job["prompts"][i]), _params(job["max_tokens"][i]))
            k += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, job["arrivals"][order[k]] - (time.perf_counter() - t0)))
            continue
        for out in engine.step():
            now = time.perf_counter() - t0
            seen = times[out.request_id]
            seen.extend([now] * (len(out.outputs[0].token_ids) - len(seen)))
    return [{"arrival": job["arrivals"][i], "token_times": times[str(i)]}
            for i in range(len(job["prompts"]))]


def main(spec_path: str, result_path: str) -> None:
    import vllm
    with open(spec_path) as f:
        spec = json.load(f)
    llm = vllm.LLM(model=spec["model"], dtype=spec["dtype"], skip_tokenizer_init=True, seed=0,
                   **spec["engine"])
    llm.generate([_prompt(spec["jobs"][0]["prompts"][0])], _params(4), use_tqdm=False)  # warm-up
    results = [offline(llm, j) if j["kind"] == "offline" else online(llm, j) for j in spec["jobs"]]
    with open(result_path, "w") as f:
        json.dump({"vllm_version": vllm.__version__, "results": results}, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
