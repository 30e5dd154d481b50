"""How fast the simulator runs: 10,000 requests of a 70B model on four H100s (datasheet).

    python benchmarks/sim_speed.py [--requests 10000] [--model llama-3-70b] [--device H100-SXM]
                                   [--tp 4] [--rate 15]

Prints simulated requests per second of wall time (and of CPU time, which a busy machine
disturbs less), then the modelled serving metrics. The goal: 10,000 requests in under a minute.
"""

import argparse
import time

from nanoserve import EngineConfig
from nanoserve.measure.workload import LogNormal, synthetic
from nanoserve.sim import simulate
from nanoserve.sim.devices import DEVICES, model_shape


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--device", default="H100-SXM", choices=sorted(DEVICES))
    ap.add_argument("--tp", type=int, default=4, help="devices per instance (tensor parallel)")
    ap.add_argument("--rate", type=float, default=15.0, help="requests per second offered")
    args = ap.parse_args()

    cfg = model_shape(args.model)
    device = DEVICES[args.device].scaled(args.tp)
    # chat-like lengths: long-tailed prompts (median 512) and outputs (median 128)
    w = synthetic(args.requests, input_len=LogNormal(512, 1.0, hi=4000),
                  output_len=LogNormal(128, 1.0, hi=1000), rate=args.rate, seed=0,
                  vocab_size=cfg.vocab_size)
    cpu = time.process_time()
    res = simulate(w, cfg, device, EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048))
    cpu = time.process_time() - cpu
    steps = res.trace
    print(f"{args.requests} requests of {args.model} on {device.name} ({device.source})")
    print(f"{len(steps)} steps, {sum(s.num_tokens for s in steps)} tokens scheduled")
    print(f"wall {res.wall_time:.1f} s = {res.requests_per_second:.0f} simulated requests/s; "
          f"CPU {cpu:.1f} s = {args.requests / cpu:.0f} requests/s")
    print(f"cost model: {res.cost_model.describe()}")
    print("modelled serving metrics:")
    print(res.metrics().table())


if __name__ == "__main__":
    main()
