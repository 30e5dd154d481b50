"""Run llama.cpp (llama-cpp-python) jobs; started by llamacpp.py with the llama.cpp venv's python.

    /path/to/llamacpp-venv/bin/python benchmarks/llamacpp_driver.py quantize SRC.gguf DST.gguf TYPE
    /path/to/llamacpp-venv/bin/python benchmarks/llamacpp_driver.py bench SPEC.json RESULT.json

quantize: a copy of SRC with its weights in TYPE (Q8_0, F16, BF16, Q4_1...), made by llama.cpp's
own `llama_model_quantize` with `allow_requantize` (SRC is already quantized: its blocks are
dequantized to float32, then written in TYPE).
bench: SPEC {"model": gguf, "threads": n, "n_ctx", "n_batch", "n_ubatch", "jobs": [job, ...]}
where a job is peer_systems.py's {"kind": "offline", "prompts": [[ids]], "max_tokens": n} with
one prompt (batch 1): -> seconds until n greedy tokens are out, EOS ignored.
RESULT: {"version", "system_info", "results": [one per job]}.

Only llama_cpp and the standard library are imported: the llama.cpp venv need not have nanoserve.
"""

import json
import sys
import time

FTYPES = {"Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "F16": "LLAMA_FTYPE_MOSTLY_F16", "BF16": "LLAMA_FTYPE_MOSTLY_BF16"}


def quantize(src: str, dst: str, kind: str) -> None:
    import llama_cpp
    known = [k for k, v in FTYPES.items() if hasattr(llama_cpp, v)]
    if kind not in known:
        raise SystemExit(f"type {kind!r}: this llama_cpp writes {known}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[kind])
    params.allow_requantize = True
    params.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize({src} -> {dst}, {kind}) failed")


def offline(llm, job) -> float:
    """Seconds for one prompt's max_tokens greedy tokens (generate() never stops at EOS itself)."""
    [prompt], n = job["prompts"], job["max_tokens"]
    llm.reset()  # forget the previous prompt: a shared prefix would skip part of this prefill
    t = time.perf_counter()
    for i, _ in enumerate(llm.generate(prompt, temp=0.0, reset=True), 1):
        if i == n:
            break
    return time.perf_counter() - t


def bench(spec_path: str, result_path: str) -> None:
    import llama_cpp
    with open(spec_path) as f:
        spec = json.load(f)
    if any(j["kind"] != "offline" or len(j["prompts"]) != 1 for j in spec["jobs"]):
        raise SystemExit("llamacpp_driver runs batch-1 offline jobs only")
    llm = llama_cpp.Llama(model_path=spec["model"], n_threads=spec["threads"],
                          n_threads_batch=spec["threads"], n_ctx=spec["n_ctx"],
                          n_batch=spec["n_batch"], n_ubatch=spec["n_ubatch"], seed=0, verbose=False)
    offline(llm, {"prompts": [spec["jobs"][0]["prompts"][0]], "max_tokens": 4})  # warm-up
    results = [offline(llm, j) for j in spec["jobs"]]
    with open(result_path, "w") as f:
        json.dump({"version": llama_cpp.__version__,
                   "system_info": llama_cpp.llama_print_system_info().decode(), "results": results}, f)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "quantize" and len(sys.argv) == 5:
        quantize(*sys.argv[2:5])
    elif len(sys.argv) >= 2 and sys.argv[1] == "bench" and len(sys.argv) == 4:
        bench(*sys.argv[2:4])
    else:
        raise SystemExit(__doc__)
