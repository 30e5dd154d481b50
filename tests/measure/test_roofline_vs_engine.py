"""The roofline's FLOP/byte count against step times measured on the engine.

A step can't beat its roofline time (max of bytes/bandwidth and FLOPs/peak, with the
ceilings measured now on this device), and on a CPU it should not be far above it either.
Stated factor: measured / roofline in [0.7, 6] (0.7 absorbs ceiling-measurement noise; 6
absorbs Python overhead and elementwise ops the count leaves out). A count off by a whole
term (e.g. weights per token instead of per step, a missing layer factor) falls outside.
"""

import statistics

import pytest

from nanoserve import EngineConfig, LLMEngine, SamplingParams
from nanoserve.config import ModelConfig
from nanoserve.measure.roofline import decode_batch, measure_ceilings, prefill_batch, roofline_time, step_cost

FACTOR = (0.7, 6.0)


SHAPE = ModelConfig(vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def setup():
    eng = LLMEngine(SHAPE, config=EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512))
    return eng, SHAPE, measure_ceilings("cpu", ("float32",), quick=True)


def timed_steps(eng, prompts, max_tokens):
    for i, p in enumerate(prompts):
        eng.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0))
    start = len(eng.trace)
    while eng.has_unfinished():
        eng.step()
    return eng.trace[start:]


@pytest.mark.usefixtures("cpu_ops")  # timed: the C++ ops are built before, not inside it
@pytest.mark.serial  # times real steps: run alone, not beside another xdist worker
def test_prefill_and_decode_step_times_are_within_the_stated_factor_of_the_roofline(setup):
    eng, cfg, ceil = setup
    timed_steps(eng, [[7] * 64], 4)  # warm-up
    # medians: three prefills (each its own request, one step each) and their decode steps, so a
    # burst of other work on a shared machine moves no figure alone
    prefills, decodes = [], []
    for i in range(3):
        trace = timed_steps(eng, [list(range(10 + i, 10 + i + 512))], 8)
        prefills.append(trace[0].duration)
        decodes += [s.duration for s in trace[1:]]
    prefill, decode = statistics.median(prefills), statistics.median(decodes)
    t_prefill = roofline_time(step_cost(cfg, prefill_batch(512)), ceil, "float32")
    t_decode = roofline_time(step_cost(cfg, decode_batch(1, 516)), ceil, "float32")
    for name, measured, floor in [("prefill 512", prefill, t_prefill), ("decode", decode, t_decode)]:
        ratio = measured / floor
        assert FACTOR[0] <= ratio <= FACTOR[1], f"{name}: measured {measured*1e3:.2f} ms is {ratio:.2f}x " \
                                                 f"the roofline {floor*1e3:.2f} ms"
