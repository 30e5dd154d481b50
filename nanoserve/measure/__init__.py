"""Measuring: what a user of a serving engine measures, with vLLM's definitions.

    metrics.py      TTFT, ITL, TPOT, E2E, throughput, request goodput, stratification
    workload.py     seeded arrival processes and length distributions
    bench.py        a workload replayed against an engine in real time; MBU / MFU
    ceilings.py     this device's bandwidth and FLOP/s, measured and cached
    roofline.py     a step's FLOPs and bytes, floors, the roofline figure
    step_profile.py where a step's time goes on a CPU
    cost.py         dollars per million input and output tokens
    fit.py          the least-squares fit every model of the course uses
    figures.py      figures of a measured run, the device label every figure carries
"""
