"""nanoserve's model against HF transformers: logits to 1e-4 for prefill and decode steps."""

import pytest
import torch

from nanoserve import EngineConfig, LLMEngine
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import ScheduledSeq
from nanoserve.kernels import reference
from nanoserve.sampling_params import SamplingParams
from tests.conftest import ARCHS


def engine_logits(engine, token_ids, prefill_len):
    """Prefill `prefill_len` tokens in one pass, then feed the rest one decode step at a time
    through the paged cache. -> logits (len(token_ids), vocab) at every position."""
    runner, kv = engine.executor, engine.kv_manager
    req = Request("probe", token_ids, SamplingParams(max_tokens=1), 0.0, 10**6)
    assert kv.allocate_slots(req, len(token_ids))
    rows, start = [], 0
    for n in [prefill_len] + [1] * (len(token_ids) - prefill_len):
        seq = ScheduledSeq("probe", token_ids[start:start + n], start, kv.block_ids("probe"), True,
                           req.params, n == 1)
        ids, pos, attn, _ = runner.prepare([seq])
        with torch.inference_mode():
            hidden = runner.model(ids, pos, runner.kv_caches, attn)
            rows.append(runner.model.compute_logits(hidden))
        start += n
    kv.free(req)
    return torch.cat(rows)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_match_hf_prefill_and_20_decode_steps(hf_models, arch):
    hf, folder = hf_models(arch)
    engine = LLMEngine(folder, device="cpu", dtype="float32",
                       config=EngineConfig(block_size=4, num_kv_blocks=64))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 512, (37,), generator=g).tolist()  # 17 prefill (mid-block) + 20 decode
    ours = engine_logits(engine, tokens, prefill_len=17)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].float()
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"{arch}: max relative logit error {rel:.2e}"


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_batch_equals_hf_generate_and_alone(hf_models, arch):
    from nanoserve import LLM, SamplingParams
    hf, folder = hf_models(arch)
    prompts = [[5, 9, 2], list(range(20, 61)), [300, 1, 7, 7, 7, 42, 8, 100, 99], [11]]
    llm = LLM(folder, config=EngineConfig(block_size=8, num_kv_blocks=128, max_num_batched_tokens=32))
    params = SamplingParams(max_tokens=24, temperature=0.0)
    batch = [o.token_ids for o in llm.generate(prompts, params)]
    for p, got in zip(prompts, batch):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, min_new_tokens=24)
        assert got == ref[0, len(p):].tolist(), f"prompt {p[:5]}...: {got} != HF"
        assert llm.generate([p], params)[0].token_ids == got, "batched output differs from alone"


@pytest.mark.slow
def test_compiled_model_greedy_equals_hf(hf_models):
    """compile=True: torch.compile over the reference ops, batched and chunked, equals HF."""
    from nanoserve import LLM, SamplingParams
    hf, folder = hf_models("llama")
    prompts = [[5, 9, 2], list(range(20, 61)), [11]]  # the 41-token prompt prefills in two chunks
    llm = LLM(folder, config=EngineConfig(block_size=8, num_kv_blocks=64, max_num_batched_tokens=32,
                                          compile=True))
    assert all(m.ops is reference for m in llm.engine.model.modules() if "ops" in vars(m))
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0))]
    for p, out in zip(prompts, got):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
        assert out == ref[0, len(p):].tolist(), f"prompt {p[:5]}...: {out} != HF"
