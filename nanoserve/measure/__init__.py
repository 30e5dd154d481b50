"""Measuring: what a user of a serving engine measures, with vLLM's definitions.

    metrics.py      TTFT, ITL, TPOT, E2E, throughput, request goodput, stratification
    slo.py          SLOs in our syntax ('ttft<=500ms') or vLLM's ('--goodput ttft:500')
    workload.py     seeded arrival processes and length distributions
    bench.py        a workload replayed against an engine in real time; MBU / MFU
    ceilings.py     this device's bandwidth and FLOP/s, measured and cached
    roofline.py     a step's FLOPs and bytes, floors, the roofline figure
    step_profile.py where a step's time goes on a CPU
    cost.py         dollars per million input and output tokens
    fit.py          the least-squares fit every model of the course uses
    figures.py      figures of a measured run, the device label every figure carries
    loadgen.py      `python -m nanoserve loadgen`: measure any OpenAI-compatible server
    datasets.py     what loadgen sends (vllm bench serve's random, prefix, JSONL datasets)
    http_result.py  a client's measurements shaped like the engine's outputs; the result table
    http_compare.py the same work in-process and over HTTP, side by side
    figures_http.py figures of a server measured from outside
"""
